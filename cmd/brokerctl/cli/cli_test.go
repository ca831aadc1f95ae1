package cli

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

func TestHealth(t *testing.T) {
	ts := startServer(t)
	ts.health.SetServingStatus("draining.Service", healthpb.HealthCheckResponse_NOT_SERVING)

	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{name: "server", args: []string{"health"}, wantCode: ExitOK, wantStdout: "SERVING\n"},
		{name: "broker service", args: []string{"health", "--service", "broker.v1.BrokerService"}, wantCode: ExitOK, wantStdout: "SERVING\n"},
		{name: "not serving", args: []string{"health", "--service", "draining.Service"}, wantCode: ExitError, wantStdout: "NOT_SERVING\n"},
		{name: "unknown service", args: []string{"health", "--service", "nope.Service"}, wantCode: ExitError,
			wantStderr: "brokerctl: health: unknown service (NOT_FOUND)\n"},
		{name: "json", args: []string{"health", "--json"}, wantCode: ExitOK, wantStdout: "{\n  \"status\": \"SERVING\"\n}\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ts.run(t, nil, tt.args...)
			if r.code != tt.wantCode || r.stdout != tt.wantStdout || r.stderr != tt.wantStderr {
				t.Errorf("got %v\nwant exit %d, stdout %q, stderr %q", r, tt.wantCode, tt.wantStdout, tt.wantStderr)
			}
		})
	}
}

func TestDevicesTable(t *testing.T) {
	ts := startServer(t)
	base := []string{"ID", "TYPE", "NAME", "MEMORY", "BUDGET", "RUNTIME", "HEALTH", "CORDONED"}
	wide := append(append([]string{}, base...), "UUID", "PCI BUS", "DRIVER", "CC", "TEMP", "POWER", "UTIL")

	tests := []struct {
		name   string
		args   []string
		header []string
		want   map[string]map[string]string // device ID -> column -> cell
	}{
		{
			name: "narrow", args: []string{"devices"}, header: base,
			want: map[string]map[string]string{
				"cpu:0":    {"TYPE": "cpu", "MEMORY": "64.0 GiB", "BUDGET": "48.0 GiB", "RUNTIME": "onednn", "HEALTH": "healthy", "CORDONED": "no"},
				"gpu:0":    {"TYPE": "gpu", "NAME": "NVIDIA H100 80GB HBM3", "MEMORY": "79.6 GiB", "BUDGET": "59.7 GiB", "RUNTIME": "-"},
				"amdgpu:0": {"TYPE": "amdgpu", "NAME": "gfx90a", "BUDGET": "-", "RUNTIME": "-"},
			},
		},
		{
			name: "wide", args: []string{"devices", "--wide"}, header: wide,
			want: map[string]map[string]string{
				"cpu:0": {"UUID": "-", "TEMP": "-", "UTIL": "-"},
				"gpu:0": {
					"RUNTIME": "- (no PJRT plugin found)", "UUID": "GPU-7d3c1c2e-1b6e-4f0e-9b8a-0c2d6f3e1a11",
					"PCI BUS": "0000:1b:00.0", "DRIVER": "550.54.15", "CC": "9.0", "TEMP": "34 C", "POWER": "72/700 W", "UTIL": "12%",
				},
				"amdgpu:0": {"RUNTIME": "- (no runtime adapter on this build)"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ts.run(t, nil, tt.args...)
			if r.code != ExitOK || r.stderr != "" {
				t.Fatalf("got %v", r)
			}
			rows := checkTable(t, r.stdout, tt.header)
			if len(rows) != 3 {
				t.Fatalf("got %d rows, want 3:\n%s", len(rows), r.stdout)
			}
			byID := map[string]map[string]string{}
			for _, row := range rows {
				byID[row["ID"]] = row
			}
			for id, cols := range tt.want {
				for col, want := range cols {
					if got := byID[id][col]; got != want {
						t.Errorf("%s %s = %q, want %q\n%s", id, col, got, want, r.stdout)
					}
				}
			}
		})
	}
}

// TestJSON checks that every --json output parses back into its response
// message and equals what the server sent.
func TestJSON(t *testing.T) {
	ts := startServer(t)
	canned := cannedDevices()
	tests := []struct {
		name string
		args []string
		into proto.Message
		want proto.Message
	}{
		{name: "devices", args: []string{"devices", "--json"}, into: &brokerv1.ListDevicesResponse{},
			want: &brokerv1.ListDevicesResponse{Devices: canned}},
		{name: "device", args: []string{"device", "--json", "gpu:0"}, into: &brokerv1.GetDeviceResponse{},
			want: &brokerv1.GetDeviceResponse{Device: canned[1]}},
		{name: "report", args: []string{"report", "--json"}, into: &brokerv1.GetReportResponse{},
			want: (&fakeBroker{devices: canned}).report(false)},
		{name: "report verbose", args: []string{"report", "--verbose", "--json"}, into: &brokerv1.GetReportResponse{},
			want: (&fakeBroker{devices: canned}).report(true)},
		{name: "batch-plan", args: []string{"batch-plan", "--base", "2", "--type", "gpu", "--json"}, into: &brokerv1.GetBatchPlanResponse{},
			want: &brokerv1.GetBatchPlanResponse{Plan: &brokerv1.BatchPlan{
				DeviceType: brokerv1.DeviceType_DEVICE_TYPE_GPU, BaseBatch: 2, Factor: 4, MinBatch: 1, MaxBatch: 8, Buckets: []int32{1, 2, 4, 8}}}},
		{name: "health", args: []string{"health", "--json"}, into: &healthpb.HealthCheckResponse{},
			want: &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ts.run(t, nil, tt.args...)
			if r.code != ExitOK {
				t.Fatalf("got %v", r)
			}
			if err := protojson.Unmarshal([]byte(r.stdout), tt.into); err != nil {
				t.Fatalf("output does not parse as %T: %v\n%s", tt.into, err, r.stdout)
			}
			if !proto.Equal(tt.into, tt.want) {
				t.Errorf("round trip differs:\ngot  %v\nwant %v", tt.into, tt.want)
			}
		})
	}
}

