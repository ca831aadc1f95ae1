package daemon

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/onednn"
	"github.com/brokerd/brokerd/server/config"
)

// testHost is a simulated TPU v4 host: the sysfs and devfs of a testdata
// tree, with this machine's procfs for the CPU.
const testHost = "../detect/testdata/hosts/tpu-v4"

// daemon is a brokerd started in-process for a test.
type daemon struct {
	addrs Addresses
	conn  *grpc.ClientConn
	done  chan error
	stop  context.CancelFunc
}

func testConfig(t testing.TB) config.Config {
	dir := t.TempDir()
	cfg := config.Defaults(os.Geteuid(), func(string) string { return "" })
	cfg.Socket = filepath.Join(dir, "brokerd.sock")
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.MetricsListen = "127.0.0.1:0"
	cfg.Sysfs = filepath.Join(testHost, "sys")
	cfg.Devfs = filepath.Join(testHost, "dev")
	cfg.Procfs = "/proc"
	cfg.NVMLLibrary = filepath.Join(dir, "no-such-libnvidia-ml.so.1")
	cfg.ShutdownGrace = config.Duration(5 * time.Second)
	return cfg
}

// httpTestConfig is testConfig with a model repository of its own and the
// HTTP APIs on a free loopback port, open without credentials: what the
// generation tests over Ollama's and OpenAI's APIs start from.
func httpTestConfig(t testing.TB) config.Config {
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.HTTPListen = "127.0.0.1:0"
	cfg.HTTPAllowUnauthenticated = true
	return cfg
}

// chatMLTemplate is a ChatML chat template (Qwen's form) for the test
// tokenizers.
const chatMLTemplate = `{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`

// hermeticEnv simulates a TPU VM's environment and keeps the PJRT search
// away from this machine's Python installs.
func hermeticEnv(k string) string {
	switch k {
	case "TPU_ACCELERATOR_TYPE":
		return "v4-8"
	case "TPU_WORKER_ID":
		return "0"
	case "HOME":
		return "/nonexistent"
	}
	return ""
}

func startDaemon(t testing.TB, cfg config.Config) *daemon {
	t.Helper()
	return startDaemonWith(t, Options{Config: cfg})
}

// startDaemonWith is startDaemon with more Options (Config set).
func startDaemonWith(t testing.TB, opts Options) *daemon {
	t.Helper()
	return startDaemonLog(t, opts, zap.NewNop())
}

// startBound bounds a test daemon's start and stop: far above what they
// take (a second or two; tens of seconds for a model with a real tokenizer
// under -race on a loaded machine), so only a daemon that never gets there
// fails.
const startBound = 2 * time.Minute

// startDaemonLog is startDaemonWith logging to log.
func startDaemonLog(t testing.TB, opts Options, log *zap.Logger) *daemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &daemon{done: make(chan error, 1), stop: cancel}
	ready := make(chan Addresses, 1)
	opts.Version, opts.Getenv, opts.Ready = "test", hermeticEnv, func(a Addresses) { ready <- a }
	go func() {
		d.done <- Run(ctx, opts, log)
	}()
	select {
	case d.addrs = <-ready:
	case err := <-d.done:
		cancel()
		t.Fatalf("brokerd exited before ready: %v", err)
	case <-time.After(startBound):
		cancel()
		t.Fatalf("brokerd not ready after %v", startBound)
	}
	conn, err := grpc.NewClient("unix://"+d.addrs.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	d.conn = conn
	t.Cleanup(func() { d.shutdown(t) })
	return d
}

func (d *daemon) shutdown(t testing.TB) {
	if d.stop == nil {
		return
	}
	d.conn.Close()
	d.stop()
	d.stop = nil
	select {
	case err := <-d.done:
		if err != nil {
			t.Errorf("Run returned %v", err)
		}
	case <-time.After(startBound):
		t.Errorf("brokerd did not stop within %v", startBound)
	}
}

