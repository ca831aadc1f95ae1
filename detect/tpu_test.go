package detect

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
)

// hwEnv is a Getenv over a fixed map, standing in for a TPU VM's environment.
func hwEnv(m map[string]string) Getenv { return func(k string) string { return m[k] } }

// tpuChip is the part of a TPU Device a test compares.
type tpuChip struct {
	ID, PCI, Gen string
	NUMA         int
	HBM          uint64
	Path         string // the one device node, relative to the dev root; "" when missing
	Health       Health
	Topology     string
	Worker       int
}

func tpuChips(t *testing.T, roots Roots, devs []Device) []tpuChip {
	t.Helper()
	var out []tpuChip
	for _, d := range devs {
		if d.Type != TypeTPU || d.TPU == nil || d.Vendor != "Google" || !d.BF16 || !d.MultiDevice || d.Runtime != "" {
			t.Errorf("%s: malformed TPU device %+v", d.ID, d)
			continue
		}
		if d.Index != d.TPU.ChipIndex || d.ID != fmt.Sprintf("tpu:%d", d.Index) || d.Name != "TPU "+d.TPU.Generation ||
			d.Architecture != d.TPU.Generation || d.MemoryFree != d.MemoryTotal {
			t.Errorf("%s: inconsistent fields: index %d chip %d name %q arch %q memory %d/%d",
				d.ID, d.Index, d.TPU.ChipIndex, d.Name, d.Architecture, d.MemoryFree, d.MemoryTotal)
		}
		c := tpuChip{ID: d.ID, PCI: d.PCIBusID, Gen: d.TPU.Generation, NUMA: d.NUMANode, HBM: d.MemoryTotal,
			Health: d.Health, Topology: d.TPU.Topology, Worker: d.TPU.WorkerID}
		switch len(d.DevicePaths) {
		case 0:
		case 1:
			rel, err := filepath.Rel(roots.Dev, d.DevicePaths[0])
			if err != nil {
				t.Fatal(err)
			}
			c.Path = filepath.ToSlash(rel)
		default:
			t.Errorf("%s: device paths %v", d.ID, d.DevicePaths)
		}
		out = append(out, c)
	}
	return out
}

// hwSeqChips builds n healthy chips on consecutive slots of bus 00 starting at slot.
func hwSeqChips(n, slot int, gen string, hbm uint64, numa int, path func(i int) string, topo string, worker int) []tpuChip {
	var out []tpuChip
	for i := 0; i < n; i++ {
		out = append(out, tpuChip{
			ID: fmt.Sprintf("tpu:%d", i), PCI: fmt.Sprintf("0000:00:%02x.0", slot+i), Gen: gen, NUMA: numa, HBM: hbm,
			Path: path(i), Health: Healthy, Topology: topo, Worker: worker,
		})
	}
	return out
}

func accelPath(i int) string { return fmt.Sprintf("accel%d", i) }

