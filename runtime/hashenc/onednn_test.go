package hashenc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/onednn"
)

// isaEnv is set in the child process of TestOneDNNAcrossISAs.
const isaEnv = "HASHENC_TEST_ISA_CHILD"

func openOneDNN(t testing.TB, threads int) runtime.Device {
	t.Helper()
	dev, err := onednn.New(onednn.Options{}).Open(context.Background(), runtime.DeviceSpec{ID: "cpu:0", Threads: threads})
	if err != nil {
		t.Fatalf("open oneDNN cpu:0: %v", err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

func itemsAsAny(items []Input) []any {
	in := make([]any, len(items))
	for i, it := range items {
		in[i] = it
	}
	return in
}

// TestOneDNNMatchesFake runs the encoder on the real oneDNN device: vectors
// are the same twice, alone and in a batch of 64 mixed items, and bit for
// bit those of the plain-Go fake device and the host reference.
func TestOneDNNMatchesFake(t *testing.T) {
	m := New()
	for _, threads := range []int{1, 0} {
		t.Run(fmt.Sprint("threads", threads), func(t *testing.T) {
			r := newTestReplica(t, m, openOneDNN(t, threads))
			t.Logf("oneDNN %s, max ISA %s, normalises on device: %v",
				onednn.LibraryVersion(), onednn.MaxISA(), r.NormalizesOnDevice())
			if !r.NormalizesOnDevice() {
				t.Error("oneDNN's L2 normalisation no longer follows the float64 recipe; vectors fall back to host normalisation")
			}
			fake := newTestReplica(t, m, newFakeDevice(0, orderBlocked))
			items := mixedItems(64, 64)
			batch := execute(t, r, itemsAsAny(items))
			again := execute(t, r, itemsAsAny(items))
			want := execute(t, fake, itemsAsAny(items))
			for i, it := range items {
				alone := execute(t, r, []any{it})[0]
				for _, c := range []struct {
					name string
					v    []float32
				}{{"again", again[i]}, {"alone", alone}, {"fake device", want[i]}} {
					if d, ok := bitsEqual(batch[i], c.v); !ok {
						t.Errorf("item %d (normalize %v): dimension %d: batch %v, %s %v",
							i, it.Normalize, d, batch[i][d], c.name, c.v[d])
					}
				}
			}
		})
	}
}

// TestOneDNNL2NormalizeRowDeterministic checks what the encoder needs of the
// adapter's own OpL2Normalize when it is used: a row's result does not
// depend on the rows around it.
func TestOneDNNL2NormalizeRowDeterministic(t *testing.T) {
	dev := openOneDNN(t, 0)
	ctx := context.Background()
	g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpL2Normalize, In: []string{"y"}, Out: "z"}}}
	m := New()
	items := mixedItems(64, 11)
	var rows [][Dim]float32
	for _, it := range items {
		h := Sparse(Featurize(it.Data))
		q, _ := Quantize(&h)
		rows = append(rows, m.matmulExact(&q))
	}
	run := func(rs [][Dim]float32) []float32 {
		t.Helper()
		y, err := dev.Alloc(runtime.F32, len(rs), Dim)
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Free(y)
		z, err := dev.Alloc(runtime.F32, len(rs), Dim)
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Free(z)
		var in []float32
		for _, r := range rs {
			in = append(in, r[:]...)
		}
		out := make([]float32, len(in))
		if err := dev.CopyIn(ctx, y, in); err != nil {
			t.Fatal(err)
		}
		if err := dev.Run(ctx, g, map[string]runtime.Buffer{"y": y, "z": z}); err != nil {
			t.Fatal(err)
		}
		if err := dev.CopyOut(ctx, out, z); err != nil {
			t.Fatal(err)
		}
		return out
	}
	batch := run(rows)
	recipe := 0
	for i := range rows {
		alone := run(rows[i : i+1])
		if d, ok := bitsEqual(batch[i*Dim:(i+1)*Dim], alone); !ok {
			t.Errorf("row %d: dimension %d normalised differently alone and in a batch", i, d)
		}
		if _, ok := bitsEqual(alone, l2NormalizeRow(rows[i][:])); ok {
			recipe++
		}
	}
	t.Logf("%d of %d rows normalised bit for bit as the package's float64 recipe", recipe, len(rows))
}

// TestOneDNNAcrossISAs re-runs the encoder in a child process with oneDNN
// limited to SSE4.1 (ONEDNN_MAX_CPU_ISA) and compares every vector's hash
// with this process's, which uses the CPU's widest ISA.
func TestOneDNNAcrossISAs(t *testing.T) {
	if os.Getenv(isaEnv) != "" {
		t.Skip("in the child")
	}
	if testing.Short() {
		t.Skip("runs a child process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOneDNNVectorHashes$", "-test.v")
	cmd.Env = append(os.Environ(), isaEnv+"=1", "ONEDNN_MAX_CPU_ISA=SSE41")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	child := map[string]string{}
	childISA := ""
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && f[0] == "vector":
			child[f[1]] = f[2]
		case len(f) == 2 && f[0] == "isa":
			childISA = f[1]
		}
	}
	if childISA == "" || childISA == onednn.MaxISA() {
		t.Skipf("the child ran with ISA %q, this process with %q: nothing to compare", childISA, onednn.MaxISA())
	}
	mine := vectorHashes(t)
	if len(child) != len(mine) {
		t.Fatalf("child reported %d vectors, want %d:\n%s", len(child), len(mine), out)
	}
	for k, v := range mine {
		if child[k] != v {
			t.Errorf("vector %s: %s here, %s with ONEDNN_MAX_CPU_ISA=SSE41", k, v, child[k])
		}
	}
	t.Logf("%d vectors equal on %s and %s", len(mine), onednn.MaxISA(), childISA)
}

// TestOneDNNVectorHashes prints the vector hashes for TestOneDNNAcrossISAs;
// it runs only in its child process.
func TestOneDNNVectorHashes(t *testing.T) {
	if os.Getenv(isaEnv) == "" {
		t.Skip("only in TestOneDNNAcrossISAs's child")
	}
	fmt.Printf("isa %s\n", onednn.MaxISA())
	for k, v := range vectorHashes(t) {
		fmt.Printf("vector %s %s\n", k, v)
	}
}

func vectorHashes(t *testing.T) map[string]string {
	r := newTestReplica(t, New(), openOneDNN(t, 0))
	items := mixedItems(64, 99)
	out := execute(t, r, itemsAsAny(items))
	h := make(map[string]string, len(out))
	for i, v := range out {
		h[fmt.Sprint(i)] = vectorHash(v)
	}
	return h
}