func TestDaemonServesAdminRPCs(t *testing.T) {
	d := startDaemon(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := brokerv1.NewBrokerServiceClient(d.conn)

	devs, err := c.ListDevices(ctx, &brokerv1.ListDevicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, dev := range devs.GetDevices() {
		ids = append(ids, dev.GetId())
	}
	if got, want := strings.Join(ids, ","), "cpu:0,tpu:0,tpu:1,tpu:2,tpu:3"; got != want {
		t.Fatalf("devices = %s, want %s", got, want)
	}
	tpu := devs.GetDevices()[1]
	if tpu.GetType() != brokerv1.DeviceType_DEVICE_TYPE_TPU || tpu.GetTpu().GetGeneration() != "v4" ||
		tpu.GetMemoryTotalBytes() != 32<<30 || tpu.GetRunnable() || !strings.Contains(tpu.GetRuntimeReason(), "PJRT") ||
		tpu.GetTpu().GetAcceleratorType() != "v4-8" || tpu.GetMemoryBudgetBytes() != uint64(0.75*float64(32<<30)) {
		t.Errorf("tpu:0 = %v", tpu)
	}
	if cpu := devs.GetDevices()[0]; !cpu.GetRunnable() || cpu.GetRuntime() != "onednn" {
		t.Errorf("cpu:0 not runnable on onednn: %v", cpu)
	}

	rep, err := c.GetReport(ctx, &brokerv1.GetReportRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.GetCurrentDevice().GetId() != "cpu:0" || rep.GetRoutingMode() != brokerv1.RoutingMode_ROUTING_MODE_AUTO ||
		len(rep.GetAllDevices()) != 5 || rep.GetConfiguration().GetTpuBatchFactor() != 128 || len(rep.GetBatchPlans()) != 3 {
		t.Errorf("report = %v", rep)
	}
	if !containsSubstring(rep.GetRecommendations(), "PJRT") {
		t.Errorf("no recommendation about the missing TPU plugin: %q", rep.GetRecommendations())
	}
	if !containsSubstring(rep.GetNotes(), "NVML") {
		t.Errorf("no note about NVML: %q", rep.GetNotes())
	}

	plan, err := c.GetBatchPlan(ctx, &brokerv1.GetBatchPlanRequest{BaseBatch: 3, Target: &brokerv1.GetBatchPlanRequest_DeviceId{DeviceId: "tpu:2"}})
	if err != nil {
		t.Fatal(err)
	}
	if p := plan.GetPlan(); p.GetMaxBatch() != 512 || p.GetDeviceId() != "tpu:2" || p.GetDeviceType() != brokerv1.DeviceType_DEVICE_TYPE_TPU {
		t.Errorf("plan = %v", p)
	}

	cordoned, err := c.CordonDevice(ctx, &brokerv1.CordonDeviceRequest{Id: "cpu:0", Reason: "maintenance"})
	if err != nil {
		t.Fatal(err)
	}
	if !cordoned.GetDevice().GetCordoned() || cordoned.GetDevice().GetCordonReason() != "maintenance" {
		t.Errorf("cordon: %v", cordoned.GetDevice())
	}
	got, err := c.GetDevice(ctx, &brokerv1.GetDeviceRequest{Id: "cpu:0"})
	if err != nil || !got.GetDevice().GetCordoned() {
		t.Errorf("GetDevice after cordon: %v, %v", got, err)
	}
	un, err := c.UncordonDevice(ctx, &brokerv1.UncordonDeviceRequest{Id: "cpu:0"})
	if err != nil || un.GetDevice().GetCordoned() {
		t.Errorf("uncordon: %v, %v", un, err)
	}

	hc, err := healthpb.NewHealthClient(d.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "broker.v1.BrokerService"})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health: %v, %v", hc, err)
	}

	// Reflection lists the service, so grpcurl needs no proto files.
	stream, err := reflectionpb.NewServerReflectionClient(d.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	rr, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var services []string
	for _, s := range rr.GetListServicesResponse().GetService() {
		services = append(services, s.GetName())
	}
	if !containsSubstring(services, "broker.v1.BrokerService") || !containsSubstring(services, "grpc.health.v1.Health") ||
		!containsSubstring(services, "inference.GRPCInferenceService") {
		t.Errorf("reflection lists %v", services)
	}
	stream.CloseSend()
}

func TestDaemonStatusCodes(t *testing.T) {
	d := startDaemon(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := brokerv1.NewBrokerServiceClient(d.conn)
	plan := func(base int32, target any) error {
		req := &brokerv1.GetBatchPlanRequest{BaseBatch: base}
		switch v := target.(type) {
		case brokerv1.DeviceType:
			req.Target = &brokerv1.GetBatchPlanRequest_DeviceType{DeviceType: v}
		case string:
			req.Target = &brokerv1.GetBatchPlanRequest_DeviceId{DeviceId: v}
		}
		_, err := c.GetBatchPlan(ctx, req)
		return err
	}
	tests := []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"unknown device", func() error { _, err := c.GetDevice(ctx, &brokerv1.GetDeviceRequest{Id: "gpu:7"}); return err }, codes.NotFound},
		{"empty device id", func() error { _, err := c.GetDevice(ctx, &brokerv1.GetDeviceRequest{}); return err }, codes.InvalidArgument},
		{"cordon unknown", func() error { _, err := c.CordonDevice(ctx, &brokerv1.CordonDeviceRequest{Id: "tpu:9"}); return err }, codes.NotFound},
		{"uncordon unknown", func() error { _, err := c.UncordonDevice(ctx, &brokerv1.UncordonDeviceRequest{Id: "x"}); return err }, codes.NotFound},
		{"base zero", func() error { return plan(0, brokerv1.DeviceType_DEVICE_TYPE_CPU) }, codes.InvalidArgument},
		{"base negative", func() error { return plan(-4, brokerv1.DeviceType_DEVICE_TYPE_GPU) }, codes.InvalidArgument},
		{"base absurd", func() error { return plan(1<<30, brokerv1.DeviceType_DEVICE_TYPE_TPU) }, codes.InvalidArgument},
		{"no target", func() error { return plan(8, nil) }, codes.InvalidArgument},
		{"unspecified type", func() error { return plan(8, brokerv1.DeviceType_DEVICE_TYPE_UNSPECIFIED) }, codes.InvalidArgument},
		{"type without plan", func() error { return plan(8, brokerv1.DeviceType_DEVICE_TYPE_AMD_GPU) }, codes.InvalidArgument},
		{"plan for unknown device", func() error { return plan(8, "gpu:0") }, codes.NotFound},
		{"plan for absent type", func() error { return plan(8, brokerv1.DeviceType_DEVICE_TYPE_GPU) }, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := status.Code(tt.call()); got != tt.want {
				t.Errorf("code %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDaemonMetrics(t *testing.T) {
	d := startDaemon(t, testConfig(t))
	// One RPC so the grpc series exist.
	if _, err := brokerv1.NewBrokerServiceClient(d.conn).ListDevices(context.Background(), &brokerv1.ListDevicesRequest{}); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + d.addrs.Metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	text := string(body)
	for _, want := range []string{
		`brokerd_device_memory_total_bytes{device="tpu:0",name="TPU v4",type="tpu",uuid=""} 3.4359738368e+10`,
		`brokerd_device_healthy{device="cpu:0"`,
		`brokerd_device_memory_used_bytes{device="cpu:0"`,
		`brokerd_device_utilization_ratio{device="cpu:0"`,
		`brokerd_device_runnable{device="tpu:3",name="TPU v4",type="tpu",uuid=""} 0`,
		`brokerd_device_memory_budget_bytes{device="cpu:0"`,
		`brokerd_grpc_handled_total{code="OK",method="/broker.v1.BrokerService/ListDevices"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestDaemonRefusesSecondInstance(t *testing.T) {
	cfg := testConfig(t)
	startDaemon(t, cfg)
	second := cfg
	second.MetricsListen = ""
	err := Run(context.Background(), Options{Config: second, Getenv: hermeticEnv}, zap.NewNop())
	if !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("second brokerd: %v, want ErrAlreadyRunning", err)
	}
}

func TestDaemonRefusesSharedStateDir(t *testing.T) {
	cfg := testConfig(t)
	startDaemon(t, cfg)
	second := testConfig(t) // its own socket
	second.StateDir = cfg.StateDir
	second.MetricsListen = ""
	err := Run(context.Background(), Options{Config: second, Getenv: hermeticEnv}, zap.NewNop())
	if !errors.Is(err, ErrAlreadyRunning) || !strings.Contains(err.Error(), "state-dir") {
		t.Fatalf("second brokerd on the same state dir: %v, want ErrAlreadyRunning naming the state dir", err)
	}
}

func TestDaemonStopsCleanly(t *testing.T) {
	cfg := testConfig(t)
	d := startDaemon(t, cfg)
	d.shutdown(t)
	if _, err := os.Stat(cfg.Socket); !os.IsNotExist(err) {
		t.Errorf("socket left behind after stop: %v", err)
	}
	// The registry was written: a restart keeps the IDs.
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "devices.json")); err != nil {
		t.Errorf("no device registry in the state dir: %v", err)
	}
	again := startDaemon(t, cfg)
	devs, err := brokerv1.NewBrokerServiceClient(again.conn).ListDevices(context.Background(), &brokerv1.ListDevicesRequest{})
	if err != nil || len(devs.GetDevices()) != 5 {
		t.Fatalf("after restart: %v, %v", devs, err)
	}
}

func TestDaemonInsecureTCPOnLoopback(t *testing.T) {
	cfg := testConfig(t)
	cfg.Listen = "127.0.0.1:0"
	cfg.InsecureTCP = true
	d := startDaemon(t, cfg)
	conn, err := grpc.NewClient(d.addrs.TCP, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health over TCP: %v, %v", hc, err)
	}
}

func containsSubstring(list []string, sub string) bool {
	for _, s := range list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// BenchmarkStartToReady measures brokerd's start until it serves (target
// under 500 ms): settings, listeners, runtime probe, discovery on this host.
func BenchmarkStartToReady(b *testing.B) {
	for i := 0; i < b.N; i++ {
		cfg := testConfig(b)
		cfg.Sysfs, cfg.Devfs = "/sys", "/dev"
		cfg.NVMLLibrary = ""
		start := time.Now()
		d := startDaemon(b, cfg)
		hc, err := healthpb.NewHealthClient(d.conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			b.Fatalf("health: %v, %v", hc, err)
		}
		took := time.Since(start)
		b.ReportMetric(float64(took.Microseconds())/1000, "ms/ready")
		// Target: ready in under 500 ms.
		b.ReportMetric(float64(took)/float64(500*time.Millisecond), "of-target")
		b.StopTimer()
		d.shutdown(b)
		b.StartTimer()
	}
}

// TestDaemonComputeDType starts brokerd with --compute-dtype cpu=bf16: on a
// CPU without bf16 it must start anyway, computing in f32, and say so in
// the device's attributes; devices it did not open have no such attribute.
func TestDaemonComputeDType(t *testing.T) {
	want := "bf16"
	if err := onednn.BF16Support(); err != nil {
		want = "f32"
	}
	cfg := testConfig(t)
	cfg.ComputeDType = "cpu=bf16"
	d := startDaemon(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := brokerv1.NewBrokerServiceClient(d.conn)
	devs, err := c.ListDevices(ctx, &brokerv1.ListDevicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, dev := range devs.GetDevices() {
		got, ok := dev.GetAttributes()["compute_dtype"]
		switch {
		case dev.GetId() == "cpu:0" && got != want:
			t.Errorf("cpu:0 compute_dtype = %q, want %q", got, want)
		case dev.GetId() != "cpu:0" && ok:
			t.Errorf("%s is not open but has compute_dtype %q", dev.GetId(), got)
		}
	}
	resp, err := c.Encode(ctx, &brokerv1.EncodeRequest{Items: textItems("served in " + want)})
	if err != nil || len(resp.GetResults()) != 1 || len(resp.GetResults()[0].GetVector()) == 0 {
		t.Fatalf("Encode = %v, %v", resp, err)
	}
}

func TestPprofOnAPublicAddressWarns(t *testing.T) {
	for _, tc := range []struct {
		listen string
		warn   bool
	}{{"0.0.0.0:0", true}, {"127.0.0.1:0", false}} {
		t.Run(tc.listen, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.MetricsListen, cfg.Pprof = tc.listen, true
			core, logs := observer.New(zap.WarnLevel)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			ready := make(chan Addresses, 1)
			go func() {
				done <- Run(ctx, Options{Config: cfg, Version: "test", Getenv: hermeticEnv, Ready: func(a Addresses) { ready <- a }}, zap.New(core))
			}()
			select {
			case <-ready:
			case err := <-done:
				t.Fatal(err)
			}
			cancel()
			<-done
			warned := logs.FilterMessageSnippet("--pprof serves").Len() > 0
			if warned != tc.warn {
				t.Errorf("warned %v, want %v", warned, tc.warn)
			}
		})
	}
}

// TestCordonLoggedOnce: an admin cordon is one state-change line (the
// inventory's) and one audit line (who did it), not the same news three times.
func TestCordonLoggedOnce(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	d := startDaemonLog(t, Options{Config: testConfig(t)}, zap.New(core))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := brokerv1.NewBrokerServiceClient(d.conn)
	if _, err := c.CordonDevice(ctx, &brokerv1.CordonDeviceRequest{Id: "cpu:0", Reason: "maintenance"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UncordonDevice(ctx, &brokerv1.UncordonDeviceRequest{Id: "cpu:0"}); err != nil {
		t.Fatal(err)
	}
	count := func(snippet string) (n int) {
		for _, e := range logs.All() {
			if strings.Contains(e.Message, snippet) {
				n++
			}
		}
		return n
	}
	if n := count("cordon"); n != 2 {
		t.Errorf("%d log lines mention cordon, want 2 (cordoned, uncordoned): %v", n, logs.FilterMessageSnippet("cordon").All())
	}
	audits := 0
	for _, e := range logs.FilterMessage("admin call").All() {
		if m := e.ContextMap()["method"]; m == "/broker.v1.BrokerService/CordonDevice" || m == "/broker.v1.BrokerService/UncordonDevice" {
			audits++
		}
	}
	if audits != 2 {
		t.Errorf("%d audit lines for the cordon and uncordon, want 2", audits)
	}
}