// TestJSONShape pins the documented conventions of --json output.
func TestJSONShape(t *testing.T) {
	ts := startServer(t)
	r := ts.run(t, nil, "report", "--json")
	if r.code != ExitOK {
		t.Fatalf("got %v", r)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"current_device", "all_devices", "configuration", "runtimes", "routing_mode", "recommendations", "batch_plans", "selection_reason"} {
		if _, ok := doc[key]; !ok {
			t.Errorf("report --json lacks %q", key)
		}
	}
	cfg, _ := doc["configuration"].(map[string]any)
	for _, key := range []string{"prefer", "allow_tpu", "tpu_batch_factor"} {
		if _, ok := cfg[key]; !ok {
			t.Errorf("configuration lacks %q", key)
		}
	}
	if got := doc["routing_mode"]; got != "ROUTING_MODE_AUTO" {
		t.Errorf("routing_mode = %v, want the enum name", got)
	}
	dev, _ := doc["current_device"].(map[string]any)
	tests := []struct {
		key  string
		want any
	}{
		{key: "type", want: "DEVICE_TYPE_CPU"},
		{key: "memory_total_bytes", want: "68719476736"}, // 64-bit integers are strings
		{key: "cordon_reason", want: ""},                 // unpopulated fields are present
		{key: "uuid", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			if got, ok := dev[tt.key]; !ok || got != tt.want {
				t.Errorf("current_device.%s = %#v (present %v), want %#v", tt.key, got, ok, tt.want)
			}
		})
	}
	if !strings.HasPrefix(r.stdout, "{\n  \"") || !strings.HasSuffix(r.stdout, "}\n") {
		t.Errorf("output is not indented by two spaces:\n%.80s", r.stdout)
	}
}

