package detect

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestScanPCI(t *testing.T) {
	tests := []struct {
		name    string
		host    string
		vendors []uint16
		want    []PCIDevice // Path is not compared
		notes   []string
	}{
		{
			name: "symlinked sysfs, all vendors", host: "tpu-v4",
			want: []PCIDevice{
				{Address: "0000:00:00.0", Vendor: 0x8086, Device: 0x1237, SubsystemVendor: 0x1af4, SubsystemDevice: 0x1100, Class: 0x060000, NUMANode: -1, IOMMUGroup: "0"},
				{Address: "0000:00:01.0", Vendor: 0x8086, Device: 0x7110, SubsystemVendor: 0x1af4, SubsystemDevice: 0x1100, Class: 0x060100, NUMANode: -1, IOMMUGroup: "1"},
				{Address: "0000:00:03.0", Vendor: 0x1ae0, Device: 0x0042, SubsystemVendor: 0x1ae0, SubsystemDevice: 0x0058, Class: 0x020000, NUMANode: -1, IOMMUGroup: "2"},
				{Address: "0000:00:04.0", Vendor: 0x1ae0, Device: 0x005e, SubsystemVendor: 0x1ae0, Class: 0xff0000, NUMANode: 0, IOMMUGroup: "3"},
				{Address: "0000:00:05.0", Vendor: 0x1ae0, Device: 0x005e, SubsystemVendor: 0x1ae0, Class: 0xff0000, NUMANode: 0, IOMMUGroup: "4"},
				{Address: "0000:00:06.0", Vendor: 0x1ae0, Device: 0x005e, SubsystemVendor: 0x1ae0, Class: 0xff0000, NUMANode: 0, IOMMUGroup: "5"},
				{Address: "0000:00:07.0", Vendor: 0x1ae0, Device: 0x005e, SubsystemVendor: 0x1ae0, Class: 0xff0000, NUMANode: 0, IOMMUGroup: "6"},
			},
		},
		{
			name: "plain directories, one vendor", host: "coral", vendors: []uint16{PCIVendorGlobalUnichip},
			want: []PCIDevice{
				{Address: "0000:03:00.0", Vendor: 0x1ac1, Device: 0x089a, SubsystemVendor: 0x1ac1, SubsystemDevice: 0x089a, Class: 0x0880ff, NUMANode: -1, IOMMUGroup: "9"},
				{Address: "0000:04:00.0", Vendor: 0x1ac1, Device: 0x089a, SubsystemVendor: 0x1ac1, SubsystemDevice: 0x089a, Class: 0x0880ff, NUMANode: -1, IOMMUGroup: "10"},
			},
		},
		{name: "vendor absent", host: "coral", vendors: []uint16{PCIVendorGoogle}},
		{name: "no PCI bus", host: "cpu-cgroup-v1"},
		{
			name: "broken entries are skipped or left unknown", host: "broken",
			want: []PCIDevice{
				{Address: "0000:00:05.0", Vendor: 0x1ae0, Device: 0x005e, SubsystemVendor: 0x1ae0, Class: 0xff0000, NUMANode: -1, IOMMUGroup: "4"},
				{Address: "0000:00:06.0", Vendor: 0x1ae0, Device: 0x0027, SubsystemVendor: 0x1ae0, Class: 0xff0000, NUMANode: 0, IOMMUGroup: "5"},
				{Address: "0000:00:0a.0", Vendor: 0x1ac1, Device: 0x089a, SubsystemVendor: 0x1ac1, SubsystemDevice: 0x089a, NUMANode: -1},
			},
			notes: []string{
				"Skipped PCI device 0000:00:04.0", "0000:00:05.0/numa_node", "Skipped PCI device 0000:00:07.0",
				"Skipped PCI device 0000:00:08.0", "Skipped PCI device 0000:00:09.0", "not-a-device",
				"0000:00:0a.0/class has malformed contents \"garbage\"",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, notes := ScanPCI(context.Background(), hwRoots(tc.host), tc.vendors...)
			hwCheckNotes(t, notes, tc.notes)
			for i := range got {
				if !strings.HasSuffix(got[i].Path, got[i].Address) {
					t.Errorf("%s: path %s", got[i].Address, got[i].Path)
				}
				got[i].Path = ""
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ScanPCI:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestScanPCICancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	got, notes := ScanPCI(ctx, hwRoots("tpu-v5e"))
	if len(got) != 0 {
		t.Errorf("cancelled scan returned %d devices", len(got))
	}
	hwCheckNotes(t, notes, []string{"stopped early"})
}

func TestPCIAddressLess(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"0000:00:04.0", "0000:00:05.0", true},
		{"0000:00:05.0", "0000:00:04.0", false},
		{"0000:00:1f.0", "0000:01:00.0", true},
		{"0000:00:04.1", "0000:00:04.0", false},
		{"0000:ff:00.0", "10000:00:00.0", true}, // VMD domain sorts after domain 0 numerically
		{"0001:00:00.0", "0000:ff:1f.7", false},
	}
	for _, tc := range tests {
		t.Run(tc.a+"<"+tc.b, func(t *testing.T) {
			if got := pciAddressLess(tc.a, tc.b); got != tc.want {
				t.Errorf("pciAddressLess(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.want)
			}
		})
	}
}

func TestPCIReadSysfsValues(t *testing.T) {
	tests := []struct {
		name    string
		content string
		hex     uint64
		hexErr  bool
		numa    int
		numaErr bool
	}{
		{"vendor", "0x1ae0\n", 0x1ae0, false, -1, true},
		{"upper case", "0X1AE0\n", 0x1ae0, false, -1, true},
		{"numa node", "1\n", 1, false, 1, false},
		{"no numa", "-1\n", 0, true, -1, false},
		{"below -1", "-5\n", 0, true, -1, true},
		{"too wide for 16 bits", "0x12345\n", 0, true, -1, true},
		{"garbage", "banana\n", 0, true, -1, true},
		{"empty", "", 0, true, -1, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "attr")
			hwWrite(t, p, tc.content)
			h, err := readSysfsHex(p, 16)
			if (err != nil) != tc.hexErr || h != tc.hex {
				t.Errorf("readSysfsHex = %#x, %v; want %#x, error %v", h, err, tc.hex, tc.hexErr)
			}
			if err != nil && !errors.Is(err, errMalformed) {
				t.Errorf("readSysfsHex error %v does not wrap errMalformed", err)
			}
			n, err := readSysfsNUMANode(p)
			if (err != nil) != tc.numaErr || n != tc.numa {
				t.Errorf("readSysfsNUMANode = %d, %v; want %d, error %v", n, err, tc.numa, tc.numaErr)
			}
		})
	}
	if _, err := readSysfsHex(filepath.Join(t.TempDir(), "missing"), 16); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: error %v does not wrap os.ErrNotExist", err)
	}
}