func TestTPUDetect(t *testing.T) {
	v5eGroups := []string{"5", "6", "7", "8", "17", "18", "19", "20"}
	var v5e []tpuChip
	for i := 0; i < 8; i++ {
		bus, numa := "00", 0
		if i >= 4 {
			bus, numa = "80", 1
		}
		v5e = append(v5e, tpuChip{
			ID: fmt.Sprintf("tpu:%d", i), PCI: fmt.Sprintf("0000:%s:%02x.0", bus, 4+i%4), Gen: "v5e", NUMA: numa,
			HBM: 16 * testGiB, Path: "vfio/" + v5eGroups[i], Health: Healthy, Topology: "2x4", Worker: 0,
		})
	}
	v6e := hwSeqChips(4, 5, "v6e", 32*testGiB, 0, func(i int) string { return fmt.Sprintf("vfio/%d", 4+i) }, "2x2", 3)

	tests := []struct {
		name      string
		host      string
		env       map[string]string
		want      []tpuChip
		wantAccel string // TPUInfo.AcceleratorType of every chip
		notes     []string
	}{
		{
			name: "v4 without environment", host: "tpu-v4",
			want: hwSeqChips(4, 4, "v4", 32*testGiB, 0, accelPath, "", -1),
		},
		{
			name: "v4 with TPU VM environment", host: "tpu-v4",
			env:       map[string]string{"TPU_ACCELERATOR_TYPE": "v4-8", "TPU_WORKER_ID": "0", "TPU_NAME": "brokerd-v4", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1"},
			want:      hwSeqChips(4, 4, "v4", 32*testGiB, 0, accelPath, "2x2x1", 0),
			wantAccel: "v4-8",
		},
		{
			name: "v5e through vfio", host: "tpu-v5e",
			env:  map[string]string{"TPU_ACCELERATOR_TYPE": "v5litepod-8", "TPU_WORKER_ID": "0"},
			want: v5e, wantAccel: "v5litepod-8",
		},
		{
			name: "v6e with visible chips and explicit topology", host: "tpu-v6e",
			env:  map[string]string{"TPU_ACCELERATOR_TYPE": "v6e-16", "TPU_TOPOLOGY": "2x2", "TPU_WORKER_ID": "3", "TPU_VISIBLE_CHIPS": "1,3"},
			want: []tpuChip{v6e[1], v6e[3]}, wantAccel: "v6e-16",
		},
		{
			name: "v6e topology derived from the accelerator type", host: "tpu-v6e",
			env:       map[string]string{"TPU_ACCELERATOR_TYPE": "v6e-4", "TPU_WORKER_ID": "3"},
			want:      hwSeqChips(4, 5, "v6e", 32*testGiB, 0, func(i int) string { return fmt.Sprintf("vfio/%d", 4+i) }, "2x2", 3),
			wantAccel: "v6e-4",
		},
		{
			name: "v2 by subsystem device", host: "tpu-v2",
			env:  map[string]string{"TPU_ACCELERATOR_TYPE": "v2-8"},
			want: hwSeqChips(4, 4, "v2", 16*testGiB, 0, accelPath, "2x2", -1), wantAccel: "v2-8",
		},
		{
			name: "v3 by subsystem device", host: "tpu-v3",
			env:  map[string]string{"TPU_ACCELERATOR_TYPE": "v3-8"},
			want: hwSeqChips(4, 4, "v3", 32*testGiB, 0, accelPath, "2x2", -1), wantAccel: "v3-8",
		},
		{
			name: "bad environment is noted, not trusted", host: "tpu-v5e",
			env: map[string]string{"TPU_ACCELERATOR_TYPE": "v4-8", "TPU_WORKER_ID": "first", "TPU_VISIBLE_CHIPS": "0,x"},
			want: func() []tpuChip {
				out := append([]tpuChip(nil), v5e...)
				for i := range out {
					out[i].Topology, out[i].Worker = "", -1
				}
				return out
			}(),
			wantAccel: "v4-8",
			notes:     []string{"names v4 chips but this host has v5e chips", "TPU_WORKER_ID \"first\"", "TPU_VISIBLE_CHIPS \"0,x\""},
		},
		{
			name: "visible chip that does not exist", host: "tpu-v4",
			env:   map[string]string{"TPU_VISIBLE_CHIPS": "2,4"},
			want:  hwSeqChips(4, 4, "v4", 32*testGiB, 0, accelPath, "", -1)[2:3],
			notes: []string{"names chip 4 but this host has 4 chips"},
		},
		{
			name: "broken host keeps the readable chip", host: "broken",
			want: []tpuChip{{ID: "tpu:0", PCI: "0000:00:05.0", Gen: "v4", NUMA: -1, HBM: 32 * testGiB, Health: Unhealthy, Worker: -1}},
			notes: []string{
				"0000:00:04.0/device has malformed contents", // garbage device ID
				"0000:00:05.0/numa_node has malformed contents",
				"accel0 not found",
				"subsystem device 0x0000 is neither v2",
				"0000:00:07.0/vendor",
				"0000:00:08.0/vendor has malformed contents",
				"0000:00:09.0/vendor",
				"\"not-a-device\" is not a PCI address",
			},
		},
		{name: "CPU-only host", host: "cpu-cgroup-v2"},
		{name: "Coral is not a Cloud TPU", host: "coral"},
		{name: "AMD host", host: "amd"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			roots := hwRoots(tc.host)
			res := NewTPUDetector(roots, hwEnv(tc.env)).Detect(context.Background())
			hwCheckNotes(t, res.Notes, tc.notes)
			if got := tpuChips(t, roots, res.Devices); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("chips:\n got %+v\nwant %+v", got, tc.want)
			}
			for _, d := range res.Devices {
				i := d.TPU
				if i.AcceleratorType != tc.wantAccel || i.TPUName != tc.env["TPU_NAME"] ||
					i.ChipsPerHostBounds != tc.env["TPU_CHIPS_PER_HOST_BOUNDS"] || i.VisibleChips != tc.env["TPU_VISIBLE_CHIPS"] {
					t.Errorf("%s: environment = %+v", d.ID, *i)
				}
				if (d.Health == Unhealthy) != (d.HealthReason != "") {
					t.Errorf("%s: health %s with reason %q", d.ID, d.Health, d.HealthReason)
				}
			}
		})
	}
}

