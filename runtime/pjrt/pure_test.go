package pjrt

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	xpjrt "github.com/gomlx/go-xla/pjrt"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/brokerd/brokerd/runtime"
)

func TestBuckets(t *testing.T) {
	t.Run("batch buckets", func(t *testing.T) {
		for _, tt := range []struct {
			max  int
			want []int
		}{
			{0, nil}, {1, []int{1}}, {2, []int{1, 2}}, {8, []int{1, 2, 4, 8}},
			{12, []int{1, 2, 4, 8, 12}}, {32, []int{1, 2, 4, 8, 16, 32}},
		} {
			if got := BatchBuckets(tt.max); !slices.Equal(got, tt.want) {
				t.Errorf("BatchBuckets(%d) = %v, want %v", tt.max, got, tt.want)
			}
		}
	})
	seq := SeqBuckets()
	batch := BatchBuckets(12)
	for _, tt := range []struct {
		n       int
		buckets []int
		want    int
	}{
		{1, seq, 32}, {8, seq, 32}, {32, seq, 32}, {33, seq, 64}, {128, seq, 128}, {129, seq, 256},
		{512, seq, 512}, {513, seq, 513}, {0, seq, 0},
		{1, batch, 1}, {3, batch, 4}, {5, batch, 8}, {9, batch, 12}, {12, batch, 12},
	} {
		t.Run(fmt.Sprintf("%d in %v", tt.n, tt.buckets), func(t *testing.T) {
			if got := Bucket(tt.n, tt.buckets); got != tt.want {
				t.Errorf("Bucket(%d) = %d, want %d", tt.n, got, tt.want)
			}
		})
	}
	t.Run("SeqBuckets is a copy", func(t *testing.T) {
		s := SeqBuckets()
		s[0] = 1
		if SeqBuckets()[0] != 32 {
			t.Error("changing SeqBuckets' result changed the buckets")
		}
	})
}

