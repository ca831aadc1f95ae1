package pjrt

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	xpjrt "github.com/gomlx/go-xla/pjrt"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/brokerd/brokerd/runtime"
)

// fakeAdapter returns an adapter that finds exactly the given plugins.
func fakeAdapter(plugins map[string]string, reg prometheus.Registerer) *Adapter {
	return New(AdapterOptions{
		Discovery:  Options{Plugins: plugins, SitePackages: []string{}, Getenv: fakeEnv(nil)},
		Registerer: reg,
	})
}

func TestOpenFailures(t *testing.T) {
	tests := []struct {
		name    string
		plugins func(t *testing.T, dir string) map[string]string
		id      string
		wantErr error
		wantMsg []string
	}{
		{
			name:    "no plugin",
			plugins: func(t *testing.T, dir string) map[string]string { return nil },
			id:      "gpu:0",
			wantErr: ErrNoPlugin,
			wantMsg: []string{"no usable PJRT plugin for gpu (searched: "},
		},
		{
			name: "only a plugin of the other platform",
			plugins: func(t *testing.T, dir string) map[string]string {
				return map[string]string{"tpu": buildFakePlugin(t, dir, "libtpu.so")}
			},
			id:      "gpu:0",
			wantErr: ErrNoPlugin,
		},
		{
			name:    "not a device PJRT drives",
			plugins: func(t *testing.T, dir string) map[string]string { return nil },
			id:      "cpu:0",
			wantMsg: []string{"PJRT drives gpu and tpu devices, not \"cpu\""},
		},
		{
			name:    "malformed ID",
			plugins: func(t *testing.T, dir string) map[string]string { return nil },
			id:      "gpu",
			wantMsg: []string{`device ID "gpu": want type:index`},
		},
		{
			name: "missing file",
			plugins: func(t *testing.T, dir string) map[string]string {
				return map[string]string{"cuda": dir + "/none.so"}
			},
			id:      "gpu:0",
			wantErr: ErrNotFound,
			wantMsg: []string{"cuda (", "none.so): file not found"},
		},
		{
			name: "function table all NULL",
			plugins: func(t *testing.T, dir string) map[string]string {
				return map[string]string{"cuda": buildFakePlugin(t, dir, "xla_cuda_plugin.so", "NULL_TABLE")}
			},
			id:      "gpu:0",
			wantErr: ErrIncompleteAPI,
			wantMsg: []string{"lacks a required function: PJRT_Error_Destroy"},
		},
		{
			name: "function table too short",
			plugins: func(t *testing.T, dir string) map[string]string {
				return map[string]string{"cuda": buildFakePlugin(t, dir, "xla_cuda_plugin.so", "SHORT_TABLE")}
			},
			id:      "gpu:0",
			wantErr: ErrIncompleteAPI,
			wantMsg: []string{"PJRT_Client_Create"},
		},
		{
			name: "plugin initialisation fails",
			plugins: func(t *testing.T, dir string) map[string]string {
				return map[string]string{"cuda": buildFakePlugin(t, dir, "xla_cuda_plugin.so", "INIT_FAIL")}
			},
			id:      "gpu:0",
			wantErr: ErrNoPlugin,
			wantMsg: []string{"initialise plugin: ", "fake: initialise failed"},
		},
		{
			name: "client creation fails",
			plugins: func(t *testing.T, dir string) map[string]string {
				return map[string]string{"cuda": buildFakePlugin(t, dir, "xla_cuda_plugin.so", "CREATE_FAIL")}
			},
			id:      "gpu:0",
			wantErr: ErrNoPlugin,
			wantMsg: []string{"create client: ", "fake: no CUDA device found"},
		},
		{
			name: "client without devices",
			plugins: func(t *testing.T, dir string) map[string]string {
				return map[string]string{"cuda": buildFakePlugin(t, dir, "xla_cuda_plugin.so", "NDEV=0")}
			},
			id:      "gpu:0",
			wantErr: ErrNoDevices,
			wantMsg: []string{`PJRT client has no addressable device (platform "fake")`},
		},
		{
			name: "index beyond the devices",
			plugins: func(t *testing.T, dir string) map[string]string {
				return map[string]string{"cuda": buildFakePlugin(t, dir, "xla_cuda_plugin.so", "NO_PCI")}
			},
			id:      "gpu:5",
			wantMsg: []string{"gpu:5: no PJRT device has hardware id 5 (the plugin sees 2 device(s))"},
		},
		{
			name: "a working plugin after a broken one",
			plugins: func(t *testing.T, dir string) map[string]string {
				return map[string]string{
					"cuda":  buildFakePlugin(t, dir, "a/xla_cuda_plugin.so", "CREATE_FAIL"),
					"cuda2": dir + "/missing.so", // not a known platform: never tried for gpu
				}
			},
			id:      "gpu:0",
			wantErr: ErrNoPlugin,
			wantMsg: []string{"fake: no CUDA device found"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := fakeAdapter(tt.plugins(t, t.TempDir()), nil)
			dev, err := a.Open(context.Background(), runtime.DeviceSpec{ID: tt.id})
			if err == nil {
				dev.Close()
				t.Fatalf("Open(%s) succeeded, want an error", tt.id)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error %v is not %v", err, tt.wantErr)
			}
			for _, m := range tt.wantMsg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not contain %q", err, m)
				}
			}
		})
	}
}

