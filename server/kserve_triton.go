package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/lifecycle"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
)

// Triton's RPCs beyond the KServe core: model configuration and
// statistics, the repository, the decoupled stream, log settings. Each is
// a translation onto the broker service (the same admission, scheduler and
// metrics); the shared-memory and trace RPCs say why brokerd has none.

// KServeOptions are what the Triton RPCs report or change besides the
// broker service.
type KServeOptions struct {
	// MaxQueueDelay is the scheduler's batching delay (dynamic_batching's
	// max_queue_delay_microseconds in ModelConfig).
	MaxQueueDelay time.Duration
	// LogLevel is brokerd's log level, which LogSettings reads and
	// changes; nil: LogSettings reports and refuses changes.
	LogLevel *zap.AtomicLevel
}

// modelMissing is NOT_FOUND when name is neither served nor in the model
// repository, or when version (the request's string) names a version that
// neither serves nor is in the repository; nil otherwise. The model RPCs
// ask it before anything else of the request, so an unknown model is
// NOT_FOUND whatever else is wrong (as in Triton); a version string that
// does not parse is left to parseVersion.
func (k *InferenceService) modelMissing(name, version string) error {
	ms := k.b.models
	if ms == nil || name == "" {
		return nil
	}
	sv := ms.Lookup(name)
	if sv != nil && (version == "" || version == strconv.FormatInt(sv.Info.Version, 10)) {
		return nil // the fast path: what serves is what was asked for
	}
	cat, err := ms.Catalog()
	if err != nil {
		return nil // the RPC's own path answers
	}
	i := slices.IndexFunc(cat.Repo, func(e lifecycle.RepoEntry) bool { return e.Name == name })
	if sv == nil && i < 0 {
		served := strings.Join(slices.Sorted(maps.Keys(cat.Served)), ", ")
		if served == "" {
			served = "none"
		}
		return status.Errorf(codes.NotFound, "model %q not found: it is neither served (served: %s) nor in the model repository", name, served)
	}
	v, err := strconv.ParseInt(version, 10, 64)
	if version == "" || err != nil || v < 1 {
		return nil
	}
	if i >= 0 {
		if slices.Contains(cat.Repo[i].Versions, v) {
			return nil
		}
		return status.Errorf(codes.NotFound, "model %s version %d not found: the model repository holds version(s) %s", name, v, joinVersions(cat.Repo[i].Versions))
	}
	return status.Errorf(codes.NotFound, "model %s version %d not found: the model is not in the repository, and version %d serves", name, v, sv.Info.Version)
}

func joinVersions(vs []int64) string {
	if len(vs) == 0 {
		return "none"
	}
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(s, ", ")
}

// servedVersion returns what serves name, checking a Triton version
// string ("" for whichever serves).
func (k *InferenceService) servedVersion(method, name, version string) (*lifecycle.Served, error) {
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if err := k.modelMissing(name, version); err != nil {
		return nil, err
	}
	v, err := parseVersion(version)
	if err != nil {
		return nil, err
	}
	if k.b.models == nil {
		return nil, status.Error(codes.Unavailable, "no model is being served")
	}
	sv := k.b.models.Lookup(name)
	if sv == nil {
		return nil, toStatus(k.b.log, method, k.b.models.Missing(name))
	}
	if v != 0 && v != sv.Info.Version {
		return nil, status.Errorf(codes.FailedPrecondition, "model %s version %d is not loaded (version %d serves)", name, v, sv.Info.Version)
	}
	return sv, nil
}

// tritonDataTypes maps the protocol's datatype strings to model_config's.
var tritonDataTypes = map[string]inference.DataType{
	"BOOL": inference.DataType_TYPE_BOOL, "UINT8": inference.DataType_TYPE_UINT8, "UINT16": inference.DataType_TYPE_UINT16,
	"UINT32": inference.DataType_TYPE_UINT32, "UINT64": inference.DataType_TYPE_UINT64, "INT8": inference.DataType_TYPE_INT8,
	"INT16": inference.DataType_TYPE_INT16, "INT32": inference.DataType_TYPE_INT32, "INT64": inference.DataType_TYPE_INT64,
	"FP16": inference.DataType_TYPE_FP16, "FP32": inference.DataType_TYPE_FP32, "FP64": inference.DataType_TYPE_FP64,
	"BYTES": inference.DataType_TYPE_STRING, "BF16": inference.DataType_TYPE_BF16,
}

