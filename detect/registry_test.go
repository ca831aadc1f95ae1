package detect

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func regGPU(index int, uuid string) Device {
	return Device{Type: TypeGPU, Index: index, UUID: uuid, Name: "NVIDIA H100 80GB HBM3"}
}

func regTPU(index int, pci string) Device {
	return Device{Type: TypeTPU, Index: index, PCIBusID: pci}
}

func regIDs(devs []Device) map[string]string {
	out := map[string]string{}
	for i := range devs {
		out[devs[i].StableKey()] = devs[i].ID
	}
	return out
}

func TestRegistryAssign(t *testing.T) {
	tests := []struct {
		name   string
		rounds [][]Device
		want   []map[string]string // per round: stable key → device ID
		lookup map[string]string   // at the end: stable key → reserved ID
	}{
		{
			name:   "first start follows enumeration order whatever the input order",
			rounds: [][]Device{{regGPU(2, "C"), regGPU(0, "A"), {Type: TypeCPU}, regGPU(1, "B"), regTPU(0, "0000:00:04.0")}},
			want: []map[string]string{{
				"uuid:A": "gpu:0", "uuid:B": "gpu:1", "uuid:C": "gpu:2", "cpu:0": "cpu:0", "pci:0000:00:04.0": "tpu:0",
			}},
		},
		{
			name: "re-enumerated devices keep their IDs",
			rounds: [][]Device{
				{regGPU(0, "A"), regGPU(1, "B")},
				{regGPU(0, "B"), regGPU(1, "A")},
			},
			want: []map[string]string{
				{"uuid:A": "gpu:0", "uuid:B": "gpu:1"},
				{"uuid:A": "gpu:0", "uuid:B": "gpu:1"},
			},
		},
		{
			name: "a missing device keeps its reservation and a new one takes the lowest free",
			rounds: [][]Device{
				{regGPU(0, "A"), regGPU(1, "B"), regGPU(2, "C")},
				{regGPU(0, "A"), regGPU(1, "C"), regGPU(2, "D")}, // B gone, D new
				{regGPU(0, "A"), regGPU(1, "B"), regGPU(2, "C"), regGPU(3, "D")},
			},
			lookup: map[string]string{"uuid:A": "gpu:0", "uuid:B": "gpu:1", "uuid:C": "gpu:2", "uuid:D": "gpu:3"},
			want: []map[string]string{
				{"uuid:A": "gpu:0", "uuid:B": "gpu:1", "uuid:C": "gpu:2"},
				{"uuid:A": "gpu:0", "uuid:C": "gpu:2", "uuid:D": "gpu:3"},
				{"uuid:A": "gpu:0", "uuid:B": "gpu:1", "uuid:C": "gpu:2", "uuid:D": "gpu:3"},
			},
		},
		{
			name: "numbering is per type",
			rounds: [][]Device{
				{regTPU(1, "0000:00:05.0"), regGPU(0, "A"), regTPU(0, "0000:00:04.0")},
			},
			want: []map[string]string{{"uuid:A": "gpu:0", "pci:0000:00:04.0": "tpu:0", "pci:0000:00:05.0": "tpu:1"}},
		},
		{
			name: "two devices with one identity get distinct IDs",
			rounds: [][]Device{
				{regGPU(0, "A"), regGPU(1, "A")},
			},
			want:   []map[string]string{{}},
			lookup: map[string]string{"uuid:A": "gpu:0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := OpenRegistry("", nil)
			if err != nil {
				t.Fatal(err)
			}
			for i, devs := range tt.rounds {
				if err := r.Assign(devs); err != nil {
					t.Fatal(err)
				}
				seen := map[string]bool{}
				for _, d := range devs {
					if d.ID == "" || seen[d.ID] {
						t.Fatalf("round %d: empty or duplicate ID in %v", i, devs)
					}
					seen[d.ID] = true
				}
				got := regIDs(devs)
				for k, v := range tt.want[i] {
					if got[k] != v {
						t.Errorf("round %d: %s got %q, want %q (all %v)", i, k, got[k], v, got)
					}
				}
			}
			for k, v := range tt.lookup {
				if id, ok := r.Lookup(k); !ok || id != v {
					t.Errorf("Lookup(%s) = %q, %v; want %q", k, id, ok, v)
				}
			}
		})
	}
}

func TestRegistryPersistsAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	r1, err := OpenRegistry(dir, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	first := []Device{regGPU(0, "A"), regGPU(1, "B"), regTPU(0, "0000:00:04.0"), {Type: TypeCPU}}
	if err := r1.Assign(first); err != nil {
		t.Fatal(err)
	}
	before := regIDs(first)

	// The file is valid JSON, complete, and no temp file is left behind.
	data, err := os.ReadFile(filepath.Join(dir, RegistryFile))
	if err != nil {
		t.Fatal(err)
	}
	var f registryFileV1
	if err := json.Unmarshal(data, &f); err != nil || len(f.Devices) != 4 || f.Version != 1 {
		t.Fatalf("file = %s (err %v)", data, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, RegistryFile+".tmp-*")); len(left) != 0 {
		t.Errorf("temp files left: %v", left)
	}

	// "Restart": a new registry on the same dir sees the devices re-enumerated
	// in another order, with a new GPU among them.
	r2, err := OpenRegistry(dir, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	second := []Device{{Type: TypeCPU}, regTPU(0, "0000:00:04.0"), regGPU(0, "NEW"), regGPU(1, "B"), regGPU(2, "A")}
	if err := r2.Assign(second); err != nil {
		t.Fatal(err)
	}
	after := regIDs(second)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s: ID %q after restart, was %q", k, after[k], v)
		}
	}
	if after["uuid:NEW"] != "gpu:2" {
		t.Errorf("new GPU got %q, want gpu:2", after["uuid:NEW"])
	}
	if id, ok := r2.Lookup("uuid:NEW"); !ok || id != "gpu:2" {
		t.Errorf("Lookup(uuid:NEW) = %q, %v", id, ok)
	}
}

