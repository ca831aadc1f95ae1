package detect

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"
)

func TestAMDDetect(t *testing.T) {
	type gpu struct {
		ID, Name, Arch, PCI string
		NUMA                int
		Mem                 uint64
		Paths               []string // relative to the dev root
	}
	tests := []struct {
		name  string
		host  string
		want  []gpu
		notes []string
	}{
		{
			name: "CPU node and two MI210 nodes", host: "amd",
			want: []gpu{
				{"amdgpu:0", "aldebaran", "gfx90a", "0000:03:00.0", 0, 68702699520, []string{"kfd", "dri/renderD128"}},
				{"amdgpu:1", "aldebaran", "gfx90a", "0000:83:00.0", 1, 68702699520, []string{"kfd", "dri/renderD136"}},
			},
		},
		{
			name: "broken nodes are skipped or left unknown", host: "broken",
			want: []gpu{{"amdgpu:0", "AMD GPU 0x740f", "gfx90a", "0000:03:00.0", -1, 0, nil}},
			notes: []string{"Skipped KFD node 1", "nodes/1/properties has malformed contents line \"simd_count lots\"",
				"mem_banks/0/properties has malformed contents", "KFD device node"},
		},
		{name: "no amdgpu driver", host: "tpu-v4"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			roots := hwRoots(tc.host)
			res := NewAMDDetector(roots).Detect(context.Background())
			hwCheckNotes(t, res.Notes, tc.notes)
			var got []gpu
			for i, d := range res.Devices {
				if d.Type != TypeAMDGPU || d.Index != i || d.Vendor != "AMD" || d.RuntimeReason != NoAdapterReason || d.Runtime != "" || d.MemoryFree != d.MemoryTotal {
					t.Errorf("%s: malformed device %+v", d.ID, d)
				}
				g := gpu{ID: d.ID, Name: d.Name, Arch: d.Architecture, PCI: d.PCIBusID, NUMA: d.NUMANode, Mem: d.MemoryTotal}
				for _, p := range d.DevicePaths {
					rel, err := filepath.Rel(roots.Dev, p)
					if err != nil {
						t.Fatal(err)
					}
					g.Paths = append(g.Paths, filepath.ToSlash(rel))
				}
				got = append(got, g)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("GPUs:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestAMDGFXTarget(t *testing.T) {
	tests := []struct {
		v    uint64
		want string
	}{
		{90010, "gfx90a"},
		{90008, "gfx908"},
		{90402, "gfx942"},
		{100300, "gfx1030"},
		{110000, "gfx1100"},
		{120001, "gfx1201"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			if got := gfxTarget(tc.v); got != tc.want {
				t.Errorf("gfxTarget(%d) = %q, want %q", tc.v, got, tc.want)
			}
		})
	}
}

func TestAMDKFDPCIAddress(t *testing.T) {
	tests := []struct {
		domain, location uint64
		want             string
	}{
		{0, 0x0300, "0000:03:00.0"},
		{0, 0x8300, "0000:83:00.0"},
		{0, 0x0311, "0000:03:02.1"},
		{1, 0xc1ff, "0001:c1:1f.7"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			if got := kfdPCIAddress(tc.domain, tc.location); got != tc.want {
				t.Errorf("kfdPCIAddress(%d, %#x) = %q, want %q", tc.domain, tc.location, got, tc.want)
			}
		})
	}
}