// ModelConfig describes a served model as a Triton model configuration:
// what brokerd really does with it (its batch limit, batching delay,
// replicas per device kind). With max_batch_size > 0 the dims leave out
// the batch dimension, as in Triton.
func (k *InferenceService) ModelConfig(ctx context.Context, req *inference.ModelConfigRequest) (*inference.ModelConfigResponse, error) {
	sv, err := k.servedVersion("ModelConfig", req.GetName(), req.GetVersion())
	if err != nil {
		return nil, err
	}
	cfg := &inference.ModelConfig{
		Name: sv.Info.Name, Platform: serverName + "_" + string(sv.Info.Kind), Backend: serverName,
		VersionPolicy: &inference.ModelVersionPolicy{PolicyChoice: &inference.ModelVersionPolicy_Specific_{
			Specific: &inference.ModelVersionPolicy_Specific{Versions: []int64{sv.Info.Version}}}},
		Parameters: map[string]*inference.ModelParameter{"kind": {StringValue: string(sv.Info.Kind)}},
	}
	maxBatch := 0
	groups := map[detect.Type]*inference.ModelInstanceGroup{}
	var order []detect.Type
	for _, r := range sv.ReplicaInfos() {
		maxBatch = max(maxBatch, r.MaxBatch)
		typ := detect.TypeCPU
		if k.b.inv != nil {
			if e, err := k.b.inv.Device(r.DeviceID); err == nil {
				typ = e.Type
			}
		}
		g := groups[typ]
		if g == nil {
			g = &inference.ModelInstanceGroup{Name: sv.Info.Name + "_" + string(typ), Kind: inference.ModelInstanceGroup_KIND_CPU}
			if typ != detect.TypeCPU {
				// Triton has no TPU kind: a TPU replica is a device the model
				// itself manages.
				g.Kind = inference.ModelInstanceGroup_KIND_MODEL
				if typ == detect.TypeGPU {
					g.Kind = inference.ModelInstanceGroup_KIND_GPU
				}
			}
			groups[typ] = g
			order = append(order, typ)
		}
		g.Count++
		if typ == detect.TypeGPU {
			if i, ok := deviceIndex(r.DeviceID); ok {
				g.Gpus = append(g.Gpus, i)
			}
		}
	}
	for _, t := range order {
		cfg.InstanceGroup = append(cfg.InstanceGroup, groups[t])
	}
	if sv.LLM() != nil {
		// Generators take Triton's text generation convention on
		// ModelStreamInfer (one sequence per request), decoupled: a
		// request gets a response per streamed delta.
		cfg.MaxBatchSize = 0
		cfg.Input = []*inference.ModelInput{
			{Name: "text_input", DataType: inference.DataType_TYPE_STRING, Dims: []int64{1}},
			{Name: "stream", DataType: inference.DataType_TYPE_BOOL, Dims: []int64{1}, Optional: true},
			{Name: "sampling_parameters", DataType: inference.DataType_TYPE_STRING, Dims: []int64{1}, Optional: true},
		}
		cfg.Output = []*inference.ModelOutput{{Name: "text_output", DataType: inference.DataType_TYPE_STRING, Dims: []int64{-1}}}
		cfg.ModelTransactionPolicy = &inference.ModelTransactionPolicy{Decoupled: true}
		cfg.Parameters["max_running_sequences"] = &inference.ModelParameter{StringValue: strconv.Itoa(maxBatch)}
		return &inference.ModelConfigResponse{Config: cfg}, nil
	}
	cfg.MaxBatchSize = int32(maxBatch)
	dims := func(shape []int64) []int64 {
		if maxBatch > 0 && len(shape) > 0 {
			return slices.Clone(shape[1:])
		}
		return slices.Clone(shape)
	}
	required, optional := inputSpecs(sv.Info)
	for i, sp := range slices.Concat(required, optional) {
		cfg.Input = append(cfg.Input, &inference.ModelInput{Name: sp.Name, DataType: tritonDataTypes[sp.DType], Dims: dims(sp.Shape),
			Optional: i >= len(required)})
	}
	for _, sp := range sv.Info.Outputs {
		cfg.Output = append(cfg.Output, &inference.ModelOutput{Name: sp.Name, DataType: tritonDataTypes[sp.DType], Dims: dims(sp.Shape)})
	}
	var preferred []int32
	if maxBatch > 0 {
		// The scheduler fills a batch up to the replica's limit, or sends
		// what it has once the oldest item waited the delay.
		preferred = []int32{int32(maxBatch)}
	}
	cfg.SchedulingChoice = &inference.ModelConfig_DynamicBatching{DynamicBatching: &inference.ModelDynamicBatching{
		PreferredBatchSize: preferred, MaxQueueDelayMicroseconds: uint64(k.opts.MaxQueueDelay.Microseconds()),
		// brokerd's three levels in Triton's order: 1 high, 2 normal, 3 low.
		PriorityLevels: 3, DefaultPriorityLevel: 2,
	}}
	return &inference.ModelConfigResponse{Config: cfg}, nil
}

