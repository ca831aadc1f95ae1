package pjrt

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/hashenc"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/onednn"
)

// Environment of TestAgainstCPU, which runs only where a plugin exists.
const (
	envPlugin = "BROKERD_PJRT_PLUGIN" // path of the plugin .so
	envDevice = "BROKERD_PJRT_DEVICE" // brokerd device ID; gpu:0 when unset
	envTolF32 = "BROKERD_PJRT_TOL_F32"
)

// TestAgainstCPU runs every op case and every model kind on a PJRT device
// and on the oneDNN CPU device with the same weights and inputs, and checks
// the norm-wise relative error: below 1e-4 in fp32 (BROKERD_PJRT_TOL_F32
// changes it; f32 matmuls ask for HIGHEST precision, so TF32 should not
// apply), below 1e-2 with the PJRT device in bf16 against the CPU in fp32.
// The hash encoder's replica self-check on the device must pass: its matmul
// is exact in fp32.
//
//	BROKERD_PJRT_PLUGIN=/…/jax_plugins/xla_cuda12/xla_cuda_plugin.so go test -run TestAgainstCPU -v ./runtime/pjrt
func TestAgainstCPU(t *testing.T) {
	plugin := os.Getenv(envPlugin)
	if plugin == "" {
		t.Skipf("%s is unset: no PJRT plugin to compare with the CPU", envPlugin)
	}
	id := os.Getenv(envDevice)
	if id == "" {
		id = "gpu:0"
	}
	tol32 := 1e-4
	if s := os.Getenv(envTolF32); s != "" {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("%s: %v", envTolF32, err)
		}
		tol32 = v
	}
	typ, _, err := ParseDeviceID(id)
	if err != nil {
		t.Fatal(err)
	}
	name := "cuda"
	if typ == runtime.DeviceTPU {
		name = "tpu"
	}
	ctx := context.Background()
	a := New(AdapterOptions{Discovery: Options{Plugins: map[string]string{name: plugin}, SitePackages: []string{},
		Getenv: func(string) string { return "" }}})
	info, err := a.Describe(ctx, typ)
	if err != nil {
		t.Fatalf("Describe: %v", err)
	}
	t.Logf("plugin %s: PJRT API %s, platform %s %s, attributes %v", info.Path, info.APIVersion, info.Platform, info.PlatformVersion, info.Attributes)
	for _, d := range info.Devices {
		t.Logf("device %d: id %d hw %d %q %v", d.Index, d.ID, d.LocalHardwareID, d.Kind, d.Attributes)
	}
	open := func(dt runtime.DType) runtime.Device {
		d, err := a.Open(ctx, runtime.DeviceSpec{ID: id, DType: dt})
		if err != nil {
			t.Fatalf("Open %s (%s): %v", id, dt, err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	dev, dev16 := open(runtime.F32), open(runtime.BF16)
	cpu, err := onednn.New(onednn.Options{}).Open(ctx, runtime.DeviceSpec{ID: "cpu:0"})
	if err != nil {
		t.Fatalf("open the CPU: %v", err)
	}
	t.Cleanup(func() { cpu.Close() })

	t.Run("ops", func(t *testing.T) {
		for _, c := range loweringCases() {
			t.Run(c.name, func(t *testing.T) {
				bf := false
				for _, tt := range c.bound {
					bf = bf || tt.DType == runtime.BF16
				}
				if bf && onednn.BF16Support() != nil {
					t.Skipf("no bf16 on this CPU to compare with: %v", onednn.BF16Support())
				}
				inputs := opInputs(c, rand.New(rand.NewPCG(1, 2)))
				want := runOp(t, cpu, c, inputs)
				got := runOp(t, dev, c, inputs)
				tol := tol32
				if bf {
					tol = 1e-2
				}
				if e := relErr(got, want); !(e < tol) {
					t.Errorf("relative error %.3g, want below %g", e, tol)
				}
			})
		}
	})

	texts := make([][]byte, 20)
	for i := range texts {
		texts[i] = []byte(strings.Repeat("brokerd runs the hash encoder on a PJRT device ", 1+i%5) + strconv.Itoa(i))
	}
	t.Run("hash encoder", func(t *testing.T) {
		m := hashenc.New()
		for _, norm := range []bool{false, true} {
			in := make([]any, len(texts))
			for i, x := range texts {
				in[i] = hashenc.Input{Data: x, Normalize: norm}
			}
			newReplica := func(d runtime.Device) (models.Replica, error) {
				r, err := m.NewReplica(ctx, d)
				if err != nil {
					return nil, err
				}
				return r, nil
			}
			want := execute(t, cpu, newReplica, in)
			got := execute(t, dev, newReplica, in)
			compare(t, got, want, 1e-6)
		}
	})

	cfg := models.BERTConfig{VocabSize: 300, HiddenSize: 64, NumHiddenLayers: 2, NumAttentionHeads: 4,
		IntermediateSize: 256, MaxPositionEmbeddings: 128}
	weights := tinyBERT(cfg, 3, 11)
	rng := rand.New(rand.NewPCG(3, 4))
	seqs := make([]any, 24)
	for i := range seqs {
		ids := make([]int32, 2+rng.IntN(100))
		for j := range ids {
			ids[j] = int32(1 + rng.IntN(cfg.VocabSize-1))
		}
		seqs[i] = models.TextInput{IDs: ids, TypeIDs: make([]int32, len(ids)), Normalize: i%2 == 0}
	}
	spec, mlpWeights := tinyMLP(5)
	rows := make([]any, 40)
	for i := range rows {
		v := make([]float32, spec.InputDim)
		for j := range v {
			v[j] = float32(rng.NormFloat64())
		}
		rows[i] = models.RowInput{Values: v}
	}
	for _, tt := range []struct {
		name  string
		model func(t *testing.T) models.Model
		in    []any
	}{
		{"mlp", func(t *testing.T) models.Model {
			m, err := models.NewMLP(spec, mlpWeights)
			if err != nil {
				t.Fatal(err)
			}
			return m
		}, rows},
		{"bert encoder", bertModel(cfg, weights, models.KindBERT), seqs},
		{"bert classifier", bertModel(cfg, weights, models.KindBERTClassifier), seqs},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := tt.model(t)
			newReplica := func(d runtime.Device) (models.Replica, error) { return m.NewReplica(ctx, d, 8) }
			want := execute(t, cpu, newReplica, tt.in)
			compare(t, execute(t, dev, newReplica, tt.in), want, tol32)
			t.Run("bf16", func(t *testing.T) {
				compare(t, execute(t, dev16, newReplica, tt.in), want, 1e-2)
			})
		})
	}
}

