package server

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/brokerd/brokerd/lifecycle"
	"github.com/brokerd/brokerd/proto/inference"
)

// serverName is what ServerMetadata reports.
const serverName = "brokerd"

// InferenceService serves the KServe Open Inference Protocol v2
// (inference.GRPCInferenceService) over the broker's models and scheduler,
// so Triton and KServe clients work unchanged.
type InferenceService struct {
	inference.UnimplementedGRPCInferenceServiceServer
	b       *BrokerService
	ready   func() bool // false while draining
	version string
	opts    KServeOptions
}

// NewInferenceService returns the KServe service over b; ready reports
// whether brokerd takes new work.
func NewInferenceService(b *BrokerService, ready func() bool, opts KServeOptions) *InferenceService {
	return &InferenceService{b: b, ready: ready, version: b.policy.Version, opts: opts}
}

// ServerLive is true while the process answers.
func (k *InferenceService) ServerLive(context.Context, *inference.ServerLiveRequest) (*inference.ServerLiveResponse, error) {
	return &inference.ServerLiveResponse{Live: true}, nil
}

// ServerReady is true while brokerd takes work: false once draining.
func (k *InferenceService) ServerReady(context.Context, *inference.ServerReadyRequest) (*inference.ServerReadyResponse, error) {
	return &inference.ServerReadyResponse{Ready: k.b.models != nil && k.ready()}, nil
}

// ServerMetadata names the server and the protocol extensions it serves.
func (k *InferenceService) ServerMetadata(context.Context, *inference.ServerMetadataRequest) (*inference.ServerMetadataResponse, error) {
	// "parameters": ModelInfer reads the truncate, normalize and priority
	// request parameters.
	return &inference.ServerMetadataResponse{Name: serverName, Version: k.version, Extensions: []string{"parameters"}}, nil
}

// parseVersion reads the protocol's string version ("" means whichever serves).
func parseVersion(v string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		return 0, status.Errorf(codes.InvalidArgument, "model version %q is invalid: want a positive integer or empty", v)
	}
	return n, nil
}

// ModelReady is true when the model (and version, if given) serves and
// brokerd takes work. A model brokerd has never heard of is NOT_FOUND.
func (k *InferenceService) ModelReady(ctx context.Context, req *inference.ModelReadyRequest) (*inference.ModelReadyResponse, error) {
	v, err := parseVersion(req.GetVersion())
	if err != nil {
		return nil, err
	}
	ms := k.b.models
	if ms == nil {
		return &inference.ModelReadyResponse{}, nil
	}
	sv := ms.Lookup(req.GetName())
	if sv == nil {
		if err := ms.Missing(req.GetName()); !errors.Is(err, lifecycle.ErrModelNotLoaded) {
			return nil, toStatus(k.b.log, "ModelReady", err)
		}
		return &inference.ModelReadyResponse{}, nil
	}
	ready := (v == 0 || v == sv.Info.Version) && sv.Replicas() > 0 && k.ready()
	return &inference.ModelReadyResponse{Ready: ready}, nil
}

// ModelMetadata describes a served model's inputs and outputs.
func (k *InferenceService) ModelMetadata(ctx context.Context, req *inference.ModelMetadataRequest) (*inference.ModelMetadataResponse, error) {
	if err := k.modelMissing(req.GetName(), req.GetVersion()); err != nil {
		return nil, err
	}
	v, err := parseVersion(req.GetVersion())
	if err != nil {
		return nil, err
	}
	if k.b.models == nil {
		return nil, status.Error(codes.Unavailable, "no model is being served")
	}
	sv := k.b.models.Lookup(req.GetName())
	if sv == nil {
		return nil, toStatus(k.b.log, "ModelMetadata", k.b.models.Missing(req.GetName()))
	}
	if v != 0 && v != sv.Info.Version {
		return nil, status.Errorf(codes.FailedPrecondition, "model %s version %d is not loaded (version %d serves)", sv.Info.Name, v, sv.Info.Version)
	}
	resp := &inference.ModelMetadataResponse{
		Name: sv.Info.Name, Versions: []string{strconv.FormatInt(sv.Info.Version, 10)},
		Platform: serverName + "_" + string(sv.Info.Kind),
	}
	required, optional := inputSpecs(sv.Info)
	for _, sp := range slices.Concat(required, optional) {
		resp.Inputs = append(resp.Inputs, &inference.ModelMetadataResponse_TensorMetadata{Name: sp.Name, Datatype: sp.DType, Shape: slices.Clone(sp.Shape)})
	}
	for _, sp := range sv.Info.Outputs {
		resp.Outputs = append(resp.Outputs, &inference.ModelMetadataResponse_TensorMetadata{Name: sp.Name, Datatype: sp.DType, Shape: slices.Clone(sp.Shape)})
	}
	return resp, nil
}

