package daemon

import (
	"errors"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
	"github.com/brokerd/brokerd/server/config"
)

// Triton semantics of ModelInfer's parameters and requested outputs, with
// a client generated from Triton's own grpc_service.proto.
func TestKServeOutputsAndParameters(t *testing.T) {
	var ref *mlpRef
	d, _ := modelDaemon(t, func(repo string) { ref = writeMLP(t, repo, "mlp", 1, 1, 6, 16, 5) },
		func(cfg *config.Config) { cfg.LoadModels = "mlp" })
	k := inference.NewGRPCInferenceServiceClient(d.conn)
	ctx := testCtx(t)
	rows := randRows(5, 3, 6)
	var flat []float32
	for _, r := range rows {
		flat = append(flat, r...)
	}
	input := []*inference.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{3, 6}}}
	raw := [][]byte{f32le(flat)}
	i64 := func(n int64) *inference.InferParameter {
		return &inference.InferParameter{ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: n}}
	}
	u64 := func(n uint64) *inference.InferParameter {
		return &inference.InferParameter{ParameterChoice: &inference.InferParameter_Uint64Param{Uint64Param: n}}
	}
	out := func(name string, params map[string]*inference.InferParameter) *inference.ModelInferRequest_InferRequestedOutputTensor {
		return &inference.ModelInferRequest_InferRequestedOutputTensor{Name: name, Parameters: params}
	}

	t.Run("classification", func(t *testing.T) {
		for _, k2 := range []int{2, 5, 9} {
			resp, err := k.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "mlp", Inputs: input, RawInputContents: raw,
				Outputs: []*inference.ModelInferRequest_InferRequestedOutputTensor{out("output", map[string]*inference.InferParameter{"classification": u64(uint64(k2))})}})
			if err != nil {
				t.Fatal(err)
			}
			want := min(k2, 5) // a count above the classes returns them all
			o := resp.GetOutputs()[0]
			if o.GetDatatype() != "BYTES" || !slices.Equal(o.GetShape(), []int64{3, int64(want)}) {
				t.Fatalf("k=%d: output %v", k2, o)
			}
			elems, err := fromBytesLE(resp.GetRawOutputContents()[0], 3*want)
			if err != nil {
				t.Fatal(err)
			}
			for r, row := range rows {
				y := ref.forward(row)
				order := []int{0, 1, 2, 3, 4}
				slices.SortStableFunc(order, func(a, b int) int {
					switch {
					case y[a] > y[b]:
						return -1
					case y[a] < y[b]:
						return 1
					}
					return 0
				})
				for j := range want {
					valStr, idxStr, ok := strings.Cut(string(elems[r*want+j]), ":")
					v, err1 := strconv.ParseFloat(valStr, 64)
					idx, err2 := strconv.Atoi(idxStr)
					if !ok || err1 != nil || err2 != nil {
						t.Fatalf("row %d: %q is not value:index", r, elems[r*want+j])
					}
					if idx != order[j] || math.Abs(v-y[idx]) > 1e-4*(1+math.Abs(y[idx])) {
						t.Errorf("k=%d row %d rank %d: %q, want index %d value %.6f", k2, r, j, elems[r*want+j], order[j], y[order[j]])
					}
				}
			}
		}
	})

	tests := []struct {
		name    string
		params  map[string]*inference.InferParameter
		outputs []*inference.ModelInferRequest_InferRequestedOutputTensor
		code    codes.Code
		msg     []string
	}{
		{"output twice", nil, []*inference.ModelInferRequest_InferRequestedOutputTensor{out("output", nil), out("output", nil)},
			codes.InvalidArgument, []string{`output "output" is requested twice`}},
		{"unknown output parameter", nil, []*inference.ModelInferRequest_InferRequestedOutputTensor{out("output", map[string]*inference.InferParameter{"binary_data": {ParameterChoice: &inference.InferParameter_BoolParam{BoolParam: true}}})},
			codes.InvalidArgument, []string{`parameter "binary_data" is not supported`}},
		{"classification zero", nil, []*inference.ModelInferRequest_InferRequestedOutputTensor{out("output", map[string]*inference.InferParameter{"classification": i64(0)})},
			codes.InvalidArgument, []string{"classification"}},
		{"unknown output", nil, []*inference.ModelInferRequest_InferRequestedOutputTensor{out("probs", nil)},
			codes.InvalidArgument, []string{`output "probs" is not an output`}},
		{"unknown request parameter", map[string]*inference.InferParameter{"my_backend_knob": i64(3)}, nil,
			codes.InvalidArgument, []string{`parameter "my_backend_knob" is not supported`}},
		{"sequence batching", map[string]*inference.InferParameter{"sequence_id": u64(7)}, nil,
			codes.InvalidArgument, []string{"no sequence batching"}},
		{"negative timeout", map[string]*inference.InferParameter{"timeout": i64(-1)}, nil,
			codes.InvalidArgument, []string{"timeout"}},
		{"timeout expires", map[string]*inference.InferParameter{"timeout": u64(1)}, nil,
			codes.DeadlineExceeded, nil},
		{"timeout long enough", map[string]*inference.InferParameter{"timeout": u64(30_000_000)}, nil, codes.OK, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := k.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "mlp", Inputs: input, RawInputContents: raw,
				Parameters: tt.params, Outputs: tt.outputs})
			if tt.code == codes.OK {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantCode(t, err, tt.code, tt.msg...)
		})
	}
}