func bertModel(cfg models.BERTConfig, w map[string]models.Tensor, kind models.Kind) func(t *testing.T) models.Model {
	return func(t *testing.T) models.Model {
		m, err := models.NewBERT(cfg, w, nil, models.BERTOptions{Name: "cmp", Kind: kind})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
}

// execute runs the inputs on a new replica on d and returns each output.
func execute(t *testing.T, d runtime.Device, newReplica func(runtime.Device) (models.Replica, error), in []any) [][]float32 {
	t.Helper()
	r, err := newReplica(d)
	if err != nil {
		t.Fatalf("replica on %s: %v", d.ID(), err)
	}
	defer r.Close()
	out, err := r.Execute(context.Background(), in)
	if err != nil {
		t.Fatalf("Execute on %s: %v", d.ID(), err)
	}
	vecs := make([][]float32, len(out))
	for i, o := range out {
		switch v := o.(type) {
		case []float32:
			vecs[i] = v
		case models.Output:
			vecs[i] = v.Values
		default:
			t.Fatalf("output %d is %T", i, o)
		}
	}
	return vecs
}

func compare(t *testing.T, got, want [][]float32, tol float64) {
	t.Helper()
	worst := 0.0
	for i := range want {
		w := make([]float64, len(want[i]))
		for j, v := range want[i] {
			w[j] = float64(v)
		}
		e := relErr(got[i], w)
		worst = max(worst, e)
		if !(e < tol) {
			t.Errorf("item %d: relative error %.3g, want below %g", i, e, tol)
		}
	}
	t.Logf("worst relative error %.3g over %d items", worst, len(want))
}

// opInputs makes random values for a case's inputs: token ids within the
// table, masks of 0 and 1 with the first row all masked.
func opInputs(c loweringCase, rng *rand.Rand) map[string][]float32 {
	out := map[string][]float32{}
	for name, tt := range c.bound {
		if name == "y" && c.op.Kind != runtime.OpKVWrite { // a KV cache is read as well as written
			continue
		}
		n := 1
		for _, d := range tt.Shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			switch name {
			case "ids":
				v[i] = float32(rng.IntN(c.bound["table"].Shape[0]))
			case "slots": // distinct (which of two rows wins a slot is unspecified on XLA), the first skipped
				v[i] = float32(i - 1)
			case "table":
				if kc, ok := c.bound["kc"]; ok { // paged attention's block table
					v[i] = float32(rng.IntN(kc.Shape[0]))
				} else { // a gather's table
					v[i] = float32(rng.NormFloat64())
				}
			case "seq":
				v[i] = float32(rng.IntN(c.bound["table"].Shape[0]))
			case "pos":
				limit := 1 << 15 // rope: any position
				if kc, ok := c.bound["kc"]; ok {
					limit = c.bound["table"].Shape[1] * kc.Shape[1]
				}
				v[i] = float32(rng.IntN(limit))
			case "m":
				if i >= tt.Shape[len(tt.Shape)-1] && rng.IntN(3) > 0 {
					v[i] = 1
				}
			default:
				v[i] = float32(rng.NormFloat64())
			}
		}
		out[name] = v
	}
	return out
}

