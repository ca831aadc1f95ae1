package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	nvmlserver "github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/brokerd/brokerd/daemon"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/server/config"
)

// Dashboard is the part of a Grafana dashboard the checks read.
type Dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []Panel `json:"panels"`
}

// Panel is one dashboard panel.
type Panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

func loadDashboard(t *testing.T) Dashboard {
	t.Helper()
	b, err := os.ReadFile("grafana/brokerd.json")
	if err != nil {
		t.Fatal(err)
	}
	var d Dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/brokerd.json: %v", err)
	}
	return d
}

var (
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	labelValues  = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`)
	promKeywords = map[string]bool{"bool": true, "offset": true, "and": true, "or": true, "unless": true, "inf": true, "nan": true}
)

// metricNames lists the metric names a PromQL expression selects: the
// identifiers left once strings, label matchers, ranges and grouping
// clauses are removed, that are neither function calls nor keywords.
func metricNames(expr string) []string {
	s := promStrings.ReplaceAllString(expr, `""`)
	s = promMatchers.ReplaceAllString(s, " ")
	s = promRanges.ReplaceAllString(s, " ")
	s = promGrouping.ReplaceAllString(s, " ")
	var names []string
	for _, loc := range promIdent.FindAllStringIndex(s, -1) {
		name := s[loc[0]:loc[1]]
		rest := strings.TrimLeft(s[loc[1]:], " \t\n")
		if strings.HasPrefix(rest, "(") || promKeywords[strings.ToLower(name)] ||
			(loc[0] > 0 && (s[loc[0]-1] == '$' || s[loc[0]-1] == '.' || s[loc[0]-1] >= '0' && s[loc[0]-1] <= '9')) {
			continue
		}
		names = append(names, name)
	}
	return names
}

// checkExported reports the first name that brokerd does not export under
// families (from a scrape): a plain series by its own name, a histogram only
// through its _bucket, _sum and _count series.
func checkExported(name string, families map[string]*dto.MetricFamily) error {
	if f, ok := families[name]; ok {
		if f.GetType() == dto.MetricType_HISTOGRAM {
			return fmt.Errorf("%s is a histogram: query its _bucket, _sum or _count series", name)
		}
		return nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if f, ok := families[base]; ok && (f.GetType() == dto.MetricType_HISTOGRAM ||
			f.GetType() == dto.MetricType_SUMMARY && suffix != "_bucket") {
			return nil
		}
	}
	return fmt.Errorf("brokerd does not export %s", name)
}

// dashboardQueries are every PromQL expression of the dashboard: panel
// targets and the templating variables' label_values metrics.
func dashboardQueries(t *testing.T, d Dashboard) (exprs []string, varMetrics []string) {
	t.Helper()
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: %v", v.Name, err)
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("variable %s query %q is not label_values(metric...)", v.Name, q.Query)
		}
		varMetrics = append(varMetrics, m[1])
	}
	return exprs, varMetrics
}

// TestDashboardMetricsExist starts a real brokerd in process (a simulated
// host with eight mocked H100s, so the GPU-only telemetry exists), runs an
// Encode and a failed one so the scheduler's series exist, scrapes /metrics
// and checks every metric every query of the dashboard uses.
func TestDashboardMetricsExist(t *testing.T) {
	d := loadDashboard(t)
	families := scrapeLiveBrokerd(t)

	exprs, varMetrics := dashboardQueries(t, d)
	if len(exprs) < 20 {
		t.Fatalf("only %d queries in the dashboard", len(exprs))
	}
	used := map[string]bool{}
	for _, e := range exprs {
		names := metricNames(e)
		if len(names) == 0 {
			t.Errorf("query %q selects no metric", e)
		}
		for _, n := range names {
			used[n] = true
			if err := checkExported(n, families); err != nil {
				t.Errorf("query %q: %v", e, err)
			}
		}
	}
	for _, n := range varMetrics {
		used[n] = true
		if err := checkExported(n, families); err != nil {
			t.Errorf("templating variable: %v", err)
		}
	}

	// The list: devices, queue depth, latency quantiles from the
	// histograms, batch sizes, failures by reason, cost.
	for _, want := range []string{
		"brokerd_device_memory_used_bytes", "brokerd_device_memory_total_bytes", "brokerd_device_utilization_ratio",
		"brokerd_device_temperature_celsius", "brokerd_device_power_watts", "brokerd_device_healthy",
		"brokerd_queue_depth_items", "brokerd_request_duration_seconds_bucket", "brokerd_queue_duration_seconds_bucket",
		"brokerd_compute_duration_seconds_bucket", "brokerd_batch_size_bucket", "brokerd_request_failures_total",
		"brokerd_cost_usd_total",
	} {
		if !used[want] {
			t.Errorf("the dashboard does not query %s", want)
		}
	}
	for _, e := range exprs {
		if strings.Contains(e, "_bucket") && !strings.HasPrefix(e, "histogram_quantile(") {
			t.Errorf("bucket query %q is not a histogram_quantile", e)
		}
		if strings.Contains(e, "brokerd_request_failures_total") && !strings.Contains(e, "reason") {
			t.Errorf("failures query %q does not split by reason", e)
		}
	}
}

// TestMetricChecker proves the checks above can fail.
func TestMetricChecker(t *testing.T) {
	hist, gauge := dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE
	families := map[string]*dto.MetricFamily{
		"brokerd_batch_size":        {Type: &hist},
		"brokerd_queue_depth_items": {Type: &gauge},
	}
	tests := []struct {
		expr    string
		names   []string
		wantErr string
	}{
		{`sum by (model) (brokerd_queue_depth_items{instance=~"$instance"})`, []string{"brokerd_queue_depth_items"}, ""},
		{`histogram_quantile(0.99, sum by (le) (rate(brokerd_batch_size_bucket[$__rate_interval])))`, []string{"brokerd_batch_size_bucket"}, ""},
		{`rate(brokerd_batch_size_sum[5m]) / rate(brokerd_batch_size_count[5m])`, []string{"brokerd_batch_size_sum", "brokerd_batch_size_count"}, ""},
		{`rate(brokerd_queue_depth_item[5m])`, []string{"brokerd_queue_depth_item"}, "does not export brokerd_queue_depth_item"},
		{`brokerd_batch_size > bool 3`, []string{"brokerd_batch_size"}, "is a histogram"},
		{`brokerd_queue_depth_items_bucket`, []string{"brokerd_queue_depth_items_bucket"}, "does not export"},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			names := metricNames(tt.expr)
			if !slices.Equal(names, tt.names) {
				t.Fatalf("metricNames = %q, want %q", names, tt.names)
			}
			var err error
			for _, n := range names {
				if err = checkExported(n, families); err != nil {
					break
				}
			}
			if (err == nil) != (tt.wantErr == "") || err != nil && !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestDashboardLayout(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("title %q, uid %q", d.Title, d.UID)
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.X < 0 || p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H <= 0 {
			t.Errorf("panel %q gridPos %+v outside the 24 columns", p.Title, p.GridPos)
		}
		if p.Type != "row" && (p.Datasource == nil || p.Datasource.UID != "${datasource}") {
			t.Errorf("panel %q does not use the ${datasource} variable", p.Title)
		}
	}
}

// scrapeLiveBrokerd runs brokerd, makes it do work, and parses /metrics.
func scrapeLiveBrokerd(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	host := "../detect/testdata/hosts/tpu-v4"
	dir := t.TempDir()
	cfg := config.Defaults(os.Geteuid(), func(string) string { return "" })
	cfg.Socket = filepath.Join(dir, "brokerd.sock")
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.MetricsListen = "127.0.0.1:0"
	cfg.Sysfs, cfg.Devfs, cfg.Procfs = filepath.Join(host, "sys"), filepath.Join(host, "dev"), "/proc"
	cfg.Telemetry = config.Duration(100 * time.Millisecond)
	cfg.ShutdownGrace = config.Duration(5 * time.Second)

	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan daemon.Addresses, 1)
	done := make(chan error, 1)
	getenv := func(k string) string {
		if k == "HOME" {
			return "/nonexistent" // keep the PJRT search off this machine's Python
		}
		return ""
	}
	go func() {
		done <- daemon.Run(ctx, daemon.Options{Config: cfg, Version: "test", Getenv: getenv, NVML: mockH100s(),
			Ready: func(a daemon.Addresses) { ready <- a }}, zap.NewNop())
	}()
	var addrs daemon.Addresses
	select {
	case addrs = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("brokerd exited before ready: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("brokerd not ready after 30s")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("brokerd: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("brokerd did not stop")
		}
	})

	conn, err := grpc.NewClient("unix://"+addrs.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := brokerv1.NewBrokerServiceClient(conn)
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	items := []*brokerv1.EncodeItem{
		{Id: "a", Content: &brokerv1.EncodeItem_Text{Text: "dashboard"}},
		{Id: "b", Content: &brokerv1.EncodeItem_Text{Text: "metrics"}},
	}
	if _, err := c.Encode(rctx, &brokerv1.EncodeRequest{Items: items}); err != nil {
		t.Fatalf("Encode: %v", err)
	}
	// A drained broker rejects new work: that is a failure with a reason.
	if _, err := c.Drain(rctx, &brokerv1.DrainRequest{}); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if _, err := c.Encode(rctx, &brokerv1.EncodeRequest{Items: items}); err == nil {
		t.Fatal("Encode after Drain succeeded")
	}

	resp, err := http.Get("http://" + addrs.Metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	if _, ok := families["brokerd_device_temperature_celsius"]; !ok {
		t.Fatal("no GPU telemetry in /metrics: the mocked GPUs were not detected")
	}
	return families
}

// mockH100s is a DGX H100 from go-nvml's mocks with the telemetry calls the
// NVIDIA detector makes filled in (the mocks panic on any unset call).
func mockH100s() *nvmlserver.Server {
	srv := dgxh100.New()
	events := &mock.EventSet{
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		WaitFunc: func(uint32) (nvml.EventData, nvml.Return) { return nvml.EventData{}, nvml.ERROR_TIMEOUT },
	}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return events, nvml.SUCCESS }
	for i, d := range srv.Devices {
		dev := d.(*nvmlserver.Device)
		busID := fmt.Sprintf("00000000:%02X:00.0", 0x18+i)
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for j := range len(busID) {
				p.BusId[j] = int8(busID[j])
			}
			return p, nvml.SUCCESS
		}
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: uint32(10 + i), Memory: 5}, nvml.SUCCESS
		}
		dev.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return uint32(40 + i), nvml.SUCCESS }
		dev.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 300000, nvml.SUCCESS }
		dev.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 700000, nvml.SUCCESS }
		dev.GetClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return 1980, nvml.SUCCESS }
		dev.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) { return 0, nvml.SUCCESS }
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		dev.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	}
	return srv
}
