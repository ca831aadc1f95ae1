package pjrt

import (
	"testing"

	"github.com/brokerd/brokerd/runtime"
)

func TestProto(t *testing.T) {
	g := &runtime.Graph{Ops: []runtime.Op{
		{Kind: runtime.OpMatMul, In: []string{"x", "w", "b"}, Out: "y", Act: runtime.ActGELU, TransB: true},
		{Kind: runtime.OpMaskedSoftmax, In: []string{"y", "m"}, Out: "z"},
		{Kind: runtime.OpGather, In: []string{"tab", "ids"}, Out: "e"},
		{Kind: runtime.OpMaskedMeanPool, In: []string{"e", "m2"}, Out: "p"},
	}}
	p, err := Lower(g, map[string]TensorType{
		"x": {runtime.F32, []int{2, 3}}, "w": {runtime.F32, []int{4, 3}}, "b": {runtime.F32, []int{4}},
		"m": {runtime.I32, []int{2, 4}}, "z": {runtime.F32, []int{2, 4}},
		"tab": {runtime.F32, []int{10, 5}}, "ids": {runtime.I32, []int{2, 3}}, "m2": {runtime.F32, []int{2, 3}}, "p": {runtime.F32, []int{2, 5}},
	}, LowerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", p.Text)
}