func TestRegistryCorruptFileIsMovedAside(t *testing.T) {
	tests := []struct {
		name string
		body string
	}{
		{"not json", "{not json"},
		{"truncated", `{"version":1,"devices":[{"key":"uuid:A","id":"gpu:0"`},
		{"unknown version", `{"version":7,"devices":[]}`},
		{"duplicate id", `{"version":1,"devices":[{"key":"uuid:A","id":"gpu:0"},{"key":"uuid:B","id":"gpu:0"}]}`},
		{"malformed id", `{"version":1,"devices":[{"key":"uuid:A","id":"gpu-zero"}]}`},
		{"missing key", `{"version":1,"devices":[{"id":"gpu:0"}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, RegistryFile)
			if err := os.WriteFile(path, []byte(tt.body), 0o600); err != nil {
				t.Fatal(err)
			}
			core, logs := observer.New(zapcore.WarnLevel)
			r, err := OpenRegistry(dir, zap.New(core))
			if err != nil {
				t.Fatal(err)
			}
			aside, _ := filepath.Glob(path + ".corrupt-*")
			if len(aside) != 1 {
				t.Fatalf("moved-aside files = %v, want one", aside)
			}
			if got, _ := os.ReadFile(aside[0]); string(got) != tt.body {
				t.Errorf("moved-aside file holds %q, want the original", got)
			}
			warns := logs.FilterMessageSnippet("corrupt").All()
			if len(warns) != 1 || warns[0].Level != zapcore.WarnLevel {
				t.Fatalf("warn lines = %v, want one", logs.All())
			}
			if got := warns[0].ContextMap()["moved_to"]; got != aside[0] {
				t.Errorf("log moved_to = %v, want %s", got, aside[0])
			}

			// Rebuilt from scratch on the next assignment.
			devs := []Device{regGPU(0, "B"), regGPU(1, "A")}
			if err := r.Assign(devs); err != nil {
				t.Fatal(err)
			}
			if devs[0].ID != "gpu:0" || devs[1].ID != "gpu:1" {
				t.Errorf("IDs after rebuild = %s, %s", devs[0].ID, devs[1].ID)
			}
			if _, err := OpenRegistry(dir, zap.New(core)); err != nil {
				t.Fatal(err)
			}
			if n := logs.FilterMessageSnippet("corrupt").Len(); n != 1 {
				t.Errorf("rebuilt file reported corrupt again (%d warn lines)", n)
			}
		})
	}
}

func TestRegistryUnreadableFileIsAnError(t *testing.T) {
	dir := t.TempDir()
	// A directory where the file should be cannot be read and must not be
	// silently moved aside.
	if err := os.Mkdir(filepath.Join(dir, RegistryFile), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenRegistry(dir, nil); err == nil {
		t.Fatal("OpenRegistry succeeded on an unreadable registry")
	}
}

func TestRegistryWriteFailureKeepsIDs(t *testing.T) {
	dir := t.TempDir()
	r, err := OpenRegistry(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Removing the state dir makes the write fail.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	devs := []Device{regGPU(0, "A")}
	err = r.Assign(devs)
	if err == nil || !strings.Contains(err.Error(), "registry") {
		t.Fatalf("Assign err = %v, want a registry write error", err)
	}
	if devs[0].ID != "gpu:0" {
		t.Errorf("ID = %q, want gpu:0 despite the write error", devs[0].ID)
	}
}

func TestRegistryConcurrentAssign(t *testing.T) {
	dir := t.TempDir()
	r, err := OpenRegistry(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make([][]Device, 16)
	for g := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every goroutine sees the same devices in a different order.
			devs := []Device{regGPU(0, "A"), regGPU(1, "B"), regGPU(2, "C")}
			devs[0], devs[g%3] = devs[g%3], devs[0]
			if err := r.Assign(devs); err != nil {
				t.Error(err)
			}
			results[g] = devs
		}()
	}
	wg.Wait()
	want := regIDs(results[0])
	for g, devs := range results {
		got := regIDs(devs)
		for k, v := range want {
			if got[k] != v {
				t.Errorf("goroutine %d: %s = %q, want %q", g, k, got[k], v)
			}
		}
	}
	r2, err := OpenRegistry(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		if id, _ := r2.Lookup(k); id != v {
			t.Errorf("persisted %s = %q, want %q", k, id, v)
		}
	}
}
