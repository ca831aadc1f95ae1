package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// h100Memory is an H100 80GB's total memory as NVML reports it: 79.6 GiB.
const h100Memory = 85520809984

// fakeBroker answers the admin RPCs from canned devices, Encode with
// deterministic vectors, and records the requests it got, so tests see what
// brokerctl sent.
type fakeBroker struct {
	brokerv1.UnimplementedBrokerServiceServer

	mu          sync.Mutex
	devices     []*brokerv1.Device
	lastReport  *brokerv1.GetReportRequest
	lastPlanReq *brokerv1.GetBatchPlanRequest
	lastStats   *brokerv1.GetStatsRequest
	lastDrain   *brokerv1.DrainRequest
	// unloadDeadline: whether the last UnloadModel had a deadline.
	unloadDeadline bool

	// Encode: every call's item count, the last request, and, when
	// failEvery > 0, every failEvery-th call fails with UNAVAILABLE.
	encodeSizes  []int
	encodeFailed int
	lastEncode   *brokerv1.EncodeRequest
	failEvery    int
	texts        map[string]int // how often each text was sent
	// encodeDelay makes every Encode wait, or end with the call's context.
	encodeDelay time.Duration
}

func cannedDevices() []*brokerv1.Device {
	return []*brokerv1.Device{
		{
			Id: "cpu:0", Type: brokerv1.DeviceType_DEVICE_TYPE_CPU, Vendor: "GenuineIntel",
			Name: "Intel(R) Xeon(R) Platinum 8481C", NumaNode: 0,
			MemoryTotalBytes: 64 << 30, MemoryFreeBytes: 60 << 30, MemoryBudgetBytes: 48 << 30,
			Architecture: "x86_64", SupportsBf16: true, Runtime: "onednn", Runnable: true,
			Health: brokerv1.DeviceHealth_DEVICE_HEALTH_HEALTHY, CostPerHourUsd: 0,
			Cpu: &brokerv1.CpuInfo{
				ModelName: "Intel(R) Xeon(R) Platinum 8481C", LogicalCores: 2, EffectiveCores: 1.5,
				Flags: []string{"avx2", "avx512f", "amx_bf16"}, NumaNodes: 1, LimitSource: "cgroup v2 cpu.max",
				MemoryAvailableBytes: 60 << 30,
			},
		},
		{
			Id: "gpu:0", Type: brokerv1.DeviceType_DEVICE_TYPE_GPU, Vendor: "NVIDIA",
			Name: "NVIDIA H100 80GB HBM3", Uuid: "GPU-7d3c1c2e-1b6e-4f0e-9b8a-0c2d6f3e1a11",
			PciBusId: "0000:1b:00.0", NumaNode: 1,
			MemoryTotalBytes: h100Memory, MemoryFreeBytes: h100Memory - 600<<20, MemoryBudgetBytes: h100Memory / 4 * 3,
			ComputeCapability: "9.0", DriverVersion: "550.54.15", CudaDriverVersion: "12.4", Architecture: "Hopper",
			SupportsBf16: true, SupportsFp16: true, MultiDevice: true,
			RuntimeReason: "no PJRT plugin found",
			Health:        brokerv1.DeviceHealth_DEVICE_HEALTH_HEALTHY,
			DevicePaths:   []string{"/dev/nvidia0"}, CostPerHourUsd: 0.5,
			Telemetry: &brokerv1.Telemetry{
				MemoryUsedBytes: 600 << 20, MemoryTotalBytes: h100Memory, UtilizationPercent: 12,
				TemperatureCelsius: 34, PowerWatts: 71.5, PowerLimitWatts: 700, SmClockMhz: 1980,
				UpdatedAt: timestamppb.New(mustTime("2026-01-02T03:04:05Z")),
			},
			Gpu:        &brokerv1.GpuInfo{NvmlIndex: 0, CudaVersion: "12.4"},
			Attributes: map[string]string{"mig_mode": "disabled", "board": "SXM5"},
		},
		{
			Id: "amdgpu:0", Type: brokerv1.DeviceType_DEVICE_TYPE_AMD_GPU, Vendor: "AMD",
			Name: "gfx90a", NumaNode: -1, MemoryTotalBytes: 64 << 30,
			RuntimeReason: "no runtime adapter on this build",
			Health:        brokerv1.DeviceHealth_DEVICE_HEALTH_HEALTHY,
		},
	}
}

