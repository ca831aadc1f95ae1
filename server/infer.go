package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/brokerd/brokerd/lifecycle"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/scheduler"
)

// textModel is a repository model that tokenises text (bert and
// bert-classifier): Tokenize builds its scheduler payloads.
type textModel interface {
	Tokenize(ctx context.Context, text, pair string, truncate, normalize bool) (models.TextInput, error)
}

// Input names of text models.
const (
	inputText     = "text"
	inputTextPair = "text_pair"
)

// inputSpecs are the inputs a model takes: its metadata's, and for a
// classifier the optional second segment of pairs.
func inputSpecs(info models.Info) (required, optional []models.TensorSpec) {
	required = info.Inputs
	if info.Kind == models.KindBERTClassifier {
		for _, sp := range info.Inputs {
			if sp.Name == inputTextPair {
				return required, nil
			}
		}
		optional = []models.TensorSpec{{Name: inputTextPair, DType: "BYTES", Shape: []int64{-1}}}
	}
	return required, optional
}

// inferOptions are the request's settings beyond its tensors.
type inferOptions struct {
	priority   int
	deviceID   string
	deviceType string
	truncate   bool
	normalize  bool
	outputs    []string // wanted; empty means all
}

// infer validates inputs against sv's metadata, sends their items through
// the scheduler and assembles the outputs; Infer and ModelInfer share it.
func (s *BrokerService) infer(ctx context.Context, sv *lifecycle.Served, inputs []tensor, opts inferOptions) ([]tensor, scheduler.ExecInfo, error) {
	var none scheduler.ExecInfo
	if err := inferable(sv); err != nil {
		return nil, none, err
	}
	given, err := s.checkInputs(sv.Info, inputs)
	if err != nil {
		return nil, none, err
	}
	outSpecs, err := wantedOutputs(sv.Info, opts.outputs)
	if err != nil {
		return nil, none, err
	}

	var payloads []any
	switch sv.Info.Kind {
	case models.KindMLP:
		payloads, err = s.rowPayloads(sv.Info, given[sv.Info.Inputs[0].Name])
	case models.KindBERT, models.KindBERTClassifier:
		payloads, err = s.textPayloads(ctx, sv, given[inputText], given[inputTextPair], opts)
	default:
		return nil, none, invalid("model %s: Infer does not serve kind %q", sv.Info.Name, sv.Info.Kind)
	}
	if err != nil {
		return nil, none, err
	}
	// Each row's outputs are built as float32 values, then as the
	// answer's bytes, then serialised: three copies; a text row's tokens too.
	rowWidth := int64(unknownWidth)
	if sp := sv.Info.Outputs[0]; len(sp.Shape) > 0 && sp.Shape[len(sp.Shape)-1] > 0 {
		rowWidth = sp.Shape[len(sp.Shape)-1]
	}
	perRow := 3*4*rowWidth*int64(max(len(outSpecs), 1)) + int64(sv.Info.MaxSeqLen)*tokenHeld
	release, err := s.holdOutputs("Infer", int64(len(payloads))*perRow)
	if err != nil {
		return nil, none, err
	}
	defer release()
	out, err := s.sched.Submit(ctx, scheduler.Request{
		Model: sv.Key, Client: clientID(ctx), Priority: opts.priority,
		DeviceID: opts.deviceID, DeviceType: opts.deviceType, Inputs: payloads, Costs: sv.Costs(payloads),
	})
	if err != nil {
		return nil, none, s.schedulerStatus("Infer", err)
	}

	// Every model of the repository has one output: rows of float32.
	sp := sv.Info.Outputs[0]
	width := -1
	var data []float32
	for i, o := range out.Outputs {
		v, err := outputValues(o)
		if err != nil {
			return nil, none, toStatus(s.log, "Infer", fmt.Errorf("model %s item %d: %w", sv.Key, i, err))
		}
		if width < 0 {
			width = len(v)
		}
		if len(v) != width || (sp.Shape[len(sp.Shape)-1] >= 0 && int64(len(v)) != sp.Shape[len(sp.Shape)-1]) {
			return nil, none, toStatus(s.log, "Infer", fmt.Errorf("model %s item %d: %d output values, want %v", sv.Key, i, len(v), sp.Shape))
		}
		data = append(data, v...)
	}
	var result []tensor
	for _, osp := range outSpecs {
		result = append(result, tensor{name: osp.Name, dtype: "FP32", shape: []int64{int64(len(payloads)), int64(width)}, data: float32Bytes(data)})
	}
	return result, out.Info, nil
}

// inferable refuses a model that Infer and ModelInfer do not run.
func inferable(sv *lifecycle.Served) error {
	if sv.LLM() != nil {
		return invalid("model %s is a generator (LLM): use Generate or Chat", sv.Info.Name)
	}
	if sv.Model() == nil {
		return invalid("model %s serves Encode only; Infer runs the models of the repository", sv.Info.Name)
	}
	return nil
}