func TestDeviceFields(t *testing.T) {
	ts := startServer(t)
	tests := []struct {
		name string
		id   string
		want []string // lines, matched after collapsing alignment spaces
		not  []string
	}{
		{
			name: "gpu", id: "gpu:0",
			want: []string{
				"id: gpu:0", "type: gpu", "name: NVIDIA H100 80GB HBM3", "numa_node: 1",
				"memory_total_bytes: 79.6 GiB (85520809984)", "runnable: no", "runtime_reason: no PJRT plugin found",
				"health: healthy", "cordoned: no", "device_paths: /dev/nvidia0", "cost_per_hour_usd: 0.5",
				"telemetry:", "  temperature_celsius: 34", "  power_limit_watts: 700", "  updated_at: 2026-01-02T03:04:05Z",
				"gpu:", "  nvml_index: 0", "  cuda_version: 12.4", "attributes:", "  board: SXM5", "  mig_mode: disabled",
			},
			not: []string{"cpu:", "tpu:", "uuid: \n", "cordon_reason"},
		},
		{
			name: "cpu", id: "cpu:0",
			want: []string{
				"numa_node: 0", "runtime: onednn", "runnable: yes", "cpu:", "  effective_cores: 1.5",
				"  flags: avx2, avx512f, amx_bf16", "  limit_source: cgroup v2 cpu.max",
			},
			not: []string{"gpu:", "telemetry:", "attributes:"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ts.run(t, nil, "device", tt.id)
			if r.code != ExitOK {
				t.Fatalf("got %v", r)
			}
			lines := map[string]bool{}
			for _, l := range strings.Split(r.stdout, "\n") {
				key, val, _ := strings.Cut(l, ":")
				lines[strings.TrimRight(key+":"+" "+strings.TrimSpace(val), " ")] = true
			}
			for _, w := range tt.want {
				if !lines[w] {
					t.Errorf("missing line %q in\n%s", w, r.stdout)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(r.stdout, n) {
					t.Errorf("unexpected %q in\n%s", n, r.stdout)
				}
			}
		})
	}
}

func TestReport(t *testing.T) {
	ts := startServer(t)
	tests := []struct {
		name    string
		args    []string
		verbose bool
		want    []string
		not     []string
	}{
		{
			name: "plain", args: []string{"report"},
			want: []string{
				"host:              testhost\n", "current device:    cpu:0 (cpu, Intel(R) Xeon(R) Platinum 8481C)\n",
				"selection reason:  auto: no TPU;", "fallback chain:    tpu -> gpu -> cpu\n", "routing mode:      auto\n",
				"configuration:\n", "  prefer:", "  allow_tpu:", "  tpu_batch_factor:", "  memory_strategy:", "    gpu:",
				"devices:\n  ID ", "runtimes:\n  NAME ", "  onednn  yes", "2.6.0", "no PJRT plugin found", "xla_cuda_plugin (not loaded)",
				"recommendations:\n  - A GPU is present but no PJRT plugin was found", "notes:\n  - AMD GPU",
			},
			not: []string{"batch plans:", "PCI BUS", "plugin xla_cuda_plugin"},
		},
		{
			name: "verbose", args: []string{"report", "--verbose"}, verbose: true,
			want: []string{
				"batch plans:\n  TYPE", "1 2 4 8 16 32", "PCI BUS", "- (no PJRT plugin found)",
				`plugin xla_cuda_plugin (pjrt): path=/opt/xla_cuda_plugin.so platform=- api=- loaded=no error="undefined symbol"`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ts.run(t, nil, tt.args...)
			if r.code != ExitOK {
				t.Fatalf("got %v", r)
			}
			ts.broker.mu.Lock()
			gotVerbose := ts.broker.lastReport.GetVerbose()
			ts.broker.mu.Unlock()
			if gotVerbose != tt.verbose {
				t.Errorf("request verbose = %v, want %v", gotVerbose, tt.verbose)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("missing %q in\n%s", w, r.stdout)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(r.stdout, n) {
					t.Errorf("unexpected %q in\n%s", n, r.stdout)
				}
			}
			// The embedded device table is aligned like the devices command's.
			_, after, _ := strings.Cut(r.stdout, "devices:\n")
			table, _, _ := strings.Cut(after, "\n\n")
			checkTable(t, table, []string{"ID", "TYPE", "NAME", "MEMORY", "BUDGET", "RUNTIME", "HEALTH", "CORDONED"})
		})
	}
}

func TestBatchPlan(t *testing.T) {
	ts := startServer(t)
	tests := []struct {
		name    string
		args    []string
		wantReq *brokerv1.GetBatchPlanRequest
		want    string
	}{
		{
			name:    "by type",
			args:    []string{"batch-plan", "--base", "2", "--type", "GPU"},
			wantReq: &brokerv1.GetBatchPlanRequest{BaseBatch: 2, Target: &brokerv1.GetBatchPlanRequest_DeviceType{DeviceType: brokerv1.DeviceType_DEVICE_TYPE_GPU}},
			want:    "device type:  gpu\nbase:         2\nfactor:       4\nmin:          1\nmax:          8\nbuckets:      1 2 4 8\n",
		},
		{
			name:    "by device",
			args:    []string{"batch-plan", "--device", "cpu:0", "--base=3"},
			wantReq: &brokerv1.GetBatchPlanRequest{BaseBatch: 3, Target: &brokerv1.GetBatchPlanRequest_DeviceId{DeviceId: "cpu:0"}},
			want:    "device type:  cpu\ndevice:       cpu:0\nbase:         3\nfactor:       1\nmin:          1\nmax:          3\nbuckets:      1 2\n",
		},
		{
			name:    "every type name",
			args:    []string{"batch-plan", "--base", "1", "--type", "edgetpu"},
			wantReq: &brokerv1.GetBatchPlanRequest{BaseBatch: 1, Target: &brokerv1.GetBatchPlanRequest_DeviceType{DeviceType: brokerv1.DeviceType_DEVICE_TYPE_EDGE_TPU}},
			want:    "device type:  edgetpu\nbase:         1\nfactor:       1\nmin:          1\nmax:          1\nbuckets:      1\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ts.run(t, nil, tt.args...)
			if r.code != ExitOK || r.stdout != tt.want {
				t.Errorf("got %v\nwant stdout:\n%s", r, tt.want)
			}
			ts.broker.mu.Lock()
			got := ts.broker.lastPlanReq
			ts.broker.mu.Unlock()
			if !proto.Equal(got, tt.wantReq) {
				t.Errorf("request = %v, want %v", got, tt.wantReq)
			}
		})
	}
}