func (f *fakeBroker) find(id string) (*brokerv1.Device, error) {
	for _, d := range f.devices {
		if d.GetId() == id {
			return d, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "device %q not found", id)
}

func (f *fakeBroker) ListDevices(context.Context, *brokerv1.ListDevicesRequest) (*brokerv1.ListDevicesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &brokerv1.ListDevicesResponse{}
	for _, d := range f.devices {
		resp.Devices = append(resp.Devices, proto.CloneOf(d))
	}
	return resp, nil
}

func (f *fakeBroker) GetDevice(_ context.Context, req *brokerv1.GetDeviceRequest) (*brokerv1.GetDeviceResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.find(req.GetId())
	if err != nil {
		return nil, err
	}
	return &brokerv1.GetDeviceResponse{Device: proto.CloneOf(d)}, nil
}

func (f *fakeBroker) report(verbose bool) *brokerv1.GetReportResponse {
	r := &brokerv1.GetReportResponse{
		CurrentDevice: proto.CloneOf(f.devices[0]),
		Configuration: &brokerv1.Configuration{
			Prefer: "auto", AllowTpu: true, TpuBatchFactor: 128, GpuBatchFactor: 4, CpuBatchFactor: 1,
			MemoryStrategy: "balanced", MemoryFraction: 0.75,
			CostPerHourUsd: map[string]float64{"cpu": 0, "gpu": 0.5, "tpu": 2},
		},
		Runtimes: []*brokerv1.Runtime{
			{Name: "onednn", DeviceTypes: []brokerv1.DeviceType{brokerv1.DeviceType_DEVICE_TYPE_CPU}, Available: true, Version: "2.6.0"},
			{
				Name:        "pjrt",
				DeviceTypes: []brokerv1.DeviceType{brokerv1.DeviceType_DEVICE_TYPE_GPU, brokerv1.DeviceType_DEVICE_TYPE_TPU},
				Reason:      "no PJRT plugin found",
				Plugins:     []*brokerv1.PjrtPlugin{{Name: "xla_cuda_plugin", Path: "/opt/xla_cuda_plugin.so", Error: "undefined symbol"}},
			},
		},
		RoutingMode:     brokerv1.RoutingMode_ROUTING_MODE_AUTO,
		SelectionReason: "auto: no TPU; gpu:0 has no runtime (no PJRT plugin found); using cpu:0",
		FallbackChain:   []string{"tpu", "gpu", "cpu"},
		Recommendations: []string{"A GPU is present but no PJRT plugin was found: install the jax CUDA plugin."},
		Notes:           []string{"AMD GPU gfx90a listed: no runtime adapter on this build."},
		Version:         "v0.1.0-test",
		Hostname:        "testhost",
	}
	for _, d := range f.devices {
		r.AllDevices = append(r.AllDevices, proto.CloneOf(d))
	}
	if verbose {
		r.BatchPlans = []*brokerv1.BatchPlan{
			{DeviceType: brokerv1.DeviceType_DEVICE_TYPE_CPU, BaseBatch: 8, Factor: 1, MinBatch: 1, MaxBatch: 8, Buckets: []int32{1, 2, 4, 8}},
			{DeviceType: brokerv1.DeviceType_DEVICE_TYPE_GPU, BaseBatch: 8, Factor: 4, MinBatch: 1, MaxBatch: 32, Buckets: []int32{1, 2, 4, 8, 16, 32}},
		}
	}
	return r
}

func (f *fakeBroker) GetReport(_ context.Context, req *brokerv1.GetReportRequest) (*brokerv1.GetReportResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastReport = proto.CloneOf(req)
	return f.report(req.GetVerbose()), nil
}

// GetBatchPlan applies the plan rule of DESIGN.md for CPU and GPU (the
// factor times the base); it is enough to tell requests apart in tests.
func (f *fakeBroker) GetBatchPlan(_ context.Context, req *brokerv1.GetBatchPlanRequest) (*brokerv1.GetBatchPlanResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastPlanReq = proto.CloneOf(req)
	if req.GetBaseBatch() <= 0 {
		return nil, status.Errorf(codes.InvalidArgument, "base batch %d: must be positive", req.GetBaseBatch())
	}
	plan := &brokerv1.BatchPlan{BaseBatch: req.GetBaseBatch(), MinBatch: 1}
	switch t := req.GetTarget().(type) {
	case *brokerv1.GetBatchPlanRequest_DeviceType:
		plan.DeviceType = t.DeviceType
	case *brokerv1.GetBatchPlanRequest_DeviceId:
		d, err := f.find(t.DeviceId)
		if err != nil {
			return nil, err
		}
		plan.DeviceType, plan.DeviceId = d.GetType(), d.GetId()
	default:
		return nil, status.Error(codes.InvalidArgument, "no target")
	}
	plan.Factor = 1
	if plan.DeviceType == brokerv1.DeviceType_DEVICE_TYPE_GPU {
		plan.Factor = 4
	}
	plan.MaxBatch = plan.BaseBatch * plan.Factor
	for b := int32(1); b <= plan.MaxBatch; b *= 2 {
		plan.Buckets = append(plan.Buckets, b)
	}
	return &brokerv1.GetBatchPlanResponse{Plan: plan}, nil
}

func (f *fakeBroker) CordonDevice(_ context.Context, req *brokerv1.CordonDeviceRequest) (*brokerv1.CordonDeviceResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.find(req.GetId())
	if err != nil {
		return nil, err
	}
	d.Cordoned, d.CordonReason = true, req.GetReason()
	return &brokerv1.CordonDeviceResponse{Device: proto.CloneOf(d)}, nil
}

func (f *fakeBroker) UncordonDevice(_ context.Context, req *brokerv1.UncordonDeviceRequest) (*brokerv1.UncordonDeviceResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.find(req.GetId())
	if err != nil {
		return nil, err
	}
	d.Cordoned, d.CordonReason = false, ""
	return &brokerv1.UncordonDeviceResponse{Device: proto.CloneOf(d)}, nil
}

// fakeDim is the dimension of the fake's vectors: small, so outputs stay short.
const fakeDim = 8

// fakeVector is a deterministic vector for text: the bytes of its FNV-64a
// hash, scaled into [-1, 1).
func fakeVector(text string) []float32 {
	h := fnv.New64a()
	_, _ = io.WriteString(h, text)
	sum := h.Sum64()
	v := make([]float32, fakeDim)
	for i := range v {
		v[i] = float32(int((sum>>(8*i))&0xff)-128) / 128
	}
	return v
}

func signature(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// fakeEncode is the fake's answer to req: semantic gives fakeVector, lossless
// gives the original bytes as the "code" (codec "identity"), and an empty
// item is INVALID_ARGUMENT naming its index, as brokerd does.
func fakeEncode(req *brokerv1.EncodeRequest) (*brokerv1.EncodeResponse, error) {
	if len(req.GetItems()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "no items")
	}
	model := req.GetModel()
	if model == "" {
		model = "nbmf-hash-v1"
	}
	resp := &brokerv1.EncodeResponse{Model: model, ModelVersion: 1}
	for i, it := range req.GetItems() {
		data := []byte(it.GetText())
		if _, ok := it.GetContent().(*brokerv1.EncodeItem_Data); ok {
			data = it.GetData()
		}
		if len(data) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "item %d: empty text", i)
		}
		r := &brokerv1.EncodeResult{Id: it.GetId(), Signature: signature(data)}
		fid := req.GetFidelity()
		if fid != brokerv1.Fidelity_FIDELITY_LOSSLESS {
			r.Vector = fakeVector(string(data))
		}
		if fid == brokerv1.Fidelity_FIDELITY_LOSSLESS || fid == brokerv1.Fidelity_FIDELITY_BOTH {
			r.Code, r.Codec = data, "identity"
		}
		resp.Results = append(resp.Results, r)
	}
	n := int32(len(req.GetItems()))
	resp.Execution = &brokerv1.ExecutionInfo{
		DeviceId: "cpu:0", DeviceType: brokerv1.DeviceType_DEVICE_TYPE_CPU, BatchSize: n, BatchSizes: []int32{n},
		QueueNs: 1_200_000, ComputeNs: 2_500_000, TotalNs: 4_000_000, CostUsd: 0.000002 * float64(n),
	}
	return resp, nil
}