// TestFakeDevices opens devices of the fake plugin: the client's devices and
// their attributes come through go-xla and bd_describe, GPUs are matched by
// PCI bus ID, and the first device call that needs the plugin to do real
// work (a transfer, a compile) fails with the plugin's message.
func TestFakeDevices(t *testing.T) {
	dir := t.TempDir()
	path := buildFakePlugin(t, dir, "xla_cuda_plugin.so", "NDEV=3", "MINOR=71")
	reg := prometheus.NewRegistry()
	a := New(AdapterOptions{
		Discovery:  Options{Plugins: map[string]string{"cuda": path}, SitePackages: []string{}, Getenv: fakeEnv(nil)},
		Registerer: reg,
		Identify: func(id string) (string, string) {
			if id == "gpu:0" {
				return "00000000:12:00.0", "GPU-abc" // NVML's form of the fake's third device
			}
			return "", ""
		},
	})
	ctx := context.Background()

	info, err := a.Describe(ctx, runtime.DeviceGPU)
	if err != nil {
		t.Fatalf("Describe: %v", err)
	}
	if info.Platform != "fake" || info.PlatformVersion != "fake 1.0" || info.APIVersion != "0.71" || info.Plugin != "cuda" {
		t.Errorf("client info = %+v", info)
	}
	if len(info.Devices) != 3 {
		t.Fatalf("devices = %+v, want 3", info.Devices)
	}
	want := DeviceInfo{Index: 1, ID: 101, LocalHardwareID: 1, Kind: "Fake GPU",
		Attributes: map[string]string{"core_count": "132", "coords": "1,2,3", "pci_bus_id": "0000:11:00.0"}}
	got := info.Devices[1]
	if got.Index != want.Index || got.ID != want.ID || got.LocalHardwareID != want.LocalHardwareID || got.Kind != want.Kind ||
		!maps.Equal(got.Attributes, want.Attributes) {
		t.Errorf("device 1 = %+v, want %+v", got, want)
	}

	tests := []struct {
		id        string
		wantIndex int
		wantHow   string
	}{
		{"gpu:0", 2, MatchPCIBusID}, // NVML's gpu:0 is the plugin's third device
		{"gpu:1", 1, MatchIndex},    // nothing identified: by index
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			rd, err := a.Open(ctx, runtime.DeviceSpec{ID: tt.id, Budget: 1 << 20})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer rd.Close()
			d := rd.(*Device)
			di, how := d.Info()
			if di.Index != tt.wantIndex || how != tt.wantHow {
				t.Errorf("matched device %d by %q, want %d by %q", di.Index, how, tt.wantIndex, tt.wantHow)
			}
			if d.Platform() != "fake" || d.ComputeType() != runtime.F32 {
				t.Errorf("platform %q, compute %s", d.Platform(), d.ComputeType())
			}
		})
	}

	rd, err := a.Open(ctx, runtime.DeviceSpec{ID: "gpu:1", Budget: 4096})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	d := rd.(*Device)
	x, err := d.Alloc(runtime.F32, 4, 8)
	if err != nil {
		t.Fatalf("Alloc: %v", err)
	}
	if d.MemoryUsed() != 128 {
		t.Errorf("MemoryUsed = %d, want 128", d.MemoryUsed())
	}
	if _, err := d.Alloc(runtime.F32, 1024, 1024); !errors.Is(err, runtime.ErrOutOfMemory) {
		t.Errorf("Alloc beyond the budget: %v, want ErrOutOfMemory", err)
	}
	err = d.CopyIn(ctx, x, make([]float32, 32))
	if err == nil || !strings.Contains(err.Error(), "fake: no device memory") {
		t.Errorf("CopyIn = %v, want the plugin's transfer error", err)
	}
	if err := d.CopyIn(ctx, x, make([]float32, 3)); !errors.Is(err, runtime.ErrInvalidGraph) {
		t.Errorf("CopyIn of the wrong length = %v, want ErrInvalidGraph", err)
	}
	if err := d.CopyOut(ctx, make([]float32, 32), x); err == nil || !strings.Contains(err.Error(), "never written") {
		t.Errorf("CopyOut of an unwritten buffer = %v", err)
	}

	// Run lowers the graph, then the fake's compile fails; the failure is
	// not cached, so a second run compiles (and fails) again.
	w, _ := d.Alloc(runtime.F32, 8, 2)
	y, _ := d.Alloc(runtime.F32, 4, 2)
	g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpMatMul, In: []string{"x", "w"}, Out: "y"}}}
	for i := 0; i < 2; i++ {
		err = d.Run(ctx, g, map[string]runtime.Buffer{"x": x, "w": w, "y": y})
		if err == nil || !strings.Contains(err.Error(), "compile: ") || !strings.Contains(err.Error(), "fake: cannot compile") {
			t.Fatalf("Run = %v, want the plugin's compile error", err)
		}
	}
	if n, hits, misses := d.CacheStats(); n != 0 || hits != 0 || misses != 2 {
		t.Errorf("cache: %d entries, %d hits, %d misses; want 0, 0, 2", n, hits, misses)
	}
	if c := testutil.ToFloat64(a.metrics.lookups.WithLabelValues("fake", "miss")); c != 2 {
		t.Errorf("miss counter = %v, want 2", c)
	}
	// A graph that does not fit its bindings is refused before compiling.
	bad := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpMatMul, In: []string{"x", "y"}, Out: "w"}}}
	if err := d.Run(ctx, bad, map[string]runtime.Buffer{"x": x, "w": w, "y": y}); !errors.Is(err, runtime.ErrInvalidGraph) {
		t.Errorf("Run of a misfit graph = %v, want ErrInvalidGraph", err)
	}

	d.Free(x)
	d.Free(w)
	d.Free(y)
	if d.MemoryUsed() != 0 {
		t.Errorf("MemoryUsed after Free = %d", d.MemoryUsed())
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Alloc(runtime.F32, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("Alloc after Close = %v, want ErrClosed", err)
	}

	// The adapter registered its series; a second adapter on the same
	// registry shares them rather than panicking.
	_ = fakeAdapter(nil, reg)
	if n, err := testutil.GatherAndCount(reg, "brokerd_pjrt_compile_cache_lookups_total"); err != nil || n != 1 {
		t.Errorf("gathered %d lookup series (%v), want 1", n, err)
	}
}

// TestGoXLADeviceLayout guards devicePointer's reach into go-xla: the
// unexported field it reads must exist, as a pointer.
func TestGoXLADeviceLayout(t *testing.T) {
	if _, err := devicePointer(nil); err == nil {
		t.Error("devicePointer(nil) succeeded")
	}
	// A zero Device has the field, holding NULL.
	_, err := devicePointer(new(xpjrt.Device))
	if err == nil || !strings.Contains(err.Error(), "NULL PJRT_Device") {
		t.Errorf("devicePointer(zero device) = %v, want the NULL-device error (the field exists)", err)
	}
}
