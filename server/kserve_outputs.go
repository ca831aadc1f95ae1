package server

import (
	"cmp"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/brokerd/brokerd/proto/inference"
)

// requestedOutputs reads ModelInferRequest.outputs: the names to return
// and, per name, Triton's classification count. An output asked for twice,
// or a parameter brokerd does not implement, is INVALID_ARGUMENT, as Triton
// answers, rather than a silently different result. The client chooses how
// many names it sends (millions fit in a message): at most the model's
// modelOutputs are read, one more being a repeat or too many, and repeats
// are found in a set, not by a scan of the names before each.
func requestedOutputs(outs []*inference.ModelInferRequest_InferRequestedOutputTensor, modelOutputs int) ([]string, map[string]int, error) {
	size := min(len(outs), modelOutputs+1)
	names := make([]string, 0, size)
	seen := make(map[string]bool, size)
	classes := map[string]int{}
	for i, o := range outs {
		name := o.GetName()
		if seen[name] {
			return nil, nil, status.Errorf(codes.InvalidArgument, "output %q is requested twice", name)
		}
		if i == modelOutputs {
			return nil, nil, status.Errorf(codes.InvalidArgument, "outputs: %d requested, more outputs than the model's %d; request each at most once", len(outs), modelOutputs)
		}
		seen[name] = true
		names = append(names, name)
		for pn, p := range o.GetParameters() {
			if pn != "classification" {
				return nil, nil, status.Errorf(codes.InvalidArgument, "output %q: parameter %q is not supported (brokerd implements classification)", name, pn)
			}
			n, ok := positiveParam(p)
			if !ok {
				return nil, nil, status.Errorf(codes.InvalidArgument, "output %q: parameter classification: want a positive int64_param or uint64_param, the number of classes to return", name)
			}
			classes[name] = n
		}
	}
	return names, classes, nil
}

// maxClassCount bounds a classification request (a class count is a
// client's number, not a size brokerd allocates blindly).
const maxClassCount = 1 << 16

func positiveParam(p *inference.InferParameter) (int, bool) {
	var n int64
	switch c := p.GetParameterChoice().(type) {
	case *inference.InferParameter_Int64Param:
		n = c.Int64Param
	case *inference.InferParameter_Uint64Param:
		if c.Uint64Param > maxClassCount {
			return maxClassCount, true
		}
		n = int64(c.Uint64Param)
	default:
		return 0, false
	}
	if n < 1 {
		return 0, false
	}
	return int(min(n, maxClassCount)), true
}

// classify turns an FP32 output [rows, classes] (or [classes]) into
// Triton's classification result: BYTES [rows, k] of "value:index", the k
// highest values of each row, highest first (ties: lower index first);
// "value:index:label" when the model names a label per class, as Triton
// does with a model's label file.
func classify(t tensor, k int, labels []string) (tensor, error) {
	if t.dtype != "FP32" || len(t.shape) == 0 || len(t.shape) > 2 {
		return t, status.Errorf(codes.InvalidArgument, "output %q: classification needs an FP32 output of shape [classes] or [rows, classes]; it is %s %v", t.name, t.dtype, t.shape)
	}
	vals := float32s(t.data)
	classes := int(t.shape[len(t.shape)-1])
	if classes == 0 {
		return t, status.Errorf(codes.InvalidArgument, "output %q has no classes", t.name)
	}
	rows := len(vals) / classes
	k = min(k, classes)
	if len(labels) != classes {
		labels = nil
	}
	elems := make([][]byte, 0, rows*k)
	idx := make([]int, classes)
	for r := range rows {
		row := vals[r*classes : (r+1)*classes]
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(row[b], row[a]) })
		for _, i := range idx[:k] {
			e := strconv.AppendFloat(nil, float64(row[i]), 'f', 6, 32)
			e = append(e, ':')
			e = strconv.AppendInt(e, int64(i), 10)
			if labels != nil {
				e = append(append(e, ':'), labels[i]...)
			}
			elems = append(elems, e)
		}
	}
	shape := []int64{int64(k)}
	if len(t.shape) == 2 {
		shape = []int64{int64(rows), int64(k)}
	}
	return tensor{name: t.name, dtype: "BYTES", shape: shape, data: joinBytes(elems)}, nil
}

// maxTimeoutUS caps the timeout parameter (2^40 µs, about 12.7 days:
// longer than any call is kept). A Duration counts nanoseconds in an
// int64, so a larger count of microseconds would wrap, to a few hundred
// nanoseconds or to a negative timeout, taken as none.
const maxTimeoutUS = 1 << 40

// requestTimeout reads Triton's timeout request parameter (microseconds).
func requestTimeout(p *inference.InferParameter) (time.Duration, error) {
	var us int64
	switch c := p.GetParameterChoice().(type) {
	case *inference.InferParameter_Int64Param:
		us = c.Int64Param
	case *inference.InferParameter_Uint64Param:
		us = int64(min(c.Uint64Param, maxTimeoutUS))
	default:
		return 0, status.Error(codes.InvalidArgument, "parameter timeout: want an int64_param or uint64_param in microseconds")
	}
	if us < 0 {
		return 0, status.Errorf(codes.InvalidArgument, "parameter timeout %d is invalid: microseconds, 0 for none", us)
	}
	return time.Duration(min(us, maxTimeoutUS)) * time.Microsecond, nil
}