func (f *fakeBroker) Encode(ctx context.Context, req *brokerv1.EncodeRequest) (*brokerv1.EncodeResponse, error) {
	f.mu.Lock()
	f.encodeSizes = append(f.encodeSizes, len(req.GetItems()))
	f.lastEncode = proto.CloneOf(req)
	if f.texts == nil {
		f.texts = map[string]int{}
	}
	for _, it := range req.GetItems() {
		f.texts[it.GetText()]++
	}
	fail := f.failEvery > 0 && len(f.encodeSizes)%f.failEvery == 0
	if fail {
		f.encodeFailed++
	}
	delay := f.encodeDelay
	f.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if fail {
		return nil, status.Error(codes.Unavailable, "fake: failing every Nth request")
	}
	return fakeEncode(req)
}

// EncodeStream answers as Encode, two results per part, so brokerctl's
// reassembly is exercised.
func (f *fakeBroker) EncodeStream(req *brokerv1.EncodeStreamRequest, st brokerv1.BrokerService_EncodeStreamServer) error {
	resp, err := f.Encode(st.Context(), req.GetRequest())
	if err != nil {
		return err
	}
	rs := resp.GetResults()
	for i := 0; i < len(rs) || i == 0; i += 2 {
		p := &brokerv1.EncodeStreamResponse{Offset: int32(i), Total: int32(len(rs)), Results: rs[i:min(i+2, len(rs))]}
		if i+2 >= len(rs) {
			p.Model, p.ModelVersion, p.Execution = resp.GetModel(), resp.GetModelVersion(), resp.GetExecution()
		}
		if err := st.Send(p); err != nil {
			return err
		}
	}
	return nil
}

