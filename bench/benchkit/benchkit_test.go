package benchkit

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestPlotPNG: the plot is a PNG of the drawn size, the two series'
// colours are on it, and a plot with nothing to draw is an error.
func TestPlotPNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.png")
	s := []Series{{Name: "a", X: []float64{1, 2, 4}, Y: []float64{10, 20, 40}}, {Name: "b", X: []float64{1, 2, 4}, Y: []float64{5, 6, 7}}}
	if err := PlotPNG(path, "t", "x", "y", s); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 800 || b.Dy() != 500 {
		t.Fatalf("size %v", b)
	}
	seen := map[[3]uint32]bool{}
	for y := 0; y < 500; y++ {
		for x := 0; x < 800; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			seen[[3]uint32{r >> 8, g >> 8, b >> 8}] = true
		}
	}
	for _, c := range palette[:2] {
		if !seen[[3]uint32{uint32(c.R), uint32(c.G), uint32(c.B)}] {
			t.Errorf("colour %v not drawn", c)
		}
	}
	if err := PlotPNG(path, "t", "x", "y", []Series{{Name: "one", X: []float64{1}, Y: []float64{3}}}); err != nil {
		t.Fatalf("one point: %v", err)
	}
	if err := PlotPNG(path, "t", "x", "y", nil); err == nil {
		t.Fatal("empty plot accepted")
	}
}