// checkInputs matches the request's tensors with the model's inputs and
// validates each; it returns them by name.
func (s *BrokerService) checkInputs(info models.Info, inputs []tensor) (map[string]*tensor, error) {
	required, optional := inputSpecs(info)
	all := append(append([]models.TensorSpec(nil), required...), optional...)
	describe := func() string {
		var parts []string
		for _, sp := range required {
			parts = append(parts, specString(sp))
		}
		for _, sp := range optional {
			parts = append(parts, "optional "+specString(sp))
		}
		return strings.Join(parts, ", ")
	}
	given := map[string]*tensor{}
	for i := range inputs {
		t := &inputs[i]
		if given[t.name] != nil {
			return nil, invalid("input %q is given twice", t.name)
		}
		var spec *models.TensorSpec
		for j := range all {
			if all[j].Name == t.name {
				spec = &all[j]
			}
		}
		if spec == nil {
			return nil, invalid("input %q is not an input of model %s (it takes %s)", t.name, info.Name, describe())
		}
		// The limits first: the shape is the client's claim, the data is
		// what arrived, and check sizes its work by the shape.
		if len(t.shape) > 0 && t.shape[0] > int64(s.limits.MaxItemsPerRequest) {
			return nil, invalid("input %q: a batch of %d is more than --max-items-per-request %d; split the request",
				t.name, t.shape[0], s.limits.MaxItemsPerRequest)
		}
		if err := check(t, *spec); err != nil {
			return nil, err
		}
		if len(t.shape) > 0 && t.shape[0] == 0 {
			return nil, invalid("input %q: shape %s: the batch (dimension 0) is empty", t.name, shapeString(t.shape))
		}
		given[t.name] = t
	}
	for _, sp := range required {
		if given[sp.Name] == nil {
			return nil, invalid("input %q is missing (model %s takes %s)", sp.Name, info.Name, describe())
		}
	}
	return given, nil
}

// wantedOutputs are the model's outputs that names asks for, in its order
// (none: all of them). Each name is a full copy of an output in the
// answer: a name given twice is refused, as KServe's requestedOutputs
// refuses it, or a small request could make an answer of any size. Each
// name must be a distinct output of the model, so the loop ends, answered
// or refused, within the model's outputs and one more, however many names
// the client sent.
func wantedOutputs(info models.Info, names []string) ([]models.TensorSpec, error) {
	if len(names) == 0 {
		return info.Outputs, nil
	}
	out := make([]models.TensorSpec, 0, min(len(names), len(info.Outputs)))
	for _, n := range names {
		if slices.ContainsFunc(out, func(sp models.TensorSpec) bool { return sp.Name == n }) {
			return nil, invalid("output %q is requested twice", n)
		}
		i := slices.IndexFunc(info.Outputs, func(sp models.TensorSpec) bool { return sp.Name == n })
		if i < 0 {
			var have []string
			for _, sp := range info.Outputs {
				have = append(have, sp.Name)
			}
			return nil, invalid("output %q is not an output of model %s (outputs: %s)", n, info.Name, strings.Join(have, ", "))
		}
		out = append(out, info.Outputs[i])
	}
	return out, nil
}

// rowPayloads splits an MLP input [N, ...] into its N rows.
func (s *BrokerService) rowPayloads(info models.Info, t *tensor) ([]any, error) {
	if len(t.shape) == 0 {
		return nil, invalid("input %q: a scalar; want rows [N, ...]", t.name)
	}
	n := int(t.shape[0])
	vals := float32s(t.data)
	width := len(vals) / n
	out := make([]any, n)
	for i := range n {
		out[i] = models.RowInput{Values: vals[i*width : (i+1)*width : (i+1)*width]}
	}
	return out, nil
}