// encodeCalls returns the item count of every Encode call so far.
func (f *fakeBroker) encodeCalls() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.encodeSizes...)
}

func cannedStats() []*brokerv1.QueueStats {
	return []*brokerv1.QueueStats{
		{
			Model: "nbmf-hash-v1", Queued: 3, Running: 8, Completed: 12345,
			Failed: map[string]int64{"backend": 1, "timeout": 2, "rejected": 0}, MeanBatchSize: 7.5,
			Latency:        &brokerv1.LatencySummary{MeanSeconds: 0.0015, P50Seconds: 0.0012, P95Seconds: 0.0034, P99Seconds: 0.0101},
			ItemsPerSecond: 4321.55, RecentItemsPerSecond: 812.34,
		},
		{
			Model: "nbmf-hash-v1", DeviceId: "cpu:0", Queued: 3, Running: 8, Completed: 12345,
			Failed: map[string]int64{}, MeanBatchSize: 7.5,
			Latency:        &brokerv1.LatencySummary{MeanSeconds: 0.0015, P50Seconds: 0.0012, P95Seconds: 0.0034, P99Seconds: 0.0101},
			ItemsPerSecond: 4321.55, RecentItemsPerSecond: 812.34,
		},
		{
			Model: "bert-small", DeviceId: "gpu:0", Completed: 7,
			Failed: map[string]int64{"oom": 1, "cancelled": 4}, MeanBatchSize: 1,
			Latency:        &brokerv1.LatencySummary{P50Seconds: 0.00005, P95Seconds: 0.0002, P99Seconds: 0.25},
			ItemsPerSecond: 0.5, RecentItemsPerSecond: 0,
		},
		{
			Model: "qwen@1", Queued: 2, Running: 8, Completed: 120, Failed: map[string]int64{"cancelled": 1}, MeanBatchSize: 6.5,
			Latency: &brokerv1.LatencySummary{P50Seconds: 1.5, P99Seconds: 4}, RecentItemsPerSecond: 1.2, Healthy: true,
			Generation: &brokerv1.GenerationStats{
				PromptTokensPerSecond: 310.44, OutputTokensPerSecond: 96,
				TimeToFirstToken:  &brokerv1.LatencySummary{P50Seconds: 0.045, P99Seconds: 0.2},
				InterTokenLatency: &brokerv1.LatencySummary{P50Seconds: 0.012, P99Seconds: 0.03},
				KvCacheBlocksUsed: 12, KvCacheBlocksTotal: 64, Preemptions: 3, PromptTokens: 5000, GeneratedTokens: 2400,
				KvCacheDtype: "q8_0", SpecDraftTokens: 400, SpecAcceptedTokens: 250, PrefixCacheHitTokens: 1500, DeferredSamples: 5,
			},
		},
		{
			Model: "qwen@1", DeviceId: "cpu:0", Queued: 2, Running: 8, Completed: 120, Failed: map[string]int64{}, MeanBatchSize: 6.5,
			Latency: &brokerv1.LatencySummary{P50Seconds: 1.5, P99Seconds: 4}, RecentItemsPerSecond: 1.2, MaxBatch: 8, Healthy: true,
			Generation: &brokerv1.GenerationStats{
				PromptTokensPerSecond: 310.44, OutputTokensPerSecond: 96,
				TimeToFirstToken:  &brokerv1.LatencySummary{P50Seconds: 0.045, P99Seconds: 0.2},
				InterTokenLatency: &brokerv1.LatencySummary{P50Seconds: 0.012, P99Seconds: 0.03},
				KvCacheBlocksUsed: 12, KvCacheBlocksTotal: 64, Preemptions: 3, PromptTokens: 5000, GeneratedTokens: 2400,
				KvCacheDtype: "q8_0", SpecDraftTokens: 400, SpecAcceptedTokens: 250, PrefixCacheHitTokens: 1500, DeferredSamples: 5,
			},
		},
	}
}