func TestPadAndSlice(t *testing.T) {
	tests := []struct {
		name string
		got  []float32
		want []float32
	}{
		{"pad 2 rows to 4", PadRows([]float32{1, 2, 3, 4}, 2, 4), []float32{1, 2, 3, 4, 0, 0, 0, 0}},
		{"pad to fewer rows keeps src", PadRows([]float32{1, 2, 3, 4}, 2, 1), []float32{1, 2, 3, 4}},
		{"slice 4 rows to 1", SliceRows([]float32{1, 2, 3, 4, 5, 6, 7, 8}, 2, 1), []float32{1, 2}},
		{"slice beyond the data", SliceRows([]float32{1, 2}, 2, 3), []float32{1, 2}},
		{"pad sequences 3 to 5", PadSeq([]float32{1, 2, 3, 4, 5, 6}, 2, 3, 5), []float32{1, 2, 3, 0, 0, 4, 5, 6, 0, 0}},
		{"pad sequences to the same length", PadSeq([]float32{1, 2}, 1, 2, 2), []float32{1, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !slices.Equal(tt.got, tt.want) {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
	t.Run("int32 and round trip", func(t *testing.T) {
		ids := []int32{7, 8, 9}
		p := PadRows(PadSeq(ids, 1, 3, 32), 32, 4)
		if len(p) != 4*32 || p[0] != 7 || p[2] != 9 || p[3] != 0 || p[32] != 0 {
			t.Fatalf("padded = %v", p)
		}
		if got := SliceRows(p, 32, 1)[:3]; !slices.Equal(got, ids) {
			t.Errorf("sliced back %v, want %v", got, ids)
		}
		// The slice cannot grow into the padding.
		if s := SliceRows(p, 32, 1); cap(s) != 32 {
			t.Errorf("cap = %d, want 32", cap(s))
		}
	})
}

func TestMatchDevice(t *testing.T) {
	gpu := func(i, hw int, attrs map[string]string) DeviceInfo {
		return DeviceInfo{Index: i, ID: i, LocalHardwareID: hw, Kind: "NVIDIA H100", Attributes: attrs}
	}
	plain := []DeviceInfo{gpu(0, 0, nil), gpu(1, 1, nil), gpu(2, 2, nil)}
	withPCI := []DeviceInfo{
		gpu(0, 0, map[string]string{"pci_bus_id": "0000:1b:00.0"}),
		gpu(1, 1, map[string]string{"pci_bus_id": "0000:3b:00.0", "uuid": "GPU-bbb"}),
	}
	withUUID := []DeviceInfo{gpu(0, 0, map[string]string{"uuid": "aaa"}), gpu(1, 1, map[string]string{"uuid": "BBB"})}
	unordered := []DeviceInfo{gpu(0, 2, nil), gpu(1, 0, nil), gpu(2, 1, nil)}
	noHW := []DeviceInfo{gpu(0, -1, nil), gpu(1, -1, nil)}
	tpu := func(i, hw int, core string) DeviceInfo {
		a := map[string]string{"coords": "0,0,0"}
		if core != "" {
			a["core_on_chip"] = core
		}
		return DeviceInfo{Index: i, ID: i, LocalHardwareID: hw, Kind: "TPU v3", Attributes: a}
	}
	twoCoreChips := []DeviceInfo{tpu(0, -1, "0"), tpu(1, -1, "1"), tpu(2, -1, "0"), tpu(3, -1, "1")}
	oneCoreChips := []DeviceInfo{tpu(0, 0, ""), tpu(1, 1, ""), tpu(2, 2, ""), tpu(3, 3, "")}

	tests := []struct {
		name    string
		t       Target
		devs    []DeviceInfo
		want    int
		wantHow string
		wantErr string
	}{
		{"gpu by index", Target{Type: "gpu", Index: 1}, plain, 1, MatchIndex, ""},
		{"gpu by index, NVML identity unused when not exposed", Target{Type: "gpu", Index: 2, PCIBusID: "0000:01:00.0", UUID: "GPU-x"}, plain, 2, MatchIndex, ""},
		{"gpu by hardware id, not position", Target{Type: "gpu", Index: 0}, unordered, 1, MatchIndex, ""},
		{"gpu by position without hardware ids", Target{Type: "gpu", Index: 1}, noHW, 1, MatchIndex, ""},
		{"gpu by PCI bus id in NVML's form", Target{Type: "gpu", Index: 0, PCIBusID: "00000000:3B:00.0"}, withPCI, 1, MatchPCIBusID, ""},
		{"gpu PCI bus id not among the plugin's", Target{Type: "gpu", Index: 0, PCIBusID: "0000:5e:00.0"}, withPCI, -1, "", "no PJRT device has PCI bus id 0000:5e:00.0"},
		{"gpu by UUID when PCI is unknown", Target{Type: "gpu", Index: 0, UUID: "GPU-BBB"}, withUUID, 1, MatchUUID, ""},
		{"gpu UUID not among the plugin's", Target{Type: "gpu", Index: 0, UUID: "GPU-ccc"}, withUUID, -1, "", "no PJRT device has UUID GPU-ccc"},
		{"gpu index beyond", Target{Type: "gpu", Index: 3}, plain, -1, "", "no PJRT device has hardware id 3 (the plugin sees 3 device(s))"},
		{"gpu index beyond, no hardware ids", Target{Type: "gpu", Index: 2}, noHW, -1, "", "the plugin sees 2 device(s)"},
		{"tpu chip of two-core chips", Target{Type: "tpu", Index: 1}, twoCoreChips, 2, MatchIndex, ""},
		{"tpu chip beyond", Target{Type: "tpu", Index: 2}, twoCoreChips, -1, "", "the plugin sees 2 device(s)"},
		{"tpu chip by hardware id", Target{Type: "tpu", Index: 3}, oneCoreChips, 3, MatchIndex, ""},
		{"cpu is not PJRT's", Target{Type: "cpu", Index: 0}, plain, -1, "", "PJRT drives gpu and tpu devices only"},
		{"negative index", Target{Type: "gpu", Index: -1}, plain, -1, "", "negative index"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, how, err := MatchDevice(tt.t, tt.devs)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("MatchDevice = %d, %v; want error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want || how != tt.wantHow {
				t.Errorf("MatchDevice = %d by %q (%v), want %d by %q", got, how, err, tt.want, tt.wantHow)
			}
		})
	}
}

func TestParseDeviceID(t *testing.T) {
	for _, tt := range []struct {
		id      string
		typ     string
		index   int
		wantErr bool
	}{
		{"gpu:0", "gpu", 0, false}, {"tpu:12", "tpu", 12, false},
		{"gpu", "", 0, true}, {":1", "", 0, true}, {"gpu:x", "", 0, true}, {"gpu:-1", "", 0, true},
	} {
		t.Run(tt.id, func(t *testing.T) {
			typ, index, err := ParseDeviceID(tt.id)
			if (err != nil) != tt.wantErr || typ != tt.typ || index != tt.index {
				t.Errorf("ParseDeviceID(%q) = %q, %d, %v", tt.id, typ, index, err)
			}
		})
	}
}

func TestProgramKey(t *testing.T) {
	g := func(mut func(*runtime.Op)) *runtime.Graph {
		op := runtime.Op{Kind: runtime.OpMatMul, In: []string{"x", "w"}, Out: "y", TransB: true}
		if mut != nil {
			mut(&op)
		}
		return &runtime.Graph{Ops: []runtime.Op{op}}
	}
	bound := map[string]TensorType{"x": f32(4, 8), "w": f32(16, 8), "y": f32(4, 16)}
	base := programKey(g(nil), bound, LowerOptions{})
	if again := programKey(g(nil), map[string]TensorType{"y": f32(4, 16), "w": f32(16, 8), "x": f32(4, 8)}, LowerOptions{}); again != base {
		t.Errorf("the key depends on map order:\n%s\n%s", base, again)
	}
	differ := []struct {
		name string
		key  string
	}{
		{"batch size", programKey(g(nil), map[string]TensorType{"x": f32(8, 8), "w": f32(16, 8), "y": f32(8, 16)}, LowerOptions{})},
		{"dtype", programKey(g(nil), map[string]TensorType{"x": bf16(4, 8), "w": bf16(16, 8), "y": f32(4, 16)}, LowerOptions{})},
		{"activation", programKey(g(func(o *runtime.Op) { o.Act = runtime.ActGELU }), bound, LowerOptions{})},
		{"transB", programKey(g(func(o *runtime.Op) { o.TransB = false }), bound, LowerOptions{})},
		{"eps", programKey(g(func(o *runtime.Op) { o.Eps = 1e-12 }), bound, LowerOptions{})},
		{"scale", programKey(g(func(o *runtime.Op) { o.Scale = 0.5 }), bound, LowerOptions{})},
		{"input names", programKey(g(func(o *runtime.Op) { o.In = []string{"w", "x"} }), bound, LowerOptions{})},
		{"names that would collide unquoted", programKey(g(func(o *runtime.Op) { o.In = []string{"x\"w", ""} }), bound, LowerOptions{})},
		{"perm", programKey(g(func(o *runtime.Op) { o.Perm = []int{1, 0} }), bound, LowerOptions{})},
		{"shape", programKey(g(func(o *runtime.Op) { o.Shape = []int{2, -1} }), bound, LowerOptions{})},
		{"tf32", programKey(g(nil), bound, LowerOptions{AllowTF32: true})},
	}
	seen := map[string]string{base: "base"}
	for _, d := range differ {
		t.Run(d.name, func(t *testing.T) {
			if prev, dup := seen[d.key]; dup {
				t.Errorf("key equals the key of %s", prev)
			}
			seen[d.key] = d.name
		})
	}
}

func TestCompileCache(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m, err := newCompileMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	c := newCompileCache[string](2, "cuda", m)
	clock := time.Unix(0, 0)
	c.now = func() time.Time { clock = clock.Add(300 * time.Millisecond); return clock }
	var compiles []string
	get := func(key string) string {
		t.Helper()
		v, err := c.get(ctx, key, func() (string, error) {
			compiles = append(compiles, key)
			return "exe:" + key, nil
		})
		if err != nil || v != "exe:"+key {
			t.Fatalf("get(%s) = %q, %v", key, v, err)
		}
		return v
	}

	steps := []struct {
		key          string
		wantCompiles []string
	}{
		{"a", []string{"a"}},
		{"b", []string{"a", "b"}},
		{"a", []string{"a", "b"}},           // hit; a is now the most recent
		{"c", []string{"a", "b", "c"}},      // evicts b
		{"a", []string{"a", "b", "c"}},      // still cached
		{"b", []string{"a", "b", "c", "b"}}, // compiled again; evicts c
	}
	for i, s := range steps {
		t.Run(fmt.Sprintf("step %d: %s", i, s.key), func(t *testing.T) {
			get(s.key)
			if !slices.Equal(compiles, s.wantCompiles) {
				t.Errorf("compiles = %v, want %v", compiles, s.wantCompiles)
			}
		})
	}
	if n, hits, misses := c.stats(); n != 2 || hits != 2 || misses != 4 {
		t.Errorf("stats = %d entries, %d hits, %d misses; want 2, 2, 4", n, hits, misses)
	}
	if v := testutil.ToFloat64(m.lookups.WithLabelValues("cuda", "hit")); v != 2 {
		t.Errorf("hit counter = %v, want 2", v)
	}
	if v := testutil.ToFloat64(m.lookups.WithLabelValues("cuda", "miss")); v != 4 {
		t.Errorf("miss counter = %v, want 4", v)
	}
	want := `
# HELP brokerd_pjrt_compile_seconds Time to lower and compile one op graph to a PJRT executable.
# TYPE brokerd_pjrt_compile_seconds histogram
brokerd_pjrt_compile_seconds_bucket{platform="cuda",le="0.01"} 0
brokerd_pjrt_compile_seconds_bucket{platform="cuda",le="0.02"} 0
brokerd_pjrt_compile_seconds_bucket{platform="cuda",le="0.04"} 0
brokerd_pjrt_compile_seconds_bucket{platform="cuda",le="0.08"} 0
brokerd_pjrt_compile_seconds_bucket{platform="cuda",le="0.16"} 0
brokerd_pjrt_compile_seconds_bucket{platform="cuda",le="0.32"} 4
brokerd_pjrt_compile_seconds_bucket{platform="cuda",le="0.64"} 4
brokerd_pjrt_compile_seconds_bucket{platform="cuda",le="1.28"} 4
brokerd_pjrt_compile_seconds_bucket{platform="cuda",le="2.56"} 4
brokerd_pjrt_compile_seconds_bucket{platform="cuda",le="5.12"} 4
brokerd_pjrt_compile_seconds_bucket{platform="cuda",le="10.24"} 4
brokerd_pjrt_compile_seconds_bucket{platform="cuda",le="20.48"} 4
brokerd_pjrt_compile_seconds_bucket{platform="cuda",le="+Inf"} 4
brokerd_pjrt_compile_seconds_sum{platform="cuda"} 1.2
brokerd_pjrt_compile_seconds_count{platform="cuda"} 4
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "brokerd_pjrt_compile_seconds"); err != nil {
		t.Error(err)
	}

	t.Run("a failed compile is not cached", func(t *testing.T) {
		boom := errors.New("boom")
		for i := 0; i < 2; i++ {
			if _, err := c.get(ctx, "bad", func() (string, error) { return "", boom }); !errors.Is(err, boom) {
				t.Fatalf("get = %v, want boom", err)
			}
		}
		if n, _, _ := c.stats(); n != 2 {
			t.Errorf("%d entries after failures, want 2", n)
		}
	})

	t.Run("concurrent callers of one key compile once", func(t *testing.T) {
		var n atomic.Int32
		release := make(chan struct{})
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Go(func() {
				v, err := c.get(ctx, "shared", func() (string, error) {
					n.Add(1)
					<-release
					return "exe", nil
				})
				if err != nil || v != "exe" {
					t.Errorf("get = %q, %v", v, err)
				}
			})
		}
		time.Sleep(10 * time.Millisecond)
		close(release)
		wg.Wait()
		if n.Load() != 1 {
			t.Errorf("compiled %d times, want 1", n.Load())
		}
	})

	t.Run("a waiter gives up with its context", func(t *testing.T) {
		started, release := make(chan struct{}), make(chan struct{})
		go c.get(ctx, "slow", func() (string, error) { close(started); <-release; return "exe", nil })
		<-started
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := c.get(cctx, "slow", func() (string, error) { t.Error("compiled twice"); return "", nil }); !errors.Is(err, context.Canceled) {
			t.Errorf("get = %v, want context.Canceled", err)
		}
		close(release)
	})
}

func TestBF16(t *testing.T) {
	for _, tt := range []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80}, {-2, 0xc000}, {0, 0},
		{1.00390625, 0x3f80}, // exactly halfway between 1 and the next bf16: to even
		{1.01171875, 0x3f82}, // halfway, odd below: up
		{3.4e38, 0x7f80},     // rounds past the largest bf16 to +Inf
	} {
		if got := toBF16(tt.in); got != tt.want {
			t.Errorf("toBF16(%v) = %#04x, want %#04x", tt.in, got, tt.want)
		}
	}
}

// TestDonate: a buffer is donated to a run only while that run is its one
// reader, and nothing reads it while donated.
func TestDonate(t *testing.T) {
	b := &buffer{x: &xpjrt.Buffer{}}
	if _, err := b.pin(); err != nil {
		t.Fatal(err)
	}
	if !b.donate() {
		t.Fatal("a buffer pinned only by the run was not donated")
	}
	if _, err := b.pin(); err == nil {
		t.Fatal("a donated buffer was pinned")
	}
	b.undonate()
	if _, err := b.pin(); err != nil {
		t.Fatalf("pin after a failed run: %v", err)
	}
	if b.donate() {
		t.Fatal("a buffer another reader holds was donated")
	}
}