// deviceIndex reads the index of a device ID such as "gpu:1".
func deviceIndex(id string) (int32, bool) {
	_, n, ok := strings.Cut(id, ":")
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(n, 10, 32)
	return int32(i), err == nil
}

// ModelStatistics reports each served model's counts and cumulative
// durations, from the scheduler's own totals. brokerd measures a batch's
// device time as one span (copy in, run, copy out): it is compute_infer;
// compute_input and compute_output stay empty.
func (k *InferenceService) ModelStatistics(ctx context.Context, req *inference.ModelStatisticsRequest) (*inference.ModelStatisticsResponse, error) {
	s := k.b
	if s.models == nil || s.sched == nil {
		return &inference.ModelStatisticsResponse{}, nil
	}
	var served []*lifecycle.Served
	if req.GetName() != "" {
		sv, err := k.servedVersion("ModelStatistics", req.GetName(), req.GetVersion())
		if err != nil {
			return nil, err
		}
		served = []*lifecycle.Served{sv}
	} else {
		if req.GetVersion() != "" {
			return nil, status.Error(codes.InvalidArgument, "version needs a name")
		}
		cat, err := s.models.Catalog()
		if err != nil {
			return nil, toStatus(s.log, "ModelStatistics", err)
		}
		for _, name := range slices.Sorted(maps.Keys(cat.Served)) {
			served = append(served, cat.Served[name])
		}
	}
	resp := &inference.ModelStatisticsResponse{}
	for _, sv := range served {
		ms := &inference.ModelStatistics{Name: sv.Info.Name, Version: strconv.FormatInt(sv.Info.Version, 10),
			InferenceStats: &inference.InferStatistics{Success: &inference.StatisticDuration{}, Fail: &inference.StatisticDuration{},
				Queue: &inference.StatisticDuration{}, ComputeInput: &inference.StatisticDuration{}, ComputeInfer: &inference.StatisticDuration{},
				ComputeOutput: &inference.StatisticDuration{}, CacheHit: &inference.StatisticDuration{}, CacheMiss: &inference.StatisticDuration{}}}
		for _, row := range s.sched.Stats(sv.Key) {
			if row.DeviceID != "" {
				continue
			}
			t := row.Totals
			ms.InferenceCount, ms.ExecutionCount = uint64(row.Completed), uint64(row.Batches)
			if !t.LastSuccess.IsZero() {
				ms.LastInference = uint64(t.LastSuccess.UnixMilli())
			}
			st := ms.InferenceStats
			st.Success = &inference.StatisticDuration{Count: uint64(t.Succeeded), Ns: uint64(t.SuccessTime)}
			st.Fail = &inference.StatisticDuration{Count: uint64(t.Failed), Ns: uint64(t.FailTime)}
			st.Queue = &inference.StatisticDuration{Count: uint64(t.Succeeded), Ns: uint64(t.QueueTime)}
			st.ComputeInfer = &inference.StatisticDuration{Count: uint64(t.Succeeded), Ns: uint64(t.ComputeTime)}
			for _, size := range slices.Sorted(maps.Keys(t.BatchesBySize)) {
				b := t.BatchesBySize[size]
				ms.BatchStats = append(ms.BatchStats, &inference.InferBatchStatistics{BatchSize: uint64(size),
					ComputeInput: &inference.StatisticDuration{}, ComputeOutput: &inference.StatisticDuration{},
					ComputeInfer: &inference.StatisticDuration{Count: uint64(b.Count), Ns: uint64(b.Compute)}})
			}
		}
		for _, r := range sv.ReplicaInfos() {
			typ := "CPU"
			if k.b.inv != nil {
				if e, err := k.b.inv.Device(r.DeviceID); err == nil {
					typ = strings.ToUpper(string(e.Type))
				}
			}
			id, _ := deviceIndex(r.DeviceID)
			ms.MemoryUsage = append(ms.MemoryUsage, &inference.MemoryUsage{Type: typ, Id: int64(id)})
		}
		if n := len(ms.MemoryUsage); n > 0 {
			// The replicas' reservation, shared evenly: lifecycle reserves the
			// same bytes for each replica of a version on one device type.
			for _, mu := range ms.MemoryUsage {
				mu.ByteSize = uint64(sv.MemoryBytes()) / uint64(n)
			}
		}
		resp.ModelStats = append(resp.ModelStats, ms)
	}
	return resp, nil
}