func (f *fakeBroker) GetStats(_ context.Context, req *brokerv1.GetStatsRequest) (*brokerv1.GetStatsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastStats = proto.CloneOf(req)
	resp := &brokerv1.GetStatsResponse{}
	for _, s := range cannedStats() {
		if req.GetModel() == "" || req.GetModel() == s.GetModel() {
			resp.Stats = append(resp.Stats, s)
		}
	}
	if len(resp.Stats) == 0 {
		return nil, status.Errorf(codes.NotFound, "model %q not found", req.GetModel())
	}
	return resp, nil
}

func (f *fakeBroker) Drain(_ context.Context, req *brokerv1.DrainRequest) (*brokerv1.DrainResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastDrain = proto.CloneOf(req)
	return &brokerv1.DrainResponse{Completed: 42}, nil
}

// testServer is a gRPC server with the fake broker and the standard health
// service on a real Unix socket (named brokerd.sock, so a directory can stand
// in for XDG_RUNTIME_DIR) and on a loopback TCP port.
type testServer struct {
	dir, socket, addr string
	broker            *fakeBroker
	health            *health.Server

	mu    sync.Mutex
	calls map[string]int // unary calls by full method name
	// deny answers these full method names with the status instead of
	// calling the handler, as brokerd's authorizer does.
	deny map[string]*status.Status
}

