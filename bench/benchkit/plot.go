package benchkit

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Series is one line of a plot.
type Series struct {
	Name string
	X, Y []float64
}

var palette = []color.RGBA{{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255}}

// PlotPNG draws series as lines with points on a log2 x axis (concurrency
// levels) and a linear y axis from 0, with a legend, and writes it to path.
func PlotPNG(path, title, xLabel, yLabel string, series []Series) error {
	const w, h, left, right, top, bottom = 800, 500, 70, 20, 40, 50
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	xmin, xmax, ymax := math.Inf(1), math.Inf(-1), 0.0
	for _, s := range series {
		for i := range s.X {
			xmin, xmax = min(xmin, s.X[i]), max(xmax, s.X[i])
			ymax = max(ymax, s.Y[i])
		}
	}
	if xmin <= 0 || ymax <= 0 {
		return fmt.Errorf("plot %s: nothing to draw", path)
	}
	if xmax == xmin { // one level: an axis from it to its double
		xmax = 2 * xmin
	}
	ymax = niceCeil(ymax * 1.05)
	px := func(x float64) int {
		return left + int(math.Log2(x/xmin)/math.Log2(xmax/xmin)*float64(w-left-right))
	}
	py := func(y float64) int { return h - bottom - int(y/ymax*float64(h-top-bottom)) }
	grey, black := color.RGBA{210, 210, 210, 255}, color.RGBA{0, 0, 0, 255}
	text := func(x, y int, s string, c color.Color) {
		d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
	// Grid and tick labels.
	for i := 0; i <= 5; i++ {
		y := ymax * float64(i) / 5
		line(img, left, py(y), w-right, py(y), grey)
		lbl := fmt.Sprintf("%.0f", y)
		text(left-8-7*len(lbl), py(y)+4, lbl, black)
	}
	for x := xmin; x <= xmax*1.0001; x *= 2 {
		line(img, px(x), top, px(x), h-bottom, grey)
		lbl := fmt.Sprintf("%g", x)
		text(px(x)-7*len(lbl)/2, h-bottom+16, lbl, black)
	}
	line(img, left, h-bottom, w-right, h-bottom, black)
	line(img, left, top, left, h-bottom, black)
	text(left, 20, title, black)
	text((w-7*len(xLabel))/2, h-12, xLabel, black)
	text(4, top-8, yLabel, black)
	for k, s := range series {
		c := palette[k%len(palette)]
		for i := range s.X {
			if i > 0 {
				line(img, px(s.X[i-1]), py(s.Y[i-1]), px(s.X[i]), py(s.Y[i]), c)
			}
			for dx := -3; dx <= 3; dx++ {
				for dy := -3; dy <= 3; dy++ {
					img.Set(px(s.X[i])+dx, py(s.Y[i])+dy, c)
				}
			}
		}
		ly := top + 10 + 18*k
		line(img, left+15, ly, left+40, ly, c)
		line(img, left+15, ly+1, left+40, ly+1, c)
		text(left+48, ly+4, s.Name, black)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// line draws a two-pixel-wide segment (Bresenham).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	e := dx + dy
	for {
		img.Set(x0, y0, c)
		img.Set(x0, y0+1, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// niceCeil rounds y up to 1, 2 or 5 times a power of ten.
func niceCeil(y float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(y)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= y {
			return m * p
		}
	}
	return 10 * p
}
