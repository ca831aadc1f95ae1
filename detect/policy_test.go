package detect

import (
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// Device fixtures for policy tests.
func polCPU() Device {
	return Device{ID: "cpu:0", Type: TypeCPU, Name: "Test CPU", Health: Healthy, Runtime: "onednn"}
}

func polGPU(n int) Device {
	return Device{ID: "gpu:" + strconv.Itoa(n), Type: TypeGPU, Index: n, Name: "NVIDIA H100 80GB HBM3", Health: Healthy, Runtime: "pjrt"}
}

func polGPUNoRuntime() Device {
	d := polGPU(0)
	d.Runtime, d.RuntimeReason = "", "pjrt: no PJRT plugin for gpu found"
	return d
}

func polGPUUnhealthy(n int) Device {
	d := polGPU(n)
	d.Health, d.HealthReason = Unhealthy, "XID 79"
	return d
}

func polTPU(n int) Device {
	return Device{ID: "tpu:" + strconv.Itoa(n), Type: TypeTPU, Index: n, Name: "TPU v5e", Health: Healthy, Runtime: "pjrt"}
}

func TestPolicyParsePrefer(t *testing.T) {
	tests := []struct {
		in      string
		want    Prefer
		wantErr bool
	}{
		{"auto", PreferAuto, false},
		{"", PreferAuto, false},
		{"cpu", PreferCPU, false},
		{" GPU ", PreferGPU, false},
		{"tpu", PreferTPU, false},
		{"x", "", true},
		{"npu", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParsePrefer(tt.in)
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidArgument) {
					t.Fatalf("ParsePrefer(%q) err = %v, want ErrInvalidArgument", tt.in, err)
				}
				want := `invalid prefer "` + tt.in + `": want one of auto, cpu, gpu, tpu`
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParsePrefer(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestPolicyParseType(t *testing.T) {
	for _, s := range []string{"cpu", "gpu", "tpu", "amdgpu", "edgetpu"} {
		t.Run(s, func(t *testing.T) {
			if got, err := ParseType(s); err != nil || got != Type(s) {
				t.Fatalf("ParseType(%q) = %q, %v", s, got, err)
			}
		})
	}
	t.Run("bad", func(t *testing.T) {
		if _, err := ParseType("xpu"); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("ParseType(xpu) err = %v, want ErrInvalidArgument", err)
		}
	})
}

func TestSelect(t *testing.T) {
	type avail struct {
		name     string
		devs     []Device
		allowTPU bool
	}
	avails := map[string]avail{
		"cpu only":         {devs: []Device{polCPU()}, allowTPU: true},
		"cpu+gpu":          {devs: []Device{polCPU(), polGPU(0)}, allowTPU: true},
		"cpu+tpu":          {devs: []Device{polCPU(), polTPU(0)}, allowTPU: true},
		"cpu+gpu+tpu":      {devs: []Device{polCPU(), polGPU(0), polTPU(0)}, allowTPU: true},
		"gpu not runnable": {devs: []Device{polCPU(), polGPUNoRuntime()}, allowTPU: true},
		"tpu not allowed":  {devs: []Device{polCPU(), polGPU(0), polTPU(0)}, allowTPU: false},
		"unhealthy gpu":    {devs: []Device{polCPU(), polGPUUnhealthy(0)}, allowTPU: true},
	}
	all := []Type{TypeTPU, TypeGPU, TypeCPU}
	tests := []struct {
		avail  string
		prefer Prefer
		wantID string
		chain  []Type
		reason []string // key words, in order
	}{
		{"cpu only", PreferAuto, "cpu:0", all, []string{"auto", "no TPU present", "no GPU present", "using cpu:0"}},
		{"cpu only", PreferCPU, "cpu:0", []Type{TypeCPU}, []string{"prefer=cpu", "using cpu:0"}},
		{"cpu only", PreferGPU, "cpu:0", []Type{TypeGPU, TypeCPU}, []string{"prefer=gpu but no GPU present", "using cpu:0"}},
		{"cpu only", PreferTPU, "cpu:0", all, []string{"prefer=tpu but no TPU present", "no GPU present", "using cpu:0"}},

		{"cpu+gpu", PreferAuto, "gpu:0", []Type{TypeTPU, TypeGPU}, []string{"no TPU present", "using gpu:0"}},
		{"cpu+gpu", PreferCPU, "cpu:0", []Type{TypeCPU}, []string{"prefer=cpu", "using cpu:0"}},
		{"cpu+gpu", PreferGPU, "gpu:0", []Type{TypeGPU}, []string{"prefer=gpu", "using gpu:0"}},
		{"cpu+gpu", PreferTPU, "gpu:0", []Type{TypeTPU, TypeGPU}, []string{"prefer=tpu but no TPU present", "using gpu:0"}},

		{"cpu+tpu", PreferAuto, "tpu:0", []Type{TypeTPU}, []string{"auto", "using tpu:0"}},
		{"cpu+tpu", PreferCPU, "cpu:0", []Type{TypeCPU}, []string{"using cpu:0"}},
		{"cpu+tpu", PreferGPU, "cpu:0", []Type{TypeGPU, TypeCPU}, []string{"prefer=gpu but no GPU present", "using cpu:0"}},
		{"cpu+tpu", PreferTPU, "tpu:0", []Type{TypeTPU}, []string{"prefer=tpu", "using tpu:0"}},

		{"cpu+gpu+tpu", PreferAuto, "tpu:0", []Type{TypeTPU}, []string{"using tpu:0"}},
		{"cpu+gpu+tpu", PreferCPU, "cpu:0", []Type{TypeCPU}, []string{"using cpu:0"}},
		{"cpu+gpu+tpu", PreferGPU, "gpu:0", []Type{TypeGPU}, []string{"using gpu:0"}},
		{"cpu+gpu+tpu", PreferTPU, "tpu:0", []Type{TypeTPU}, []string{"using tpu:0"}},

		{"gpu not runnable", PreferAuto, "cpu:0", all, []string{"no TPU present", "no runnable GPU (gpu:0 has no runtime: pjrt: no PJRT plugin for gpu found)", "using cpu:0"}},
		{"gpu not runnable", PreferCPU, "cpu:0", []Type{TypeCPU}, []string{"using cpu:0"}},
		{"gpu not runnable", PreferGPU, "cpu:0", []Type{TypeGPU, TypeCPU}, []string{"prefer=gpu but no runnable GPU (gpu:0 has no runtime", "using cpu:0"}},
		{"gpu not runnable", PreferTPU, "cpu:0", all, []string{"prefer=tpu but no TPU present", "gpu:0 has no runtime", "using cpu:0"}},

		{"tpu not allowed", PreferAuto, "gpu:0", []Type{TypeTPU, TypeGPU}, []string{"TPU skipped: COMPUTE_ALLOW_TPU=false", "using gpu:0"}},
		{"tpu not allowed", PreferCPU, "cpu:0", []Type{TypeCPU}, []string{"using cpu:0"}},
		{"tpu not allowed", PreferGPU, "gpu:0", []Type{TypeGPU}, []string{"using gpu:0"}},
		{"tpu not allowed", PreferTPU, "gpu:0", []Type{TypeTPU, TypeGPU}, []string{"prefer=tpu but COMPUTE_ALLOW_TPU=false", "using gpu:0"}},

		{"unhealthy gpu", PreferAuto, "cpu:0", all, []string{"no runnable GPU (gpu:0 is unhealthy: XID 79)", "using cpu:0"}},
		{"unhealthy gpu", PreferCPU, "cpu:0", []Type{TypeCPU}, []string{"using cpu:0"}},
		{"unhealthy gpu", PreferGPU, "cpu:0", []Type{TypeGPU, TypeCPU}, []string{"prefer=gpu but no runnable GPU (gpu:0 is unhealthy", "using cpu:0"}},
		{"unhealthy gpu", PreferTPU, "cpu:0", all, []string{"prefer=tpu but no TPU present", "gpu:0 is unhealthy", "using cpu:0"}},
	}
	for _, tt := range tests {
		t.Run(tt.avail+"/prefer="+string(tt.prefer), func(t *testing.T) {
			a, ok := avails[tt.avail]
			if !ok {
				t.Fatalf("unknown availability %q", tt.avail)
			}
			sel := Select(a.devs, Policy{Prefer: tt.prefer, AllowTPU: a.allowTPU})
			if sel.Device == nil {
				t.Fatalf("no device selected; reason %q", sel.Reason)
			}
			if sel.Device.ID != tt.wantID {
				t.Errorf("device = %s, want %s (reason %q)", sel.Device.ID, tt.wantID, sel.Reason)
			}
			if !reflect.DeepEqual(sel.Chain, tt.chain) {
				t.Errorf("chain = %v, want %v", sel.Chain, tt.chain)
			}
			wantMode := "manual"
			if tt.prefer == PreferAuto {
				wantMode = "auto"
			}
			if sel.Mode != wantMode {
				t.Errorf("mode = %q, want %q", sel.Mode, wantMode)
			}
			rest := sel.Reason
			for _, w := range tt.reason {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("reason %q lacks %q (in order %q)", sel.Reason, w, tt.reason)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}

func TestSelectEdgeCases(t *testing.T) {
	cpuNoRT := polCPU()
	cpuNoRT.Runtime, cpuNoRT.RuntimeReason = "", "onednn: libdnnl.so.2 not found"
	tests := []struct {
		name       string
		devs       []Device
		p          Policy
		wantID     string // "" = nil
		chain      []Type
		wantReason string // exact when set
		keywords   []string
	}{
		{
			name:       "design example",
			devs:       []Device{polCPU(), polGPUNoRuntime(), polTPU(0)},
			p:          Policy{Prefer: PreferTPU},
			wantID:     "cpu:0",
			chain:      []Type{TypeTPU, TypeGPU, TypeCPU},
			wantReason: "prefer=tpu but COMPUTE_ALLOW_TPU=false; no runnable GPU (gpu:0 has no runtime: pjrt: no PJRT plugin for gpu found); using cpu:0",
		},
		{
			name:     "lowest healthy index wins whatever the order",
			devs:     []Device{polGPU(2), polGPU(1), polGPUUnhealthy(0), polCPU()},
			p:        Policy{Prefer: PreferGPU},
			wantID:   "gpu:1",
			chain:    []Type{TypeGPU},
			keywords: []string{"prefer=gpu; gpu:0 is unhealthy: XID 79; using gpu:1"},
		},
		{
			name:     "nothing at all",
			devs:     nil,
			p:        Policy{Prefer: PreferAuto, AllowTPU: true},
			chain:    []Type{TypeTPU, TypeGPU, TypeCPU},
			keywords: []string{"no TPU present", "no GPU present", "no CPU present", "no runnable device"},
		},
		{
			name:     "nothing runnable",
			devs:     []Device{cpuNoRT, polGPUUnhealthy(0)},
			p:        Policy{Prefer: PreferCPU, AllowTPU: true},
			chain:    []Type{TypeCPU},
			keywords: []string{"prefer=cpu but no runnable CPU (cpu:0 has no runtime: onednn: libdnnl.so.2 not found)", "no runnable device"},
		},
		{
			name:     "preference chain exhausted falls outside it",
			devs:     []Device{cpuNoRT, polGPU(0)},
			p:        Policy{Prefer: PreferCPU, AllowTPU: true},
			wantID:   "gpu:0",
			chain:    []Type{TypeCPU, TypeGPU},
			keywords: []string{"prefer=cpu but no runnable CPU", "using gpu:0 outside the preferred chain"},
		},
		{
			name:     "empty prefer is auto",
			devs:     []Device{polCPU(), polGPU(0)},
			p:        Policy{},
			wantID:   "gpu:0",
			chain:    []Type{TypeTPU, TypeGPU},
			keywords: []string{"auto"},
		},
		{
			name:     "devices without IDs are named by index",
			devs:     []Device{{Type: TypeGPU, Index: 3, Health: Unhealthy, Runtime: "pjrt"}, {Type: TypeCPU, Runtime: "onednn"}},
			p:        Policy{Prefer: PreferGPU},
			wantID:   "cpu:0",
			chain:    []Type{TypeGPU, TypeCPU},
			keywords: []string{"gpu:3 is unhealthy", "using cpu:0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sel := Select(tt.devs, tt.p)
			gotID := ""
			if sel.Device != nil {
				gotID = deviceLabel(sel.Device)
			}
			if gotID != tt.wantID {
				t.Errorf("device = %q, want %q (reason %q)", gotID, tt.wantID, sel.Reason)
			}
			if !reflect.DeepEqual(sel.Chain, tt.chain) {
				t.Errorf("chain = %v, want %v", sel.Chain, tt.chain)
			}
			if tt.wantReason != "" && sel.Reason != tt.wantReason {
				t.Errorf("reason = %q\nwant     %q", sel.Reason, tt.wantReason)
			}
			for _, w := range tt.keywords {
				if !strings.Contains(sel.Reason, w) {
					t.Errorf("reason %q lacks %q", sel.Reason, w)
				}
			}
		})
	}
}

func TestSelectFor(t *testing.T) {
	devs := []Device{polCPU(), polGPUUnhealthy(0), polGPU(1), polGPU(2), polTPU(0), polGPUNoRuntime()}
	devs[5].ID, devs[5].Index = "gpu:3", 3
	cordons := map[string]string{"gpu:2": "maintenance"}
	tests := []struct {
		name    string
		p       Policy
		pinType Type
		pinID   string
		cordons map[string]string
		wantID  string
		wantErr error
		errText string
	}{
		{name: "no pin is Select", p: Policy{Prefer: PreferAuto, AllowTPU: true}, wantID: "tpu:0"},
		{name: "no pin honours allow", p: Policy{Prefer: PreferAuto}, wantID: "gpu:1"},
		{name: "pin id", pinID: "gpu:1", wantID: "gpu:1"},
		{name: "pin id and matching type", pinType: TypeGPU, pinID: "gpu:1", wantID: "gpu:1"},
		{name: "unknown id", pinID: "gpu:9", wantErr: ErrDeviceNotFound, errText: `"gpu:9"`},
		{name: "id of another type", pinType: TypeTPU, pinID: "gpu:1", wantErr: ErrInvalidArgument},
		{name: "unhealthy id", pinID: "gpu:0", wantErr: ErrDeviceUnavailable, errText: "gpu:0 is unhealthy: XID 79"},
		{name: "no runtime id", pinID: "gpu:3", wantErr: ErrDeviceUnavailable, errText: "gpu:3 has no runtime"},
		{name: "cordoned id", pinID: "gpu:2", cordons: cordons, wantErr: ErrDeviceCordoned, errText: "gpu:2 is cordoned: maintenance"},
		{name: "cordon ignored without set", pinID: "gpu:2", wantID: "gpu:2"},
		{name: "tpu id not allowed", pinID: "tpu:0", wantErr: ErrDeviceUnavailable, errText: "COMPUTE_ALLOW_TPU=false"},
		{name: "tpu id allowed", p: Policy{AllowTPU: true}, pinID: "tpu:0", wantID: "tpu:0"},
		{name: "pin type picks lowest usable", pinType: TypeGPU, wantID: "gpu:1"},
		{name: "pin type skips cordoned", pinType: TypeGPU, cordons: map[string]string{"gpu:1": ""}, wantID: "gpu:2"},
		{name: "pin type none usable", pinType: TypeGPU, cordons: map[string]string{"gpu:1": "a", "gpu:2": "b"}, wantErr: ErrDeviceUnavailable, errText: "gpu:1 is cordoned: a"},
		{name: "pin type absent", pinType: TypeEdgeTPU, wantErr: ErrDeviceNotFound},
		{name: "pin type tpu not allowed", pinType: TypeTPU, wantErr: ErrDeviceUnavailable, errText: "COMPUTE_ALLOW_TPU=false"},
		{name: "pin type unknown", pinType: "xpu", wantErr: ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := selectFor(devs, tt.p, tt.cordons, tt.pinType, tt.pinID)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.errText) {
					t.Errorf("err %q lacks %q", err, tt.errText)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if d.ID != tt.wantID {
				t.Errorf("device = %s, want %s", d.ID, tt.wantID)
			}
		})
	}
	t.Run("exported ignores cordons", func(t *testing.T) {
		d, err := SelectFor(devs, Policy{}, "", "gpu:2")
		if err != nil || d.ID != "gpu:2" {
			t.Fatalf("SelectFor = %v, %v", d, err)
		}
	})
	t.Run("cordoned is unavailable", func(t *testing.T) {
		if !errors.Is(ErrDeviceCordoned, ErrDeviceUnavailable) {
			t.Fatal("ErrDeviceCordoned does not wrap ErrDeviceUnavailable")
		}
	})
	t.Run("nothing runnable", func(t *testing.T) {
		_, err := SelectFor([]Device{polGPUUnhealthy(0)}, Policy{}, "", "")
		if !errors.Is(err, ErrDeviceUnavailable) || !strings.Contains(err.Error(), "no runnable device") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestPlanBatch(t *testing.T) {
	def := DefaultFactors()
	tests := []struct {
		name    string
		base    int
		typ     Type
		f       Factors
		wantMax int
		buckets []int // checked when set
	}{
		{"tpu base 1", 1, TypeTPU, def, 128, []int{1, 2, 4, 8, 16, 32, 64, 128}},
		{"tpu base 2", 2, TypeTPU, def, 256, nil},
		{"tpu base 3 tie goes up", 3, TypeTPU, def, 512, nil},
		{"tpu base 4", 4, TypeTPU, def, 512, nil},
		{"tpu base 5 rounds down", 5, TypeTPU, def, 512, nil},
		{"tpu base 6 tie goes up", 6, TypeTPU, def, 1024, nil},
		{"tpu base 7", 7, TypeTPU, def, 1024, nil},
		{"tpu base 11", 11, TypeTPU, def, 1024, nil}, // 1408: 384 from 1024, 640 from 2048
		{"tpu base 12 tie goes up", 12, TypeTPU, def, 2048, nil},
		{"tpu base 100", 100, TypeTPU, def, 16384, nil},    // 12800
		{"tpu base 1000", 1000, TypeTPU, def, 131072, nil}, // 128000
		{"tpu base 4095", 4095, TypeTPU, def, 524288, nil},
		{"tpu base 4096", 4096, TypeTPU, def, 524288, nil},
		{"tpu custom factor 100", 1, TypeTPU, Factors{TPU: 100}, 128, nil}, // 100: 36 from 64, 28 from 128
		{"tpu custom factor 90", 1, TypeTPU, Factors{TPU: 90}, 64, nil},    // 90: 26 from 64, 38 from 128
		{"tpu zero factor is default", 1, TypeTPU, Factors{}, 128, nil},
		{"gpu base 1", 1, TypeGPU, def, 4, []int{1, 2, 4}},
		{"gpu base 3 keeps max", 3, TypeGPU, def, 12, []int{1, 2, 4, 8, 12}},
		{"gpu base 4096", 4096, TypeGPU, def, 16384, nil},
		{"gpu custom factor", 5, TypeGPU, Factors{GPU: 3}, 15, []int{1, 2, 4, 8, 15}},
		{"cpu base 1", 1, TypeCPU, def, 1, []int{1}},
		{"cpu base 3", 3, TypeCPU, def, 3, []int{1, 2, 3}},
		{"cpu base 64", 64, TypeCPU, def, 64, []int{1, 2, 4, 8, 16, 32, 64}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := PlanBatch(tt.base, tt.typ, tt.f)
			if err != nil {
				t.Fatal(err)
			}
			if p.Max != tt.wantMax || p.Min != 1 || p.Base != tt.base || p.Type != tt.typ {
				t.Fatalf("plan = %+v, want max %d min 1", p, tt.wantMax)
			}
			if tt.buckets != nil && !reflect.DeepEqual(p.Buckets, tt.buckets) {
				t.Errorf("buckets = %v, want %v", p.Buckets, tt.buckets)
			}
			// Invariants: ascending, start at 1, end at max, powers of two but max.
			if p.Buckets[0] != 1 || p.Buckets[len(p.Buckets)-1] != p.Max {
				t.Errorf("buckets %v do not run from 1 to %d", p.Buckets, p.Max)
			}
			for i, b := range p.Buckets {
				if i > 0 && b <= p.Buckets[i-1] {
					t.Errorf("buckets %v not ascending", p.Buckets)
				}
				if b != p.Max && !isPow2(b) {
					t.Errorf("bucket %d is not a power of two", b)
				}
			}
		})
	}
}

func TestPlanBatchErrors(t *testing.T) {
	tests := []struct {
		name    string
		base    int
		typ     Type
		f       Factors
		errText string
	}{
		{"zero base", 0, TypeCPU, DefaultFactors(), "invalid base batch 0"},
		{"negative base", -3, TypeGPU, DefaultFactors(), "invalid base batch -3"},
		{"base above limit", MaxBaseBatch + 1, TypeCPU, DefaultFactors(), "want 1 to 4096"},
		{"huge base", math.MaxInt, TypeTPU, DefaultFactors(), "invalid base batch"},
		{"max above limit", 4096, TypeGPU, Factors{GPU: 1024}, "above 1048576"},
		{"tpu rounds above limit", 4096, TypeTPU, Factors{TPU: 384}, "above 1048576"}, // 1572864 → 2097152
		{"negative factor", 1, TypeGPU, Factors{GPU: -1}, "invalid gpu batch factor -1"},
		{"amdgpu has no plan", 1, TypeAMDGPU, DefaultFactors(), "no batch plan for amdgpu"},
		{"edgetpu has no plan", 1, TypeEdgeTPU, DefaultFactors(), "no batch plan for edgetpu"},
		{"unknown type", 1, "xpu", DefaultFactors(), `invalid device type "xpu"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := PlanBatch(tt.base, tt.typ, tt.f)
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("err = %v, want ErrInvalidArgument", err)
			}
			if !strings.Contains(err.Error(), tt.errText) {
				t.Errorf("err %q lacks %q", err, tt.errText)
			}
		})
	}
}

func TestPlanNearestPow2(t *testing.T) {
	tests := []struct{ in, want int }{
		{1, 1}, {2, 2}, {3, 4}, {5, 4}, {6, 8}, {7, 8}, {12, 16}, {24, 32}, {384, 512}, {640, 512},
		{768, 1024}, {1 << 30, 1 << 30}, {3 << 29, 1 << 31},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.in), func(t *testing.T) {
			if got := nearestPow2(tt.in); got != tt.want {
				t.Errorf("nearestPow2(%d) = %d, want %d", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseMemoryStrategy(t *testing.T) {
	tests := []struct {
		in       string
		wantName string
		wantFrac float64
		wantErr  bool
	}{
		{"", "balanced", 0.75, false},
		{"balanced", "balanced", 0.75, false},
		{"conservative", "conservative", 0.60, false},
		{"Aggressive", "aggressive", 0.90, false},
		{"0.5", "custom", 0.5, false},
		{"1", "custom", 1, false},
		{"0", "", 0, true},
		{"-0.2", "", 0, true},
		{"1.01", "", 0, true},
		{"NaN", "", 0, true},
		{"lots", "", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseMemoryStrategy(tt.in)
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "conservative, balanced, aggressive or a fraction") {
					t.Fatalf("err = %v, want ErrInvalidArgument naming the allowed values", err)
				}
				return
			}
			if err != nil || got.Name != tt.wantName || got.Fraction != tt.wantFrac {
				t.Fatalf("got %+v, %v; want %s %v", got, err, tt.wantName, tt.wantFrac)
			}
		})
	}
}

func TestMemoryBudget(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		name  string
		ms    MemoryStrategy
		total uint64
		want  uint64
	}{
		{"balanced 80 GiB", MemoryBalanced, 80 * gib, 60 * gib},
		{"conservative 16 GiB", MemoryConservative, 16 * gib, 10307921510}, // 0.6 × 17179869184 = 10307921510.4,
		{"aggressive 10 GiB", MemoryAggressive, 10 * gib, 9 * gib},
		{"whole", MemoryStrategy{Name: "custom", Fraction: 1}, 12345, 12345},
		{"zero total", MemoryBalanced, 0, 0},
		{"zero fraction", MemoryStrategy{}, 100, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.ms.Budget(tt.total); got != tt.want {
				t.Errorf("Budget(%d) = %d, want %d", tt.total, got, tt.want)
			}
		})
	}
	if s := MemoryBalanced.String(); s != "balanced (0.75)" {
		t.Errorf("String() = %q", s)
	}
}

func TestCostTable(t *testing.T) {
	h100 := Device{Type: TypeGPU, Name: "NVIDIA H100 80GB HBM3"}
	a100 := Device{Type: TypeGPU, Name: "NVIDIA A100-SXM4-80GB"}
	tpu := Device{Type: TypeTPU}
	cpu := Device{Type: TypeCPU}
	amd := Device{Type: TypeAMDGPU}
	tests := []struct {
		name      string
		overrides string
		dev       Device
		want      float64
	}{
		{"default cpu", "", cpu, 0},
		{"default gpu", "", h100, 0.50},
		{"default tpu", "", tpu, 2.00},
		{"unpriced type", "", amd, 0},
		{"type override", "gpu=0.9,tpu=3.1", a100, 0.9},
		{"tpu override", "gpu=0.9,tpu=3.1", tpu, 3.1},
		{"name beats type", "gpu=0.9,NVIDIA H100 80GB HBM3=4.5", h100, 4.5},
		{"name leaves others", "gpu=0.9,NVIDIA H100 80GB HBM3=4.5", a100, 0.9},
		{"spaces and case", " GPU = 1.25 , ", h100, 1.25},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseCostOverrides(tt.overrides)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.PerHour(&tt.dev); got != tt.want {
				t.Errorf("PerHour = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestCostOverridesErrors(t *testing.T) {
	for _, s := range []string{"gpu", "=1", "gpu=abc", "gpu=-1", "tpu=NaN", "tpu=Inf"} {
		t.Run(s, func(t *testing.T) {
			if _, err := ParseCostOverrides(s); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("ParseCostOverrides(%q) err = %v, want ErrInvalidArgument", s, err)
			}
		})
	}
}

func TestCostShare(t *testing.T) {
	tests := []struct {
		name              string
		perHour, seconds  float64
		items, batchItems int
		want              float64
	}{
		{"whole hour whole batch", 3.6, 3600, 8, 8, 3.6},
		{"quarter of a batch for 10 s", 3.6, 10, 2, 8, 0.0025},
		{"free device", 0, 10, 1, 1, 0},
		{"empty batch", 2, 10, 1, 0, 0},
		{"no items", 2, 10, 0, 4, 0},
		{"no time", 2, 0, 1, 4, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := CostShare(tt.perHour, tt.seconds, tt.items, tt.batchItems)
			if math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("CostShare = %v, want %v", got, tt.want)
			}
		})
	}
	t.Run("clone is independent", func(t *testing.T) {
		a := DefaultCostTable()
		b := a.Clone()
		b.PerType[TypeGPU] = 9
		b.PerName["x"] = 1
		if a.PerType[TypeGPU] != 0.5 || len(a.PerName) != 0 {
			t.Fatalf("Clone shares maps: %+v", a)
		}
	})
}
