package server

import (
	"context"
	"slices"
	"sort"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/brokerd/brokerd/lifecycle"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/models"
)

// ListModels lists the served models and every model of the repository,
// loaded or not, with their versions, devices, memory and tensors.
func (s *BrokerService) ListModels(ctx context.Context, _ *brokerv1.ListModelsRequest) (*brokerv1.ListModelsResponse, error) {
	resp := &brokerv1.ListModelsResponse{}
	if s.models == nil {
		return resp, nil
	}
	cat, err := s.models.Catalog()
	if err != nil {
		return nil, toStatus(s.log, "ListModels", err)
	}
	entries, pending, lastErr := cat.Repo, cat.Pending, cat.LastErr
	byName := map[string]lifecycle.RepoEntry{}
	for _, e := range entries {
		byName[e.Name] = e
	}
	for name, sv := range cat.Served {
		m := servedToProto(sv)
		if e, ok := byName[name]; ok {
			m.AvailableVersions = slices.Clone(e.Versions)
			setDetails(m, e)
		}
		if pending[name] == "unloading" {
			m.State = brokerv1.ModelState_MODEL_STATE_UNLOADING
		}
		resp.Models = append(resp.Models, m)
	}
	for _, e := range entries {
		if cat.Served[e.Name] != nil {
			continue
		}
		m := &brokerv1.Model{Name: e.Name, Kind: e.Kind, State: brokerv1.ModelState_MODEL_STATE_AVAILABLE,
			AvailableVersions: slices.Clone(e.Versions), Error: e.Err}
		setDetails(m, e)
		if n := len(e.Versions); n > 0 {
			m.Version = e.Versions[n-1]
		}
		switch {
		case pending[e.Name] == "loading":
			m.State = brokerv1.ModelState_MODEL_STATE_LOADING
		case lastErr[e.Name] != "":
			m.State, m.Error = brokerv1.ModelState_MODEL_STATE_FAILED, lastErr[e.Name]
		case len(e.Versions) == 0:
			m.State = brokerv1.ModelState_MODEL_STATE_FAILED
		}
		resp.Models = append(resp.Models, m)
	}
	sort.Slice(resp.Models, func(i, j int) bool { return resp.Models[i].GetName() < resp.Models[j].GetName() })
	return resp, nil
}

// LoadModel loads a version of a repository model (0: the highest loadable)
// onto the devices the placement picks, admitted against their budgets; a
// newer version replaces the serving one without dropping a request.
func (s *BrokerService) LoadModel(ctx context.Context, req *brokerv1.LoadModelRequest) (*brokerv1.LoadModelResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if req.GetVersion() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "version %d is invalid: 0 (the highest loadable) or a version number", req.GetVersion())
	}
	if s.models == nil {
		return nil, status.Error(codes.FailedPrecondition, "no data plane: models cannot be loaded")
	}
	// A store model loads under the name it is listed under, whichever of
	// Ollama's forms the caller used (lifecycle.Set.Canonical).
	sv, act, err := s.models.Load(ctx, req.GetName(), req.GetVersion())
	if err != nil {
		return nil, toStatus(s.log, "LoadModel", err)
	}
	return &brokerv1.LoadModelResponse{Model: servedToProto(sv), Action: loadActions[act]}, nil
}

// UnloadModel stops serving a model once the work it accepted is done, and
// frees its device memory.
func (s *BrokerService) UnloadModel(ctx context.Context, req *brokerv1.UnloadModelRequest) (*brokerv1.UnloadModelResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if s.models == nil {
		return nil, status.Error(codes.FailedPrecondition, "no data plane: nothing is loaded")
	}
	sv, err := s.models.Unload(ctx, req.GetName())
	if err != nil {
		return nil, toStatus(s.log, "UnloadModel", err)
	}
	m := servedToProto(sv)
	m.State = brokerv1.ModelState_MODEL_STATE_AVAILABLE
	m.DeviceIds, m.MemoryBytes = nil, 0
	return &brokerv1.UnloadModelResponse{Model: m}, nil
}

var loadActions = map[lifecycle.Action]brokerv1.LoadAction{
	lifecycle.ActionLoaded:    brokerv1.LoadAction_LOAD_ACTION_LOADED,
	lifecycle.ActionSwitched:  brokerv1.LoadAction_LOAD_ACTION_SWITCHED,
	lifecycle.ActionReloaded:  brokerv1.LoadAction_LOAD_ACTION_RELOADED,
	lifecycle.ActionUnchanged: brokerv1.LoadAction_LOAD_ACTION_UNCHANGED,
}

// servedToProto describes a served version.
func servedToProto(sv *lifecycle.Served) *brokerv1.Model {
	m := &brokerv1.Model{
		Name: sv.Info.Name, Version: sv.Info.Version, Kind: string(sv.Info.Kind), State: brokerv1.ModelState_MODEL_STATE_READY,
		DeviceIds: sv.DeviceIDs(), MemoryBytes: uint64(sv.MemoryBytes()), BaseBatch: int32(sv.Info.BaseBatch),
		Inputs: specsToProto(sv.Info.Inputs), Outputs: specsToProto(sv.Info.Outputs),
		AvailableVersions: []int64{sv.Info.Version}, Labels: slices.Clone(sv.Info.Labels),
	}
	if len(m.DeviceIds) == 0 {
		m.State = brokerv1.ModelState_MODEL_STATE_FAILED
		m.Error = "no device could take a replica (see brokerd's log)"
	}
	return m
}

// setDetails copies what the repository says of a model's files.
func setDetails(m *brokerv1.Model, e lifecycle.RepoEntry) {
	d := e.Details
	m.Format, m.Family, m.ParameterSize, m.Quantization = d.Format, d.Family, d.ParameterSize, d.Quantization
	m.ParameterCount, m.FileBytes, m.ContextLength = uint64(max(d.Parameters, 0)), uint64(max(d.FileBytes, 0)), int64(d.ContextLength)
	if !d.ModTime.IsZero() {
		m.ModifiedAt = timestamppb.New(d.ModTime)
	}
	m.Template, m.System, m.ModelFile, m.Digest = d.ChatTemplate, d.System, d.File, d.Digest
	for _, p := range d.Params {
		m.Parameters = append(m.Parameters, &brokerv1.ModelParameter{Name: p.Name, Value: p.Value})
	}
}

func specsToProto(specs []models.TensorSpec) []*brokerv1.TensorSpec {
	var out []*brokerv1.TensorSpec
	for _, sp := range specs {
		out = append(out, &brokerv1.TensorSpec{Name: sp.Name, Dtype: dataTypeToProto(sp.DType), Shape: slices.Clone(sp.Shape)})
	}
	return out
}