// runOp runs one case's op on d and returns its output.
func runOp(t *testing.T, d runtime.Device, c loweringCase, inputs map[string][]float32) []float32 {
	t.Helper()
	ctx := context.Background()
	bind := map[string]runtime.Buffer{}
	for name, tt := range c.bound {
		b, err := d.Alloc(tt.DType, tt.Shape...)
		if err != nil {
			t.Fatalf("%s: Alloc %s: %v", d.ID(), name, err)
		}
		defer d.Free(b)
		bind[name] = b
		v, ok := inputs[name]
		if !ok {
			continue
		}
		if tt.DType == runtime.I32 {
			ints := make([]int32, len(v))
			for i, x := range v {
				ints[i] = int32(x)
			}
			err = d.CopyInInt32(ctx, b, ints)
		} else {
			err = d.CopyIn(ctx, b, v)
		}
		if err != nil {
			t.Fatalf("%s: CopyIn %s: %v", d.ID(), name, err)
		}
	}
	if err := d.Run(ctx, &runtime.Graph{Ops: []runtime.Op{c.op}}, bind); err != nil {
		t.Fatalf("%s: Run: %v", d.ID(), err)
	}
	y := c.bound["y"]
	out := make([]float32, slices.Max([]int{1, numel(y.Shape)}))
	if err := d.CopyOut(ctx, out, bind["y"]); err != nil {
		t.Fatalf("%s: CopyOut: %v", d.ID(), err)
	}
	return out
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// relErr is the norm-wise relative error ‖got−want‖₂ / ‖want‖₂ (absolute
// when want is zero), as runtime/onednn's tests measure.
func relErr[W float32 | float64](got []float32, want []W) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var num, den float64
	for i := range got {
		diff := float64(got[i]) - float64(want[i])
		if math.IsNaN(diff) {
			return math.Inf(1)
		}
		num += diff * diff
		den += float64(want[i]) * float64(want[i])
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}