// count is a unary interceptor counting every call the server received.
func (ts *testServer) count(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ts.mu.Lock()
	ts.calls[info.FullMethod]++
	denied := ts.deny[info.FullMethod]
	ts.mu.Unlock()
	if denied != nil {
		return nil, denied.Err()
	}
	return handler(ctx, req)
}

// callCount is how many calls of the full method name the server received.
func (ts *testServer) callCount(method string) int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.calls[method]
}

func startServer(t *testing.T) *testServer {
	t.Helper()
	ts := &testServer{dir: t.TempDir(), broker: &fakeBroker{devices: cannedDevices()}, health: health.NewServer(), calls: map[string]int{}}
	ts.socket = filepath.Join(ts.dir, "brokerd.sock")
	ts.health.SetServingStatus(brokerv1.BrokerService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)

	srv := grpc.NewServer(grpc.UnaryInterceptor(ts.count))
	brokerv1.RegisterBrokerServiceServer(srv, ts.broker)
	healthpb.RegisterHealthServer(srv, ts.health)
	unixLis, err := net.Listen("unix", ts.socket)
	if err != nil {
		t.Fatal(err)
	}
	tcpLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.addr = tcpLis.Addr().String()
	var wg sync.WaitGroup
	for _, lis := range []net.Listener{unixLis, tcpLis} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = srv.Serve(lis)
		}()
	}
	t.Cleanup(func() {
		srv.Stop()
		wg.Wait()
	})
	return ts
}

type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// run runs one brokerctl command line in process against ts (through
// BROKERD_SOCKET unless env says otherwise).
func (ts *testServer) run(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	if env == nil {
		env = map[string]string{"BROKERD_SOCKET": ts.socket}
	}
	return runMain(t, env, args...)
}

// runStdin is run with stdin.
func (ts *testServer) runStdin(t *testing.T, stdin io.Reader, args ...string) result {
	t.Helper()
	return runWith(t.Context(), stdin, map[string]string{"BROKERD_SOCKET": ts.socket}, args...)
}

func runMain(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	return runWith(t.Context(), nil, env, args...)
}

func runWith(ctx context.Context, stdin io.Reader, env map[string]string, args ...string) result {
	var stdout, stderr bytes.Buffer
	code := Main(ctx, args, stdin, &stdout, &stderr, func(k string) string { return env[k] })
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// checkTable checks that every row of an aligned table starts a cell exactly
// where each header column starts, and returns the rows as maps from header
// to cell text.
func checkTable(t *testing.T, text string, header []string) []map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(lines) < 2 {
		t.Fatalf("table has no rows:\n%s", text)
	}
	starts := make([]int, len(header))
	for i, h := range header {
		starts[i] = strings.Index(lines[0], h)
		if starts[i] < 0 || (i > 0 && starts[i] <= starts[i-1]) {
			t.Fatalf("header %q: column %q missing or out of order", lines[0], h)
		}
	}
	var rows []map[string]string
	for _, line := range lines[1:] {
		cells := map[string]string{}
		for i, s := range starts {
			if len(line) <= s || line[s] == ' ' || (s > 0 && line[s-1] != ' ') {
				t.Fatalf("row %q: no cell starts at column %q (offset %d)\ntable:\n%s", line, header[i], s, text)
			}
			end := len(line)
			if i+1 < len(starts) {
				end = starts[i+1]
			}
			cells[header[i]] = strings.TrimSpace(line[s:end])
		}
		rows = append(rows, cells)
	}
	return rows
}

func mustTime(s string) time.Time {
	tm, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return tm
}