// ModelInfer runs a request through the same validation, scheduler and
// metrics as broker.v1 Infer. Inputs come from raw_input_contents or typed
// contents; outputs go back in raw_output_contents.
func (k *InferenceService) ModelInfer(ctx context.Context, req *inference.ModelInferRequest) (*inference.ModelInferResponse, error) {
	start := time.Now()
	s := k.b
	if s.models == nil || s.sched == nil {
		return nil, status.Error(codes.Unavailable, "no model is being served")
	}
	if req.GetModelName() == "" {
		return nil, status.Error(codes.InvalidArgument, "model_name is required")
	}
	// An unknown model (or version) is NOT_FOUND before anything else.
	if err := k.modelMissing(req.GetModelName(), req.GetModelVersion()); err != nil {
		return nil, err
	}
	v, err := parseVersion(req.GetModelVersion())
	if err != nil {
		return nil, err
	}
	ins, raw := req.GetInputs(), req.GetRawInputContents()
	if len(ins) == 0 {
		return nil, status.Error(codes.InvalidArgument, "inputs: at least one input tensor is required")
	}
	if len(raw) > 0 && len(raw) != len(ins) {
		return nil, status.Errorf(codes.InvalidArgument, "raw_input_contents has %d entries for %d inputs: want one per input, in the order of inputs", len(raw), len(ins))
	}
	opts := inferOptions{priority: 2, truncate: true, normalize: true}
	timeout, err := inferParameters(req.GetParameters(), &opts)
	if err != nil {
		return nil, err
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	// The model first: how many outputs may be asked for, and which
	// datatypes are worth converting, are its.
	sv, err := s.models.Acquire(req.GetModelName(), v)
	if err != nil {
		return nil, toStatus(s.log, "ModelInfer", err)
	}
	defer s.models.Release(sv)
	if err := inferable(sv); err != nil {
		return nil, err
	}
	outNames, classes, err := requestedOutputs(req.GetOutputs(), len(sv.Info.Outputs))
	if err != nil {
		return nil, err
	}
	opts.outputs = outNames
	inputs := make([]tensor, len(ins))
	for i, in := range ins {
		var r []byte
		if len(raw) > 0 {
			r = raw[i]
		}
		// The datatype before typed contents are converted: they can grow
		// eightfold (one-byte varints to INT64), not worth it for an input
		// the model would refuse.
		if err := checkDType(sv.Info, in.GetName(), in.GetDatatype()); err != nil {
			return nil, err
		}
		if inputs[i], err = fromKServe(in, r, len(raw) > 0); err != nil {
			return nil, err
		}
	}
	outs, info, err := s.infer(ctx, sv, inputs, opts)
	if err != nil {
		return nil, err
	}
	resp := &inference.ModelInferResponse{
		ModelName: sv.Info.Name, ModelVersion: strconv.FormatInt(sv.Info.Version, 10), Id: req.GetId(),
		Parameters: map[string]*inference.InferParameter{
			"device_id":  {ParameterChoice: &inference.InferParameter_StringParam{StringParam: info.DeviceID}},
			"batch_size": {ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: int64(info.BatchSize)}},
			"queue_ns":   {ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: info.Queue.Nanoseconds()}},
			"compute_ns": {ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: info.Compute.Nanoseconds()}},
			"total_ns":   {ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: time.Since(start).Nanoseconds()}},
			"cost_usd":   {ParameterChoice: &inference.InferParameter_DoubleParam{DoubleParam: info.CostUSD}},
		},
	}
	for _, o := range outs {
		if k := classes[o.name]; k > 0 {
			if o, err = classify(o, k, sv.Info.Labels); err != nil {
				return nil, err
			}
		}
		resp.Outputs = append(resp.Outputs, &inference.ModelInferResponse_InferOutputTensor{Name: o.name, Datatype: o.dtype, Shape: o.shape})
		resp.RawOutputContents = append(resp.RawOutputContents, o.data)
	}
	return resp, nil
}

// inferParameters reads the request parameters brokerd understands:
// truncate and normalize (bool), priority (Triton's meaning; see
// tritonPriority) and timeout (Triton's, in microseconds: returned). Any
// other parameter is INVALID_ARGUMENT: Triton's sequence batching and
// custom backend parameters would otherwise be silently ignored.
func inferParameters(params map[string]*inference.InferParameter, opts *inferOptions) (time.Duration, error) {
	boolParam := func(name string, p *inference.InferParameter) (bool, error) {
		b, ok := p.GetParameterChoice().(*inference.InferParameter_BoolParam)
		if !ok {
			return false, status.Errorf(codes.InvalidArgument, "parameter %s: want a bool_param", name)
		}
		return b.BoolParam, nil
	}
	var timeout time.Duration
	for name, p := range params {
		var err error
		switch name {
		case "truncate":
			opts.truncate, err = boolParam(name, p)
		case "normalize":
			opts.normalize, err = boolParam(name, p)
		case "priority":
			opts.priority, err = tritonPriority(p)
		case "timeout":
			timeout, err = requestTimeout(p)
		case "sequence_id", "sequence_start", "sequence_end":
			err = status.Errorf(codes.InvalidArgument, "parameter %s: brokerd has no sequence batching (stateful models); send each request on its own", name)
		default:
			err = status.Errorf(codes.InvalidArgument, "parameter %q is not supported (brokerd reads priority, timeout, truncate and normalize)", name)
		}
		if err != nil {
			return 0, err
		}
	}
	return timeout, nil
}

// tritonPriority maps Triton's request priority onto brokerd's three
// levels. In Triton 1 is the highest priority and larger numbers are lower;
// 0 means the model's default. brokerd: 0 → normal, 1 → high, 2 → normal,
// 3 and above → low (a Triton model with more priority levels keeps their
// order, the lowest ones sharing low).
func tritonPriority(p *inference.InferParameter) (int, error) {
	var n uint64
	switch c := p.GetParameterChoice().(type) {
	case *inference.InferParameter_Uint64Param:
		n = c.Uint64Param
	case *inference.InferParameter_Int64Param:
		if c.Int64Param < 0 {
			return 0, status.Errorf(codes.InvalidArgument, "parameter priority %d is invalid: 0 (the default) or more, 1 the highest", c.Int64Param)
		}
		n = uint64(c.Int64Param)
	default:
		return 0, status.Errorf(codes.InvalidArgument, "parameter priority: want a uint64_param (or int64_param)")
	}
	switch n {
	case 0, 2:
		return 2, nil
	case 1:
		return 3, nil
	}
	return 1, nil
}