func TestTPUDetectEmptyHost(t *testing.T) {
	res := NewTPUDetector(hwEmptyRoots(t), nil).Detect(context.Background())
	if len(res.Devices) != 0 || len(res.Notes) != 0 {
		t.Errorf("empty host: %+v", res)
	}
}

func TestTPUGenerationOf(t *testing.T) {
	tests := []struct {
		device, subsystem uint16
		want              string
		hbm               uint64
		vfio              bool
	}{
		{0x0027, 0x004e, "v2", 16 * testGiB, false},
		{0x0027, 0x004f, "v3", 32 * testGiB, false},
		{0x0027, 0x0000, "", 0, false},
		{0x005e, 0, "v4", 32 * testGiB, false},
		{0x0063, 0, "v5e", 16 * testGiB, true},
		{0x0062, 0, "v5p", 95 * testGiB, true},
		{0x006f, 0, "v6e", 32 * testGiB, true},
		{0x0076, 0, "7x", 192 * testGiB, true},
		{0x0042, 0, "", 0, false}, // gVNIC
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%04x:%04x", tc.device, tc.subsystem), func(t *testing.T) {
			g, ok := tpuGenerationOf(PCIDevice{Vendor: PCIVendorGoogle, Device: tc.device, SubsystemDevice: tc.subsystem})
			if ok != (tc.want != "") || g.name != tc.want || g.hbm != tc.hbm || g.vfio != tc.vfio {
				t.Errorf("tpuGenerationOf = %+v, %v; want %s, %d bytes, vfio %v", g, ok, tc.want, tc.hbm, tc.vfio)
			}
		})
	}
}

func TestTPUTopologyFromAcceleratorType(t *testing.T) {
	tests := []struct {
		accel, gen, topo string
	}{
		{"v2-8", "v2", "2x2"},
		{"v3-32", "v3", "4x4"},
		{"v3-2048", "v3", "32x32"},
		{"v4-8", "v4", "2x2x1"},
		{"v4-16", "v4", "2x2x2"},
		{"v4-32", "v4", "2x2x4"},
		{"v4-64", "v4", "2x4x4"},
		{"v4-128", "v4", "4x4x4"},
		{"v4-256", "v4", "4x4x8"},
		{"v5p-8", "v5p", "2x2x1"},
		{"v5p-1024", "v5p", "8x8x8"},
		{"v5litepod-1", "v5e", "1x1"},
		{"v5litepod-4", "v5e", "2x2"},
		{"v5litepod-8", "v5e", "2x4"},
		{"v5litepod-32", "v5e", "4x8"},
		{"v5litepod-256", "v5e", "16x16"},
		{"v6e-8", "v6e", "2x4"},
		{"v6e-128", "v6e", "8x16"},
		{"V6E-16", "v6e", "4x4"},
		{"v4-24", "v4", ""}, // not a power of two: no default shape
		{"v4-7", "v4", ""},
		{"v5litepod-x", "", ""},
		{"tpu7x-8", "", ""},
		{"nonsense", "", ""},
		{"", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.accel, func(t *testing.T) {
			gen, topo := topologyFromAcceleratorType(tc.accel)
			if gen != tc.gen || topo != tc.topo {
				t.Errorf("topologyFromAcceleratorType(%q) = %q, %q; want %q, %q", tc.accel, gen, topo, tc.gen, tc.topo)
			}
		})
	}
}
