package server

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/brokerd/brokerd/proto/inference"
)

// TestTritonPriority pins the mapping of Triton's request priority (1 the
// highest, larger lower, 0 the model's default) onto brokerd's levels
// (3 high, 2 normal, 1 low).
func TestTritonPriority(t *testing.T) {
	u := func(n uint64) *inference.InferParameter {
		return &inference.InferParameter{ParameterChoice: &inference.InferParameter_Uint64Param{Uint64Param: n}}
	}
	tests := []struct {
		name string
		p    *inference.InferParameter
		want int
		code codes.Code
	}{
		{"0 is the default", u(0), 2, codes.OK},
		{"1 is the highest", u(1), 3, codes.OK},
		{"2", u(2), 2, codes.OK},
		{"3 is low", u(3), 1, codes.OK},
		{"larger is low too", u(1 << 40), 1, codes.OK},
		{"int64 accepted", &inference.InferParameter{ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: 1}}, 3, codes.OK},
		{"negative", &inference.InferParameter{ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: -1}}, 0, codes.InvalidArgument},
		{"a string", &inference.InferParameter{ParameterChoice: &inference.InferParameter_StringParam{StringParam: "high"}}, 0, codes.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := inferOptions{priority: 2}
			_, err := inferParameters(map[string]*inference.InferParameter{"priority": tc.p}, &opts)
			if status.Code(err) != tc.code {
				t.Fatalf("err %v, want %v", err, tc.code)
			}
			if err == nil && opts.priority != tc.want {
				t.Errorf("level %d, want %d", opts.priority, tc.want)
			}
		})
	}
}