func TestCordon(t *testing.T) {
	ts := startServer(t)
	header := []string{"ID", "TYPE", "NAME", "MEMORY", "BUDGET", "RUNTIME", "HEALTH", "CORDONED"}
	// Steps run in order: each sees the state the previous left.
	steps := []struct {
		name         string
		args         []string
		wantCordoned string
		wantReason   string
	}{
		{name: "cordon with reason after ID", args: []string{"cordon", "gpu:0", "--reason", "maintenance window"}, wantCordoned: "yes", wantReason: "maintenance window"},
		{name: "devices shows it", args: []string{"devices"}, wantCordoned: "yes"},
		{name: "uncordon", args: []string{"uncordon", "gpu:0"}, wantCordoned: "no"},
		{name: "cordon with flag before ID", args: []string{"cordon", "--reason=drain", "gpu:0"}, wantCordoned: "yes", wantReason: "drain"},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			r := ts.run(t, nil, st.args...)
			if r.code != ExitOK {
				t.Fatalf("got %v", r)
			}
			table, reason, _ := strings.Cut(r.stdout, "cordon reason: ")
			var gpu map[string]string
			for _, row := range checkTable(t, table, header) {
				if row["ID"] == "gpu:0" {
					gpu = row
				}
			}
			if gpu["CORDONED"] != st.wantCordoned {
				t.Errorf("CORDONED = %q, want %q\n%s", gpu["CORDONED"], st.wantCordoned, r.stdout)
			}
			if st.args[0] != "devices" && strings.TrimSpace(reason) != st.wantReason {
				t.Errorf("cordon reason = %q, want %q", reason, st.wantReason)
			}
		})
	}

	t.Run("json", func(t *testing.T) {
		r := ts.run(t, nil, "uncordon", "gpu:0", "--json")
		var resp brokerv1.UncordonDeviceResponse
		if err := protojson.Unmarshal([]byte(r.stdout), &resp); err != nil || r.code != ExitOK {
			t.Fatalf("got %v (parse error %v)", r, err)
		}
		if resp.GetDevice().GetId() != "gpu:0" || resp.GetDevice().GetCordoned() {
			t.Errorf("device = %v, want gpu:0 uncordoned", resp.GetDevice())
		}
	})
}