// oneRepository refuses a repository name: brokerd serves one model
// repository (--model-repo), which the empty name means.
func oneRepository(name string) error {
	if name != "" {
		return status.Errorf(codes.NotFound, "repository %q: brokerd serves one model repository; leave repository_name empty", name)
	}
	return nil
}

// RepositoryIndex lists the repository's models with Triton's states.
func (k *InferenceService) RepositoryIndex(ctx context.Context, req *inference.RepositoryIndexRequest) (*inference.RepositoryIndexResponse, error) {
	if err := oneRepository(req.GetRepositoryName()); err != nil {
		return nil, err
	}
	list, err := k.b.ListModels(ctx, &brokerv1.ListModelsRequest{})
	if err != nil {
		return nil, err
	}
	resp := &inference.RepositoryIndexResponse{}
	for _, m := range list.GetModels() {
		state := map[brokerv1.ModelState]string{
			brokerv1.ModelState_MODEL_STATE_READY:     "READY",
			brokerv1.ModelState_MODEL_STATE_LOADING:   "LOADING",
			brokerv1.ModelState_MODEL_STATE_UNLOADING: "UNLOADING",
		}[m.GetState()]
		if state == "" {
			state = "UNAVAILABLE"
		}
		if req.GetReady() && state != "READY" {
			continue
		}
		reason := m.GetError()
		if state == "UNAVAILABLE" && reason == "" {
			reason = "unloaded"
		}
		v := ""
		if m.GetVersion() > 0 {
			v = strconv.FormatInt(m.GetVersion(), 10)
		}
		resp.Models = append(resp.Models, &inference.RepositoryIndexResponse_ModelIndex{Name: m.GetName(), Version: v, State: state, Reason: reason})
	}
	return resp, nil
}

// repositoryParameters refuses load and unload parameters: Triton's config
// override and in-request model files would change what is loaded, and
// brokerd loads only what its repository holds.
func repositoryParameters(params map[string]*inference.ModelRepositoryParameter) error {
	for name := range params {
		return status.Errorf(codes.InvalidArgument, "parameter %q is not supported: brokerd loads the model as its repository holds it (no config override or model files in the request)", name)
	}
	return nil
}

// RepositoryModelLoad loads (or reloads) a model through LoadModel: the
// same admission against device memory, the same hot reload.
func (k *InferenceService) RepositoryModelLoad(ctx context.Context, req *inference.RepositoryModelLoadRequest) (*inference.RepositoryModelLoadResponse, error) {
	if err := oneRepository(req.GetRepositoryName()); err != nil {
		return nil, err
	}
	if err := repositoryParameters(req.GetParameters()); err != nil {
		return nil, err
	}
	if _, err := k.b.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: req.GetModelName()}); err != nil {
		return nil, err
	}
	return &inference.RepositoryModelLoadResponse{}, nil
}

// RepositoryModelUnload unloads a model through UnloadModel: it waits for
// the model's accepted work.
func (k *InferenceService) RepositoryModelUnload(ctx context.Context, req *inference.RepositoryModelUnloadRequest) (*inference.RepositoryModelUnloadResponse, error) {
	if err := oneRepository(req.GetRepositoryName()); err != nil {
		return nil, err
	}
	for name, p := range req.GetParameters() {
		// unload_dependents has nothing to act on: brokerd models have no
		// ensembles. Its false value is what brokerd does anyway.
		if name == "unload_dependents" && !p.GetBoolParam() {
			continue
		}
		return nil, status.Errorf(codes.InvalidArgument, "parameter %q is not supported (brokerd has no model ensembles)", name)
	}
	if _, err := k.b.UnloadModel(ctx, &brokerv1.UnloadModelRequest{Name: req.GetModelName()}); err != nil {
		return nil, err
	}
	return &inference.RepositoryModelUnloadResponse{}, nil
}