// textPayloads tokenises the texts (and pairs) of a text model.
func (s *BrokerService) textPayloads(ctx context.Context, sv *lifecycle.Served, text, pair *tensor, opts inferOptions) ([]any, error) {
	tm, ok := sv.Model().(textModel)
	if !ok {
		return nil, toStatus(s.log, "Infer", fmt.Errorf("model %s of kind %s has no tokenizer", sv.Key, sv.Info.Kind))
	}
	n := int(text.shape[0])
	texts, err := splitBytes(text, n)
	if err != nil {
		return nil, err
	}
	var pairs [][]byte
	if pair != nil {
		if shapeString(pair.shape) != shapeString(text.shape) {
			return nil, invalid("input %q: shape %s, want the shape of %q %s (one second segment per text)",
				pair.name, shapeString(pair.shape), text.name, shapeString(text.shape))
		}
		if pairs, err = splitBytes(pair, n); err != nil {
			return nil, err
		}
	}
	out := make([]any, n)
	for i, b := range texts {
		var p string
		if pairs != nil {
			p = string(pairs[i])
		}
		if len(b) == 0 {
			return nil, invalid("input %q element %d: empty text", text.name, i)
		}
		if len(b)+len(p) > s.limits.MaxItemBytes {
			return nil, invalid("input %q element %d: %d bytes is more than --max-item-bytes %d", text.name, i, len(b)+len(p), s.limits.MaxItemBytes)
		}
		if err := ctx.Err(); err != nil { // the caller gave up: stop the host work
			return nil, toStatus(s.log, "Infer", fmt.Errorf("tokenising element %d: %w", i, err))
		}
		in, err := tm.Tokenize(ctx, string(b), p, opts.truncate, opts.normalize)
		if cerr := ctx.Err(); cerr != nil { // gone while tokenising: not the text's fault
			return nil, toStatus(s.log, "Infer", fmt.Errorf("tokenising element %d: %w", i, cerr))
		}
		if err != nil {
			return nil, invalid("input %q element %d: %v", text.name, i, tokenizeError(err, opts.truncate, sv.Info.MaxSeqLen))
		}
		out[i] = in
	}
	return out, nil
}

// tokenizeError adds the remedy to a too-long text refused with truncate off.
func tokenizeError(err error, truncate bool, maxSeqLen int) error {
	if truncate {
		return err
	}
	return fmt.Errorf("%w (truncate=false; the model takes at most %d tokens)", err, maxSeqLen)
}

// outputValues reads one output payload of a repository model.
func outputValues(o any) ([]float32, error) {
	switch v := o.(type) {
	case models.Output:
		return v.Values, nil
	case *models.Output:
		if v != nil {
			return v.Values, nil
		}
	}
	return nil, fmt.Errorf("replica returned %T, want models.Output", o)
}

// pinnedDevice refuses a pin to a device that does not exist or is cordoned.
func (s *BrokerService) pinnedDevice(method, id string) error {
	if id == "" {
		return nil
	}
	e, err := s.inv.Device(id)
	if err != nil {
		return toStatus(s.log, method, err)
	}
	if e.Cordoned {
		return status.Errorf(codes.FailedPrecondition, "device %s is cordoned (%s); pin another device or uncordon it", id, e.CordonReason)
	}
	return nil
}

// Infer runs typed tensors through a model of the repository.
func (s *BrokerService) Infer(ctx context.Context, req *brokerv1.InferRequest) (*brokerv1.InferResponse, error) {
	start := time.Now()
	if s.models == nil || s.sched == nil {
		return nil, status.Error(codes.Unavailable, "no model is being served")
	}
	if req.GetModel() == "" {
		return nil, status.Error(codes.InvalidArgument, "model is required")
	}
	if len(req.GetInputs()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "inputs: at least one input tensor is required")
	}
	priority, err := priorityFromProto(req.GetPriority())
	if err != nil {
		return nil, err
	}
	pinType, err := s.pinType(req.GetDeviceType())
	if err != nil {
		return nil, err
	}
	if err := s.pinnedDevice("Infer", req.GetDeviceId()); err != nil {
		return nil, err
	}
	if d := req.GetTimeout(); d != nil {
		if !d.IsValid() || d.AsDuration() <= 0 {
			return nil, status.Errorf(codes.InvalidArgument, "timeout %v is invalid: want a positive duration", d.AsDuration())
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.AsDuration())
		defer cancel()
	}
	inputs := make([]tensor, 0, len(req.GetInputs()))
	for _, in := range req.GetInputs() {
		t, err := fromBroker(in)
		if err != nil {
			return nil, err
		}
		inputs = append(inputs, t)
	}
	if v := req.GetModelVersion(); v < 0 {
		return nil, invalid("model_version %d is invalid: 0 (the one serving) or a positive version", v)
	}
	sv, err := s.models.Acquire(req.GetModel(), req.GetModelVersion())
	if err != nil {
		return nil, toStatus(s.log, "Infer", err)
	}
	defer s.models.Release(sv)
	opts := inferOptions{priority: priority, deviceID: req.GetDeviceId(), deviceType: pinType,
		truncate: req.Truncate == nil || req.GetTruncate(), normalize: true, outputs: req.GetOutputs()}
	outs, info, err := s.infer(ctx, sv, inputs, opts)
	if err != nil {
		return nil, err
	}
	resp := &brokerv1.InferResponse{Model: sv.Info.Name, ModelVersion: sv.Info.Version, Execution: execInfoToProto(info)}
	for _, o := range outs {
		resp.Outputs = append(resp.Outputs, &brokerv1.Tensor{Name: o.name, Dtype: dataTypeToProto(o.dtype), Shape: o.shape, Data: o.data})
	}
	resp.Execution.TotalNs = time.Since(start).Nanoseconds()
	return resp, nil
}