func TestErrors(t *testing.T) {
	ts := startServer(t)
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStderr string // prefix of stderr
	}{
		{name: "unknown device", args: []string{"device", "gpu:9"}, wantCode: ExitError,
			wantStderr: "brokerctl: device: device \"gpu:9\" not found (NOT_FOUND)\n"},
		{name: "cordon unknown device", args: []string{"cordon", "tpu:3"}, wantCode: ExitError,
			wantStderr: "brokerctl: cordon: device \"tpu:3\" not found (NOT_FOUND)\n"},
		{name: "batch-plan unknown device", args: []string{"batch-plan", "--base", "1", "--device", "gpu:7"}, wantCode: ExitError,
			wantStderr: "brokerctl: batch-plan: device \"gpu:7\" not found (NOT_FOUND)\n"},
		{name: "server rejects base", args: []string{"batch-plan", "--base", "0", "--type", "cpu"}, wantCode: ExitError,
			wantStderr: "brokerctl: batch-plan: base batch 0: must be positive (INVALID_ARGUMENT)\n"},
		{name: "no command", args: nil, wantCode: ExitUsage, wantStderr: "brokerctl: no command given\n"},
		{name: "unknown command", args: []string{"frobnicate"}, wantCode: ExitUsage, wantStderr: "brokerctl: unknown command \"frobnicate\""},
		{name: "unknown global flag", args: []string{"--nope", "devices"}, wantCode: ExitUsage, wantStderr: "brokerctl: unknown flag --nope (\"brokerctl help\" lists the flags)\n"},
		{name: "unknown command flag", args: []string{"devices", "--nope"}, wantCode: ExitUsage, wantStderr: "brokerctl: devices: unknown flag --nope (\"brokerctl help devices\" lists the flags)\n"},
		{name: "device without ID", args: []string{"device"}, wantCode: ExitUsage, wantStderr: "brokerctl: device: want 1 argument(s) (ID), got 0\n"},
		{name: "device with two IDs", args: []string{"device", "a", "b"}, wantCode: ExitUsage, wantStderr: "brokerctl: device: want 1 argument(s) (ID), got 2\n"},
		{name: "batch-plan without base", args: []string{"batch-plan", "--type", "gpu"}, wantCode: ExitUsage, wantStderr: "brokerctl: batch-plan: --base is required\n"},
		{name: "batch-plan without target", args: []string{"batch-plan", "--base", "2"}, wantCode: ExitUsage,
			wantStderr: "brokerctl: batch-plan: exactly one of --type or --device is required\n"},
		{name: "batch-plan with both targets", args: []string{"batch-plan", "--base", "2", "--type", "gpu", "--device", "gpu:0"}, wantCode: ExitUsage,
			wantStderr: "brokerctl: batch-plan: exactly one of --type or --device is required\n"},
		{name: "batch-plan bad type", args: []string{"batch-plan", "--base", "2", "--type", "fpga"}, wantCode: ExitUsage,
			wantStderr: "brokerctl: batch-plan: --type \"fpga\": want cpu, gpu, tpu, amdgpu or edgetpu\n"},
		{name: "batch-plan base not a number", args: []string{"batch-plan", "--base", "two", "--type", "gpu"}, wantCode: ExitUsage,
			wantStderr: "brokerctl: batch-plan: invalid value \"two\" for flag -base"},
		{name: "batch-plan base overflows int32", args: []string{"batch-plan", "--base", "4294967296", "--type", "gpu"}, wantCode: ExitUsage,
			wantStderr: "brokerctl: batch-plan: invalid value \"4294967296\" for flag -base"},
		{name: "bad timeout", args: []string{"--timeout", "soon", "devices"}, wantCode: ExitUsage, wantStderr: "brokerctl: invalid value \"soon\" for flag -timeout"},
		{name: "help for unknown command", args: []string{"help", "nope"}, wantCode: ExitUsage, wantStderr: "brokerctl: help: unknown command \"nope\" (\"brokerctl help\" lists the commands)\n"},
		{name: "timeout expires", args: []string{"devices", "--timeout", "1ns"}, wantCode: ExitError, wantStderr: "brokerctl: devices: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ts.run(t, nil, tt.args...)
			if r.code != tt.wantCode || !strings.HasPrefix(r.stderr, tt.wantStderr) || r.stdout != "" {
				t.Errorf("got %v\nwant exit %d, stderr starting %q, empty stdout", r, tt.wantCode, tt.wantStderr)
			}
			if tt.wantCode == ExitUsage && tt.args != nil && !strings.Contains(r.stderr, "usage: brokerctl") && !strings.Contains(r.stderr, "brokerctl help") {
				t.Errorf("usage error without usage hint:\n%s", r.stderr)
			}
		})
	}
	t.Run("timeout names the code", func(t *testing.T) {
		r := ts.run(t, nil, "devices", "--timeout", "1ns")
		if !strings.Contains(r.stderr, "no answer within --timeout 1ns") || !strings.HasSuffix(r.stderr, "(DEADLINE_EXCEEDED)\n") {
			t.Errorf("stderr = %q, want the timeout and DEADLINE_EXCEEDED", r.stderr)
		}
	})
}