// LogSettings reports brokerd's logging in Triton's settings and changes
// its level: log_info, log_warning and log_error switch the levels on or
// off (the lowest one on is the level), log_verbose_level > 0 turns debug
// on. log_file and log_format cannot change while brokerd runs.
func (k *InferenceService) LogSettings(ctx context.Context, req *inference.LogSettingsRequest) (*inference.LogSettingsResponse, error) {
	lvl := k.b.log.Level()
	if len(req.GetSettings()) > 0 {
		if k.opts.LogLevel == nil {
			return nil, status.Error(codes.FailedPrecondition, "this brokerd's log level is fixed")
		}
		next, err := logLevelFrom(lvl, req.GetSettings())
		if err != nil {
			return nil, err
		}
		k.opts.LogLevel.SetLevel(next)
		k.b.log.Info("log level changed", zap.Stringer("from", lvl), zap.Stringer("to", next), zap.String("by", clientID(ctx)))
		lvl = next
	}
	b := func(v bool) *inference.LogSettingsResponse_SettingValue {
		return &inference.LogSettingsResponse_SettingValue{ParameterChoice: &inference.LogSettingsResponse_SettingValue_BoolParam{BoolParam: v}}
	}
	verbose := uint32(0)
	if lvl <= zapcore.DebugLevel {
		verbose = 1
	}
	return &inference.LogSettingsResponse{Settings: map[string]*inference.LogSettingsResponse_SettingValue{
		"log_info": b(lvl <= zapcore.InfoLevel), "log_warning": b(lvl <= zapcore.WarnLevel), "log_error": b(lvl <= zapcore.ErrorLevel),
		"log_verbose_level": {ParameterChoice: &inference.LogSettingsResponse_SettingValue_Uint32Param{Uint32Param: verbose}},
		"log_file":          {ParameterChoice: &inference.LogSettingsResponse_SettingValue_StringParam{StringParam: ""}},
		"log_format":        {ParameterChoice: &inference.LogSettingsResponse_SettingValue_StringParam{StringParam: "default"}},
	}}, nil
}

// logLevelFrom applies Triton's log settings to the current level.
func logLevelFrom(cur zapcore.Level, settings map[string]*inference.LogSettingsRequest_SettingValue) (zapcore.Level, error) {
	on := map[zapcore.Level]bool{}
	for _, l := range []zapcore.Level{zapcore.DebugLevel, zapcore.InfoLevel, zapcore.WarnLevel, zapcore.ErrorLevel} {
		on[l] = cur <= l
	}
	for name, v := range settings {
		bp, isBool := v.GetParameterChoice().(*inference.LogSettingsRequest_SettingValue_BoolParam)
		switch name {
		case "log_info", "log_warning", "log_error":
			if !isBool {
				return cur, status.Errorf(codes.InvalidArgument, "%s: want a bool_param", name)
			}
			on[map[string]zapcore.Level{"log_info": zapcore.InfoLevel, "log_warning": zapcore.WarnLevel, "log_error": zapcore.ErrorLevel}[name]] = bp.BoolParam
		case "log_verbose_level":
			u, ok := v.GetParameterChoice().(*inference.LogSettingsRequest_SettingValue_Uint32Param)
			if !ok {
				return cur, status.Errorf(codes.InvalidArgument, "%s: want a uint32_param", name)
			}
			on[zapcore.DebugLevel] = u.Uint32Param > 0
		default:
			return cur, status.Errorf(codes.InvalidArgument, "log setting %q cannot change while brokerd runs (it reads log_info, log_warning, log_error and log_verbose_level)", name)
		}
	}
	for _, l := range []zapcore.Level{zapcore.DebugLevel, zapcore.InfoLevel, zapcore.WarnLevel, zapcore.ErrorLevel} {
		if on[l] {
			return l, nil
		}
	}
	return zapcore.DPanicLevel, nil // errors off too: only what would crash brokerd
}

// TraceSetting: brokerd has no per-request trace; ExecutionInfo (in every
// response's parameters) and the metrics say where each request went.
func (k *InferenceService) TraceSetting(context.Context, *inference.TraceSettingRequest) (*inference.TraceSettingResponse, error) {
	return nil, status.Error(codes.Unimplemented, "brokerd has no request tracing: each response's parameters (device_id, batch_size, queue_ns, compute_ns) and its Prometheus metrics say where a request went and how long it took")
}

const noSharedMemory = "brokerd does not map client shared memory: send tensors in the request (raw_input_contents or contents)"