// Triton's RPCs beyond the core: configuration, statistics, repository,
// log settings, the refusals, and the decoupled stream, through the client
// generated from Triton's grpc_service.proto.
func TestTritonExtensions(t *testing.T) {
	d, _ := modelDaemon(t, func(repo string) {
		writeMLP(t, repo, "mlp", 1, 1, 6, 16, 5)
		writeMLP(t, repo, "idle", 2, 2, 4, 8, 2)
	}, func(cfg *config.Config) {
		cfg.LoadModels = "mlp"
		cfg.MaxQueueDelay = config.Duration(3 * time.Millisecond)
	})
	k := inference.NewGRPCInferenceServiceClient(d.conn)
	ctx := testCtx(t)
	rows := randRows(9, 4, 6)
	var flat []float32
	for _, r := range rows {
		flat = append(flat, r...)
	}
	infer := &inference.ModelInferRequest{ModelName: "mlp",
		Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{4, 6}}},
		RawInputContents: [][]byte{f32le(flat)}}

	t.Run("model config", func(t *testing.T) {
		resp, err := k.ModelConfig(ctx, &inference.ModelConfigRequest{Name: "mlp"})
		if err != nil {
			t.Fatal(err)
		}
		c := resp.GetConfig()
		db := c.GetDynamicBatching()
		if c.GetName() != "mlp" || c.GetMaxBatchSize() <= 0 || len(c.GetInput()) != 1 || c.GetInput()[0].GetDataType() != inference.DataType_TYPE_FP32 ||
			!slices.Equal(c.GetInput()[0].GetDims(), []int64{6}) || !slices.Equal(c.GetOutput()[0].GetDims(), []int64{5}) ||
			db.GetMaxQueueDelayMicroseconds() != 3000 || !slices.Equal(db.GetPreferredBatchSize(), []int32{c.GetMaxBatchSize()}) ||
			len(c.GetInstanceGroup()) != 1 || c.GetInstanceGroup()[0].GetKind() != inference.ModelInstanceGroup_KIND_CPU || c.GetInstanceGroup()[0].GetCount() != 1 {
			t.Errorf("config %v", c)
		}
		_, err = k.ModelConfig(ctx, &inference.ModelConfigRequest{Name: "nope"})
		wantCode(t, err, codes.NotFound, "nope")
		_, err = k.ModelConfig(ctx, &inference.ModelConfigRequest{Name: "mlp", Version: "2"})
		wantCode(t, err, codes.NotFound, "mlp version 2 not found: the model repository holds version(s) 1")
	})

	t.Run("statistics", func(t *testing.T) {
		for range 5 {
			if _, err := k.ModelInfer(ctx, infer); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := k.ModelStatistics(ctx, &inference.ModelStatisticsRequest{Name: "mlp"})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetModelStats()) != 1 {
			t.Fatalf("stats %v", resp)
		}
		ms := resp.GetModelStats()[0]
		st := ms.GetInferenceStats()
		var batched uint64
		for _, b := range ms.GetBatchStats() {
			batched += b.GetBatchSize() * b.GetComputeInfer().GetCount()
			if b.GetComputeInfer().GetNs() == 0 {
				t.Errorf("batch size %d: no compute time", b.GetBatchSize())
			}
		}
		if ms.GetVersion() != "1" || ms.GetInferenceCount() != 20 || ms.GetExecutionCount() == 0 || st.GetSuccess().GetCount() != 5 ||
			st.GetSuccess().GetNs() == 0 || st.GetQueue().GetCount() != 5 || st.GetComputeInfer().GetNs() == 0 ||
			st.GetSuccess().GetNs() < st.GetComputeInfer().GetNs() || batched != 20 || ms.GetLastInference() == 0 {
			t.Errorf("statistics %v", ms)
		}
		all, err := k.ModelStatistics(ctx, &inference.ModelStatisticsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, m := range all.GetModelStats() {
			names = append(names, m.GetName())
		}
		if !slices.Equal(names, []string{"mlp", "nbmf-hash-v1"}) {
			t.Errorf("all statistics name %v", names)
		}
	})

	index := func(ready bool) map[string]*inference.RepositoryIndexResponse_ModelIndex {
		t.Helper()
		resp, err := k.RepositoryIndex(ctx, &inference.RepositoryIndexRequest{Ready: ready})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*inference.RepositoryIndexResponse_ModelIndex{}
		for _, m := range resp.GetModels() {
			out[m.GetName()] = m
		}
		return out
	}
	t.Run("repository", func(t *testing.T) {
		idx := index(false)
		if idx["mlp"].GetState() != "READY" || idx["mlp"].GetVersion() != "1" || idx["idle"].GetState() != "UNAVAILABLE" || idx["idle"].GetReason() == "" {
			t.Errorf("index %v", idx)
		}
		if ready := index(true); ready["idle"] != nil || ready["mlp"] == nil {
			t.Errorf("ready index %v", ready)
		}
		if _, err := k.RepositoryModelLoad(ctx, &inference.RepositoryModelLoadRequest{ModelName: "idle"}); err != nil {
			t.Fatal(err)
		}
		if s := index(false)["idle"]; s.GetState() != "READY" || s.GetVersion() != "2" {
			t.Errorf("after the load: %v", s)
		}
		if _, err := k.RepositoryModelUnload(ctx, &inference.RepositoryModelUnloadRequest{ModelName: "idle"}); err != nil {
			t.Fatal(err)
		}
		if s := index(false)["idle"]; s.GetState() != "UNAVAILABLE" {
			t.Errorf("after the unload: %v", s)
		}
		refusals := []struct {
			name string
			call func() error
			code codes.Code
			msg  string
		}{
			{"load unknown", func() error {
				_, err := k.RepositoryModelLoad(ctx, &inference.RepositoryModelLoadRequest{ModelName: "nope"})
				return err
			}, codes.NotFound, "nope"},
			{"load with a config override", func() error {
				_, err := k.RepositoryModelLoad(ctx, &inference.RepositoryModelLoadRequest{ModelName: "idle",
					Parameters: map[string]*inference.ModelRepositoryParameter{"config": {ParameterChoice: &inference.ModelRepositoryParameter_StringParam{StringParam: "{}"}}}})
				return err
			}, codes.InvalidArgument, `parameter "config" is not supported`},
			{"another repository", func() error {
				_, err := k.RepositoryIndex(ctx, &inference.RepositoryIndexRequest{RepositoryName: "other"})
				return err
			}, codes.NotFound, "one model repository"},
			{"unload the built-in", func() error {
				_, err := k.RepositoryModelUnload(ctx, &inference.RepositoryModelUnloadRequest{ModelName: "nbmf-hash-v1"})
				return err
			}, codes.FailedPrecondition, "built in"},
		}
		for _, r := range refusals {
			t.Run(r.name, func(t *testing.T) { wantCode(t, r.call(), r.code, r.msg) })
		}
	})

	t.Run("log settings", func(t *testing.T) {
		resp, err := k.LogSettings(ctx, &inference.LogSettingsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := resp.GetSettings()["log_info"]; !ok {
			t.Errorf("settings %v", resp.GetSettings())
		}
		// The test daemon's level is fixed (no Options.LogLevel).
		_, err = k.LogSettings(ctx, &inference.LogSettingsRequest{Settings: map[string]*inference.LogSettingsRequest_SettingValue{
			"log_verbose_level": {ParameterChoice: &inference.LogSettingsRequest_SettingValue_Uint32Param{Uint32Param: 1}}}})
		wantCode(t, err, codes.FailedPrecondition, "fixed")
	})

	t.Run("not implemented, and why", func(t *testing.T) {
		_, err := k.SystemSharedMemoryRegister(ctx, &inference.SystemSharedMemoryRegisterRequest{Name: "r", Key: "/k", ByteSize: 64})
		wantCode(t, err, codes.Unimplemented, "shared memory")
		_, err = k.CudaSharedMemoryStatus(ctx, &inference.CudaSharedMemoryStatusRequest{})
		wantCode(t, err, codes.Unimplemented, "shared memory")
		_, err = k.TraceSetting(ctx, &inference.TraceSettingRequest{})
		wantCode(t, err, codes.Unimplemented, "tracing")
	})

	t.Run("stream", func(t *testing.T) {
		st, err := k.ModelStreamInfer(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids := []string{"a", "bad", "b", "c"}
		for _, id := range ids {
			req := proto.Clone(infer).(*inference.ModelInferRequest)
			req.Id = id
			if id == "bad" {
				req.ModelName = "nope"
			}
			if err := st.Send(req); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.CloseSend(); err != nil {
			t.Fatal(err)
		}
		got := map[string]*inference.ModelStreamInferResponse{}
		for {
			r, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got[r.GetInferResponse().GetId()] = r
		}
		if len(got) != len(ids) {
			t.Fatalf("%d responses for %d requests: %v", len(got), len(ids), got)
		}
		for _, id := range []string{"a", "b", "c"} {
			r := got[id]
			if r.GetErrorMessage() != "" || len(r.GetInferResponse().GetRawOutputContents()) != 1 {
				t.Errorf("%s: %v", id, r)
			}
		}
		if msg := got["bad"].GetErrorMessage(); !strings.Contains(msg, "NotFound") || !strings.Contains(msg, "nope") {
			t.Errorf("bad request's error: %q", msg)
		}
	})
}

// A generator through ModelStreamInfer in Triton's text generation
// convention gives the text broker.v1 Generate gives.
func TestTritonStreamGeneration(t *testing.T) {
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.LoadModels = "tiny-llm"
	writeTinyLlama(t, cfg.ModelRepo, "tiny-llm")
	d := startDaemonWith(t, Options{Config: cfg, Tokenizers: byteTokenizers})
	ctx := testCtx(t)
	const prompt = "the council meets"
	gen, err := brokerv1.NewBrokerServiceClient(d.conn).Generate(ctx, &brokerv1.GenerateRequest{Model: "tiny-llm", Prompts: []string{prompt},
		Sampling: &brokerv1.SamplingParams{Temperature: new(float32), MaxTokens: 10, IgnoreEos: true}})
	if err != nil {
		t.Fatal(err)
	}
	var want string
	for {
		m, err := gen.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, dl := range m.GetDeltas() {
			want += dl.GetText()
		}
	}

	k := inference.NewGRPCInferenceServiceClient(d.conn)
	bytesIn := func(name, v string) *inference.ModelInferRequest_InferInputTensor {
		return &inference.ModelInferRequest_InferInputTensor{Name: name, Datatype: "BYTES", Shape: []int64{1},
			Contents: &inference.InferTensorContents{BytesContents: [][]byte{[]byte(v)}}}
	}
	boolIn := func(name string, v bool) *inference.ModelInferRequest_InferInputTensor {
		return &inference.ModelInferRequest_InferInputTensor{Name: name, Datatype: "BOOL", Shape: []int64{1},
			Contents: &inference.InferTensorContents{BoolContents: []bool{v}}}
	}
	sampling := bytesIn("sampling_parameters", `{"temperature": 0, "max_tokens": 10, "ignore_eos": true}`)
	run := func(reqs ...*inference.ModelInferRequest) map[string][]*inference.ModelStreamInferResponse {
		t.Helper()
		st, err := k.ModelStreamInfer(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reqs {
			if err := st.Send(r); err != nil {
				t.Fatal(err)
			}
		}
		st.CloseSend()
		got := map[string][]*inference.ModelStreamInferResponse{}
		for {
			r, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return got
			}
			if err != nil {
				t.Fatal(err)
			}
			got[r.GetInferResponse().GetId()] = append(got[r.GetInferResponse().GetId()], r)
		}
	}
	text := func(r *inference.ModelStreamInferResponse) string {
		raw := r.GetInferResponse().GetRawOutputContents()
		if len(raw) != 1 || len(raw[0]) < 4 {
			t.Fatalf("response %v", r)
		}
		return string(raw[0][4:])
	}
	final := func(r *inference.ModelStreamInferResponse) bool {
		return r.GetInferResponse().GetParameters()["triton_final_response"].GetBoolParam()
	}
	got := run(
		&inference.ModelInferRequest{ModelName: "tiny-llm", Id: "streamed", Inputs: []*inference.ModelInferRequest_InferInputTensor{bytesIn("text_input", prompt), boolIn("stream", true), sampling}},
		&inference.ModelInferRequest{ModelName: "tiny-llm", Id: "whole", Inputs: []*inference.ModelInferRequest_InferInputTensor{bytesIn("text_input", prompt), sampling}},
		&inference.ModelInferRequest{ModelName: "tiny-llm", Id: "bare", Inputs: []*inference.ModelInferRequest_InferInputTensor{bytesIn("text_input", prompt), boolIn("exclude_input_in_output", true), sampling}},
		&inference.ModelInferRequest{ModelName: "tiny-llm", Id: "bad", Inputs: []*inference.ModelInferRequest_InferInputTensor{bytesIn("text_input", prompt), bytesIn("sampling_parameters", `{"temperature": -1}`)}},
		&inference.ModelInferRequest{ModelName: "tiny-llm", Id: "unknown", Inputs: []*inference.ModelInferRequest_InferInputTensor{bytesIn("prompt", prompt)}},
		&inference.ModelInferRequest{ModelName: "tiny-llm", Id: "n", Inputs: []*inference.ModelInferRequest_InferInputTensor{bytesIn("text_input", prompt), bytesIn("sampling_parameters", `{"n": 2}`)}},
	)
	streamed := got["streamed"]
	var joined string
	for i, r := range streamed {
		if last := i == len(streamed)-1; final(r) != last {
			t.Errorf("streamed response %d of %d: final %v", i, len(streamed), final(r))
		}
		joined += text(r)
	}
	if len(streamed) < 3 || joined != want {
		t.Errorf("streamed %d responses, text %q; Generate gave %q", len(streamed), joined, want)
	}
	if w := got["whole"]; len(w) != 1 || !final(w[0]) || text(w[0]) != prompt+want ||
		w[0].GetInferResponse().GetParameters()["completion_tokens"].GetInt64Param() != 10 {
		t.Errorf("whole: %v", w)
	}
	if b := got["bare"]; len(b) != 1 || text(b[0]) != want {
		t.Errorf("exclude_input_in_output: %v", b)
	}
	for _, id := range []string{"bad", "unknown", "n"} {
		if r := got[id]; len(r) != 1 || !strings.Contains(r[0].GetErrorMessage(), "InvalidArgument") {
			t.Errorf("%s: %v", id, r)
		}
	}
}

// An unknown model is NOT_FOUND whatever else is wrong with the request,
// and so is a version the repository does not hold; a version it holds
// that does not serve is FAILED_PRECONDITION (not loaded), as in Triton.
func TestTritonUnknownModelNotFound(t *testing.T) {
	d, _ := modelDaemon(t, func(repo string) {
		writeMLP(t, repo, "mlp", 1, 1, 6, 16, 5)
		writeMLP(t, repo, "mlp", 2, 2, 6, 16, 5)
		writeMLP(t, repo, "idle", 1, 3, 4, 8, 2)
	}, func(cfg *config.Config) { cfg.LoadModels = "mlp" })
	k := inference.NewGRPCInferenceServiceClient(d.conn)
	ctx := testCtx(t)
	meta, err := k.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "mlp"})
	if err != nil {
		t.Fatal(err)
	}
	serving := meta.GetVersions()[0]
	other := map[string]string{"1": "2", "2": "1"}[serving]
	good := func(name, version string) *inference.ModelInferRequest {
		return &inference.ModelInferRequest{ModelName: name, ModelVersion: version,
			Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{1, 6}}},
			RawInputContents: [][]byte{f32le(make([]float32, 6))}}
	}
	bogus := map[string]*inference.InferParameter{"sequence_id": {ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: 1}}}
	for _, tt := range []struct {
		name string
		req  *inference.ModelInferRequest
		code codes.Code
		msg  string
	}{
		{"unknown model", good("nope", ""), codes.NotFound, `model "nope" not found: it is neither served (served: `},
		{"unknown model, no inputs", &inference.ModelInferRequest{ModelName: "nope"}, codes.NotFound, `"nope" not found`},
		{"unknown model, bad version", &inference.ModelInferRequest{ModelName: "nope", ModelVersion: "x1"}, codes.NotFound, `"nope" not found`},
		{"unknown model, raw contents and parameters wrong", &inference.ModelInferRequest{ModelName: "nope", Parameters: bogus,
			Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "a", Datatype: "FP32", Shape: []int64{1}}},
			RawInputContents: [][]byte{{1}, {2}}}, codes.NotFound, `"nope" not found`},
		{"version not in the repository", good("mlp", "7"), codes.NotFound, "mlp version 7 not found: the model repository holds version(s) 1, 2"},
		{"version not in the repository, no inputs", &inference.ModelInferRequest{ModelName: "mlp", ModelVersion: "7"}, codes.NotFound, "version 7 not found"},
		{"unloaded model's absent version", good("idle", "3"), codes.NotFound, "idle version 3 not found"},
		{"version in the repository, not serving", good("mlp", other), codes.FailedPrecondition, "version " + other + " is not loaded"},
		{"model in the repository, not loaded", good("idle", ""), codes.FailedPrecondition, "not loaded"},
		{"known model, bad version", good("mlp", "x1"), codes.InvalidArgument, "invalid"},
		{"known model, bad parameter", &inference.ModelInferRequest{ModelName: "mlp", Parameters: bogus,
			Inputs: good("mlp", "").GetInputs(), RawInputContents: good("mlp", "").GetRawInputContents()}, codes.InvalidArgument, "sequence"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := k.ModelInfer(ctx, tt.req)
			wantCode(t, err, tt.code, tt.msg)
			if m := status.Convert(err).Message(); strings.Count(m, "not found") > 1 {
				t.Errorf("message says \"not found\" more than once: %q", m)
			}
		})
	}
	if _, err := k.ModelInfer(ctx, good("mlp", serving)); err != nil {
		t.Errorf("the serving version: %v", err)
	}
	_, err = k.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "nope", Version: "x1"})
	wantCode(t, err, codes.NotFound, `"nope" not found`)
	_, err = k.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "mlp", Version: "7"})
	wantCode(t, err, codes.NotFound, "version 7 not found")
	_, err = k.ModelConfig(ctx, &inference.ModelConfigRequest{Name: "mlp", Version: "7"})
	wantCode(t, err, codes.NotFound, "version 7 not found")
	_, err = k.ModelConfig(ctx, &inference.ModelConfigRequest{Name: "mlp", Version: other})
	wantCode(t, err, codes.FailedPrecondition, "not loaded")
}