// TestEndpointSelection checks where brokerctl connects: flags over
// environment over the default, and the address over the socket.
func TestEndpointSelection(t *testing.T) {
	ts := startServer(t)
	missing := filepath.Join(t.TempDir(), "missing.sock")
	deadAddr := "127.0.0.1:1"
	tests := []struct {
		name     string
		env      map[string]string
		args     []string
		wantCode int
		wantErr  string
	}{
		{name: "BROKERD_SOCKET", env: map[string]string{"BROKERD_SOCKET": ts.socket}, wantCode: ExitOK},
		{name: "--socket flag", env: map[string]string{}, args: []string{"--socket", ts.socket}, wantCode: ExitOK},
		{name: "--socket after the command", env: map[string]string{}, args: []string{"health", "--socket", ts.socket}, wantCode: ExitOK},
		{name: "--socket beats BROKERD_SOCKET", env: map[string]string{"BROKERD_SOCKET": missing}, args: []string{"--socket", ts.socket}, wantCode: ExitOK},
		{name: "BROKERD_ADDR beats BROKERD_SOCKET", env: map[string]string{"BROKERD_SOCKET": missing, "BROKERD_ADDR": ts.addr}, wantCode: ExitOK},
		{name: "--addr beats --socket", env: map[string]string{}, args: []string{"--socket", missing, "--addr", ts.addr}, wantCode: ExitOK},
		{name: "--socket beats BROKERD_ADDR", env: map[string]string{"BROKERD_ADDR": deadAddr}, args: []string{"--socket", ts.socket}, wantCode: ExitOK},
		{name: "XDG_RUNTIME_DIR default", env: map[string]string{"XDG_RUNTIME_DIR": ts.dir}, wantCode: ExitOK},
		{
			name: "missing socket", env: map[string]string{"BROKERD_SOCKET": missing}, wantCode: ExitError,
			wantErr: "brokerctl: health: cannot reach brokerd at socket " + missing + ": ",
		},
		{
			name: "dead address", env: map[string]string{"BROKERD_ADDR": deadAddr}, wantCode: ExitError,
			wantErr: "brokerctl: health: cannot reach brokerd at address " + deadAddr + ": ",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "XDG_RUNTIME_DIR default" {
				// The rule for root ignores XDG_RUNTIME_DIR; run as a user.
				var stdout, stderr strings.Builder
				a := &app{stdout: &stdout, stderr: &stderr, getenv: func(k string) string { return tt.env[k] }, euid: 1000}
				if code := a.run(t.Context(), []string{"health"}); code != tt.wantCode {
					t.Errorf("exit %d, want %d; stderr %q", code, tt.wantCode, stderr.String())
				}
				return
			}
			args := append(append([]string{}, tt.args...), "health")
			if len(tt.args) > 0 && tt.args[0] == "health" {
				args = tt.args
			}
			r := ts.run(t, tt.env, args...)
			if r.code != tt.wantCode {
				t.Fatalf("got %v, want exit %d", r, tt.wantCode)
			}
			if tt.wantErr == "" {
				if r.stdout != "SERVING\n" {
					t.Errorf("stdout = %q", r.stdout)
				}
				return
			}
			if !strings.HasPrefix(r.stderr, tt.wantErr) || !strings.Contains(r.stderr, "(UNAVAILABLE)\n") ||
				!strings.Contains(r.stderr, `"make run"`) || !strings.Contains(r.stderr, "--socket") {
				t.Errorf("stderr = %q, want it to start %q, name UNAVAILABLE and suggest make run / --socket", r.stderr, tt.wantErr)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantCode int
		toStdout bool
		want     []string
	}{
		{name: "help", args: []string{"help"}, wantCode: ExitOK, toStdout: true},
		{name: "-h", args: []string{"-h"}, wantCode: ExitOK, toStdout: true},
		{name: "--help", args: []string{"--help"}, wantCode: ExitOK, toStdout: true},
		{name: "no command", args: nil, wantCode: ExitUsage},
		{name: "help batch-plan", args: []string{"help", "batch-plan"}, wantCode: ExitOK, toStdout: true,
			want: []string{"usage: brokerctl batch-plan --base N (--type T | --device ID) [--json]", "  --base N\n", "  --type T\n", "  --device ID\n", "  --json\n"}},
		{name: "devices -h", args: []string{"devices", "-h"}, wantCode: ExitOK, toStdout: true,
			want: []string{"usage: brokerctl devices [--wide] [--json]", "  --wide\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// No server: help must never dial.
			r := runMain(t, map[string]string{"BROKERD_SOCKET": "/nonexistent/brokerd.sock"}, tt.args...)
			if r.code != tt.wantCode {
				t.Fatalf("got %v", r)
			}
			out := r.stderr
			if tt.toStdout {
				out = r.stdout
			}
			want := tt.want
			if want == nil {
				// The command list: every command with its one-line summary.
				for _, c := range commands() {
					want = append(want, "  "+c.name+" ", c.summary+"\n")
				}
				want = append(want, "--socket PATH", "BROKERD_SOCKET", "--addr HOST:PORT", "BROKERD_ADDR", "--timeout")
			}
			for _, w := range want {
				if !strings.Contains(out, w) {
					t.Errorf("help lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// TestJSONStable checks that two runs print the same bytes.
func TestJSONStable(t *testing.T) {
	ts := startServer(t)
	first := ts.run(t, nil, "devices", "--json")
	second := ts.run(t, nil, "devices", "--json")
	if first.code != ExitOK || first.stdout != second.stdout {
		t.Errorf("outputs differ or failed:\n%v\n%v", first, second)
	}
	var resp brokerv1.ListDevicesResponse
	if err := protojson.Unmarshal([]byte(first.stdout), &resp); err != nil {
		t.Fatal(err)
	}
	again, err := marshalJSON(&resp)
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != first.stdout {
		t.Errorf("re-marshalling changed the output")
	}
}

// TestPermissionDenied checks that a refused admin command prints one line
// naming the role it needs, from brokerd's ErrorInfo, or the server's message
// when there is none.
func TestPermissionDenied(t *testing.T) {
	ts := startServer(t)
	withInfo, err := status.New(codes.PermissionDenied, "/broker.v1.BrokerService/CordonDevice needs the admin role; long server text").WithDetails(&errdetails.ErrorInfo{
		Reason: "ROLE_REQUIRED", Domain: "brokerd", Metadata: map[string]string{
			"method": "/broker.v1.BrokerService/CordonDevice", "role": "admin",
			"caller": "uid 65534 (gid 65534, groups none, pid 7) on the Unix socket",
			"grant":  "to grant it, start brokerd with --admin-uids 65534",
		}})
	if err != nil {
		t.Fatal(err)
	}
	ts.mu.Lock()
	ts.deny = map[string]*status.Status{
		"/broker.v1.BrokerService/CordonDevice": withInfo,
		"/broker.v1.BrokerService/Drain":        status.New(codes.PermissionDenied, "not\nallowed"),
	}
	ts.mu.Unlock()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"cordon", "gpu:0"}, "brokerctl: cordon: permission denied: needs brokerd's admin role; brokerd saw uid 65534 (gid 65534, groups none, pid 7) on the Unix socket; " +
			"to grant it, start brokerd with --admin-uids 65534 (PERMISSION_DENIED)\n"},
		{[]string{"drain", "--exit"}, "brokerctl: drain: permission denied: not allowed (PERMISSION_DENIED)\n"},
	}
	for _, tt := range tests {
		r := ts.run(t, nil, tt.args...)
		if r.code != ExitError || r.stderr != tt.want || r.stdout != "" {
			t.Errorf("%v: got %v\nwant exit 1 and stderr %q", tt.args, r, tt.want)
		}
	}
}

// TestModelTableDetails: `brokerctl models` shows a model's file size,
// parameter count and quantization, and a dash where the repository does
// not say.
func TestModelTableDetails(t *testing.T) {
	var b bytes.Buffer
	err := writeModelTable(&b, []*brokerv1.Model{
		{Name: "qwen2.5:0.5b", Version: 1, Kind: "llm", State: brokerv1.ModelState_MODEL_STATE_AVAILABLE,
			FileBytes: 531 << 20, ParameterSize: "494.03M", Quantization: "Q8_0", AvailableVersions: []int64{1}},
		{Name: "mlp", Version: 2, Kind: "mlp", State: brokerv1.ModelState_MODEL_STATE_READY, AvailableVersions: []int64{1, 2}},
	}, false)
	if err != nil {
		t.Fatal(err)
	}
	rows := checkTable(t, b.String(), []string{"NAME", "VERSION", "KIND", "STATE", "DEVICES", "MEMORY", "SIZE", "PARAMS", "QUANT", "VERSIONS"})
	want := map[string][3]string{"qwen2.5:0.5b": {"531.0 MiB", "494.03M", "Q8_0"}, "mlp": {"-", "-", "-"}}
	for _, r := range rows {
		if w := want[r["NAME"]]; [3]string{r["SIZE"], r["PARAMS"], r["QUANT"]} != w {
			t.Errorf("%s: SIZE %s PARAMS %s QUANT %s, want %v", r["NAME"], r["SIZE"], r["PARAMS"], r["QUANT"], w)
		}
	}
}