func (k *InferenceService) SystemSharedMemoryStatus(context.Context, *inference.SystemSharedMemoryStatusRequest) (*inference.SystemSharedMemoryStatusResponse, error) {
	return nil, status.Error(codes.Unimplemented, noSharedMemory)
}
func (k *InferenceService) SystemSharedMemoryRegister(context.Context, *inference.SystemSharedMemoryRegisterRequest) (*inference.SystemSharedMemoryRegisterResponse, error) {
	return nil, status.Error(codes.Unimplemented, noSharedMemory)
}
func (k *InferenceService) SystemSharedMemoryUnregister(context.Context, *inference.SystemSharedMemoryUnregisterRequest) (*inference.SystemSharedMemoryUnregisterResponse, error) {
	return nil, status.Error(codes.Unimplemented, noSharedMemory)
}
func (k *InferenceService) CudaSharedMemoryStatus(context.Context, *inference.CudaSharedMemoryStatusRequest) (*inference.CudaSharedMemoryStatusResponse, error) {
	return nil, status.Error(codes.Unimplemented, noSharedMemory)
}
func (k *InferenceService) CudaSharedMemoryRegister(context.Context, *inference.CudaSharedMemoryRegisterRequest) (*inference.CudaSharedMemoryRegisterResponse, error) {
	return nil, status.Error(codes.Unimplemented, noSharedMemory)
}
func (k *InferenceService) CudaSharedMemoryUnregister(context.Context, *inference.CudaSharedMemoryUnregisterRequest) (*inference.CudaSharedMemoryUnregisterResponse, error) {
	return nil, status.Error(codes.Unimplemented, noSharedMemory)
}

// maxStreamInFlight bounds the requests of one ModelStreamInfer stream
// running at once; the stream stops reading until one finishes.
const maxStreamInFlight = 64

// ModelStreamInfer is Triton's decoupled stream: requests run as they
// arrive, concurrently, and each response carries its request's id. A
// request that fails answers error_message on the stream, which stays
// open. Generator models stream Triton's text generation (text_input →
// text_output, a response per delta with stream=true). When the client
// goes, its requests' work is cancelled.
func (k *InferenceService) ModelStreamInfer(stream inference.GRPCInferenceService_ModelStreamInferServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	var (
		sendMu  sync.Mutex
		sendErr error
		wg      sync.WaitGroup
	)
	send := func(r *inference.ModelStreamInferResponse) {
		sendMu.Lock()
		defer sendMu.Unlock()
		if sendErr == nil {
			if sendErr = stream.Send(r); sendErr != nil {
				cancel()
			}
		}
	}
	// Receive in a goroutine of its own, one message ahead at most, so a
	// failed send (a client that stopped reading: pacedSends) ends the
	// call even while the client sends nothing more.
	type received struct {
		req     *inference.ModelInferRequest
		release func() // the message's in-flight charge (messageCharge)
		err     error
	}
	msgs := make(chan received)
	go func() {
		for {
			req := new(inference.ModelInferRequest)
			err := stream.RecvMsg(req)
			r := received{req: req, err: err}
			if err == nil {
				r.release = messageCharge(stream.Context())
			}
			select {
			case msgs <- r:
			case <-ctx.Done():
				if r.release != nil {
					r.release()
				}
				return
			}
			if err != nil && !errors.As(err, &budgetRefusal{}) {
				return
			}
		}
	}()
	slots := make(chan struct{}, maxStreamInFlight)
	defer wg.Wait()
	for {
		var r received
		select {
		case r = <-msgs:
		case <-ctx.Done():
			return streamEnd(ctx, &sendMu, &sendErr)
		}
		if errors.Is(r.err, io.EOF) {
			return nil // wg.Wait: every accepted request is answered
		}
		// A request the in-flight budget refused is that request's
		// answer, as Triton answers a request it cannot run; only what
		// breaks the stream (a message that does not parse, transport)
		// ends it.
		if refused := (budgetRefusal{}); errors.As(r.err, &refused) {
			send(errorResponse(r.req, refused))
			continue
		}
		if r.err != nil {
			return r.err
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			r.release()
			return streamEnd(ctx, &sendMu, &sendErr)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			defer r.release()
			k.streamOne(ctx, r.req, send)
		}()
	}
}

// streamEnd is the error a stream ends with once its context is done: the
// send that failed, else the context's.
func streamEnd(ctx context.Context, mu *sync.Mutex, sendErr *error) error {
	mu.Lock()
	defer mu.Unlock()
	if *sendErr != nil {
		return *sendErr
	}
	return ctx.Err()
}

// errorResponse is a stream's answer to a request that failed with err:
// error_message, and the request's id so the client knows which.
func errorResponse(req *inference.ModelInferRequest, err error) *inference.ModelStreamInferResponse {
	st := status.Convert(err)
	return &inference.ModelStreamInferResponse{ErrorMessage: fmt.Sprintf("%s: %s", st.Code(), st.Message()),
		InferResponse: &inference.ModelInferResponse{ModelName: req.GetModelName(), ModelVersion: req.GetModelVersion(), Id: req.GetId()}}
}

// streamOne answers one request of a stream.
func (k *InferenceService) streamOne(ctx context.Context, req *inference.ModelInferRequest, send func(*inference.ModelStreamInferResponse)) {
	fail := func(err error) { send(errorResponse(req, err)) }
	// A panic here is in a goroutine of the stream's, which the stream
	// interceptor's recover does not cover: answered as the unary call's.
	defer func() {
		if p := recover(); p != nil {
			k.b.log.Error("panic in a ModelStreamInfer request", zap.String("model", req.GetModelName()),
				zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
			fail(status.Error(codes.Internal, "internal error in ModelStreamInfer (logged by brokerd)"))
		}
	}()
	if sv := k.lookupGenerator(req.GetModelName()); sv != nil {
		if err := k.streamGenerate(ctx, req, send); err != nil {
			fail(err)
		}
		return
	}
	resp, err := k.ModelInfer(ctx, req)
	if err != nil {
		fail(err)
		return
	}
	send(&inference.ModelStreamInferResponse{InferResponse: resp})
}

// lookupGenerator returns the served model name if it is a generator.
func (k *InferenceService) lookupGenerator(name string) *lifecycle.Served {
	if k.b.models == nil {
		return nil
	}
	if sv := k.b.models.Lookup(name); sv != nil && k.b.generator(sv) != nil {
		return sv
	}
	return nil
}

// generatorInputs are the inputs of Triton's text generation and their
// datatypes.
var generatorInputs = map[string]string{
	"text_input": "BYTES", "stream": "BOOL", "exclude_input_in_output": "BOOL", "sampling_parameters": "BYTES",
}

// streamGenerate runs one generation request in Triton's text
// generation convention (as its vLLM backend): text_input (BYTES, one
// element), optional stream (BOOL) and sampling_parameters (a JSON object
// of broker.v1 SamplingParams fields: temperature, top_p, top_k, min_p,
// max_tokens, seed, stop, ...), optional exclude_input_in_output (BOOL);
// text_output (BYTES) answers. With stream true each delta is a response;
// the last response of a request has the triton_final_response parameter
// true.
func (k *InferenceService) streamGenerate(ctx context.Context, req *inference.ModelInferRequest, send func(*inference.ModelStreamInferResponse)) error {
	var (
		text      string
		hasText   bool
		streaming bool
		exclude   bool
		sp        = &brokerv1.SamplingParams{}
	)
	raw := req.GetRawInputContents()
	if len(raw) > 0 && len(raw) != len(req.GetInputs()) {
		return status.Errorf(codes.InvalidArgument, "raw_input_contents has %d entries for %d inputs", len(raw), len(req.GetInputs()))
	}
	for i, in := range req.GetInputs() {
		var r []byte
		if len(raw) > 0 {
			r = raw[i]
		}
		// The name and datatype before typed contents are converted (they
		// can grow eightfold, one-byte varints to INT64), as ModelInfer
		// checks them against the model's.
		dtype, ok := generatorInputs[in.GetName()]
		if !ok {
			return status.Errorf(codes.InvalidArgument, "input %q is not an input of a generator (text_input, stream, sampling_parameters, exclude_input_in_output)", in.GetName())
		}
		if in.GetDatatype() != dtype {
			return status.Errorf(codes.InvalidArgument, "input %q: want %s, got %s", in.GetName(), dtype, in.GetDatatype())
		}
		if n, err := elements(&tensor{name: in.GetName(), shape: in.GetShape()}); err != nil {
			return err
		} else if n != 1 {
			return status.Errorf(codes.InvalidArgument, "input %q: want one %s element, got shape %s", in.GetName(), dtype, shapeString(in.GetShape()))
		}
		t, err := fromKServe(in, r, len(raw) > 0)
		if err != nil {
			return err
		}
		var b []byte
		if dtype == "BOOL" {
			if len(t.data) != 1 {
				return status.Errorf(codes.InvalidArgument, "input %q: want one BOOL", t.name)
			}
			b = t.data
		} else {
			elems, err := splitBytes(&t, 1)
			if err != nil {
				return err
			}
			b = elems[0]
		}
		switch t.name {
		case "text_input":
			text, hasText = string(b), true
		case "stream":
			streaming = b[0] != 0
		case "exclude_input_in_output":
			exclude = b[0] != 0
		case "sampling_parameters":
			if err := protojson.Unmarshal(b, sp); err != nil {
				return status.Errorf(codes.InvalidArgument, "sampling_parameters: %v", err)
			}
			if sp.GetN() > 1 {
				return status.Errorf(codes.InvalidArgument, "sampling_parameters: n %d: one answer per request here (text_output is one element); send n requests, or use Generate or the OpenAI API", sp.GetN())
			}
		}
	}
	if !hasText || text == "" {
		return status.Error(codes.InvalidArgument, "text_input is required: one non-empty BYTES element")
	}
	for _, o := range req.GetOutputs() {
		if o.GetName() != "text_output" {
			return status.Errorf(codes.InvalidArgument, "output %q is not an output of a generator (text_output)", o.GetName())
		}
	}
	prio := brokerv1.Priority_PRIORITY_NORMAL
	for name, p := range req.GetParameters() {
		if name != "priority" {
			return status.Errorf(codes.InvalidArgument, "parameter %q is not supported for generation (brokerd reads priority)", name)
		}
		n, err := tritonPriority(p)
		if err != nil {
			return err
		}
		prio = map[int]brokerv1.Priority{1: brokerv1.Priority_PRIORITY_LOW, 2: brokerv1.Priority_PRIORITY_NORMAL, 3: brokerv1.Priority_PRIORITY_HIGH}[n]
	}
	s := k.b
	if len(text) > s.limits.MaxItemBytes {
		return status.Errorf(codes.InvalidArgument, "text_input is %d bytes; the limit is %d (--max-item-bytes)", len(text), s.limits.MaxItemBytes)
	}
	call, release, err := s.newGenCall(ctx, "ModelStreamInfer", req.GetModelName(), 1, sp, prio, brokerv1.DeviceType_DEVICE_TYPE_UNSPECIFIED, "", nil)
	if err != nil {
		return err
	}
	defer release()
	toks, err := call.gm.EncodePrompt(text, true)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "text_input: %v", err)
	}
	version := strconv.FormatInt(call.sv.Info.Version, 10)
	respond := func(out string, final bool, extra map[string]*inference.InferParameter) {
		params := map[string]*inference.InferParameter{
			"triton_final_response": {ParameterChoice: &inference.InferParameter_BoolParam{BoolParam: final}}}
		maps.Copy(params, extra)
		send(&inference.ModelStreamInferResponse{InferResponse: &inference.ModelInferResponse{
			ModelName: req.GetModelName(), ModelVersion: version, Id: req.GetId(), Parameters: params,
			Outputs:           []*inference.ModelInferResponse_InferOutputTensor{{Name: "text_output", Datatype: "BYTES", Shape: []int64{1}}},
			RawOutputContents: [][]byte{joinBytes([][]byte{[]byte(out)})},
		}})
	}
	var full strings.Builder
	if !streaming && !exclude {
		full.WriteString(text)
	}
	return call.run(ctx, [][]int32{toks}, func(d []*brokerv1.GenerationDelta, r []*brokerv1.GenerationResult) error {
		for _, x := range d {
			if streaming {
				if x.GetText() != "" {
					respond(x.GetText(), false, nil)
				}
				continue
			}
			full.WriteString(x.GetText())
		}
		for _, x := range r {
			extra := map[string]*inference.InferParameter{
				"finish_reason":     {ParameterChoice: &inference.InferParameter_StringParam{StringParam: strings.ToLower(strings.TrimPrefix(x.GetFinishReason().String(), "FINISH_REASON_"))}},
				"prompt_tokens":     {ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: int64(x.GetUsage().GetPromptTokens())}},
				"completion_tokens": {ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: int64(x.GetUsage().GetCompletionTokens())}},
				"device_id":         {ParameterChoice: &inference.InferParameter_StringParam{StringParam: x.GetExecution().GetDeviceId()}},
			}
			out := ""
			if !streaming {
				out = full.String()
			}
			respond(out, true, extra)
		}
		return nil
	})
}
