package cli

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

var (
	statsHeader = []string{"MODEL", "DEVICE", "QUEUED", "RUNNING", "COMPLETED", "FAILED", "MEAN-BATCH", "P50", "P95", "P99", "ITEMS/S", "BUSY-ITEMS/S"}
	genHeader   = []string{"MODEL", "DEVICE", "RUNNING", "WAITING", "COMPLETED", "FAILED", "PROMPT-TOK/S", "OUT-TOK/S",
		"TTFT-P50", "TTFT-P99", "ITL-P50", "ITL-P99", "KV-BLOCKS", "KV-TYPE", "PREFIX-HIT", "PREEMPTED", "ACCEPT", "DEFERRED"}
)

func TestStatsTable(t *testing.T) {
	nbmfAll := map[string]string{
		"MODEL": "nbmf-hash-v1", "DEVICE": "all", "QUEUED": "3", "RUNNING": "8", "COMPLETED": "12345",
		"FAILED": "timeout=2 backend=1", "MEAN-BATCH": "7.50", "P50": "1.200ms", "P95": "3.400ms", "P99": "10.100ms", "ITEMS/S": "812.3", "BUSY-ITEMS/S": "4321.6",
	}
	nbmfCPU := map[string]string{"MODEL": "nbmf-hash-v1", "DEVICE": "cpu:0", "FAILED": "-"}
	bert := map[string]string{
		"MODEL": "bert-small", "DEVICE": "gpu:0", "QUEUED": "0", "COMPLETED": "7", "FAILED": "cancelled=4 oom=1",
		"MEAN-BATCH": "1.00", "P50": "0.050ms", "P99": "250.000ms", "ITEMS/S": "0.0", "BUSY-ITEMS/S": "0.5",
	}
	qwenAll := map[string]string{
		"MODEL": "qwen@1", "DEVICE": "all", "RUNNING": "8", "WAITING": "2", "COMPLETED": "120", "FAILED": "cancelled=1",
		"PROMPT-TOK/S": "310.4", "OUT-TOK/S": "96.0", "TTFT-P50": "45.000ms", "TTFT-P99": "200.000ms",
		"ITL-P50": "12.000ms", "ITL-P99": "30.000ms", "KV-BLOCKS": "12/64", "KV-TYPE": "q8_0", "PREFIX-HIT": "30.0%", "PREEMPTED": "3", "ACCEPT": "62.5%", "DEFERRED": "5",
	}
	qwenCPU := map[string]string{"MODEL": "qwen@1", "DEVICE": "cpu:0", "RUNNING": "8", "FAILED": "-", "KV-BLOCKS": "12/64", "KV-TYPE": "q8_0", "ACCEPT": "62.5%"}
	tests := []struct {
		name      string
		args      []string
		wantModel string
		want      []map[string]string // batch rows in order, columns checked
		wantGen   []map[string]string // generator rows
	}{
		{name: "all models sorted", args: []string{"stats"}, want: []map[string]string{bert, nbmfAll, nbmfCPU}, wantGen: []map[string]string{qwenAll, qwenCPU}},
		{name: "one model", args: []string{"stats", "--model", "nbmf-hash-v1"}, wantModel: "nbmf-hash-v1", want: []map[string]string{nbmfAll, nbmfCPU}},
		{name: "a generator", args: []string{"stats", "--model", "qwen@1"}, wantModel: "qwen@1", wantGen: []map[string]string{qwenAll, qwenCPU}},
	}
	check := func(t *testing.T, out, table string, header []string, want []map[string]string) {
		t.Helper()
		rows := checkTable(t, table, header)
		if len(rows) != len(want) {
			t.Fatalf("got %d rows, want %d:\n%s", len(rows), len(want), out)
		}
		for i, want := range want {
			for col, w := range want {
				if rows[i][col] != w {
					t.Errorf("row %d %s = %q, want %q\n%s", i, col, rows[i][col], w, out)
				}
			}
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := startServer(t)
			r := ts.run(t, nil, tt.args...)
			if r.code != ExitOK || r.stderr != "" {
				t.Fatalf("got %v", r)
			}
			// A table of batch queues, a blank line, and one of
			// generators; either alone when the other has no rows.
			tables := strings.Split(r.stdout, "\n\n")
			if want := min(len(tt.want), 1) + min(len(tt.wantGen), 1); len(tables) != want {
				t.Fatalf("%d tables, want %d:\n%s", len(tables), want, r.stdout)
			}
			if len(tt.want) > 0 {
				check(t, r.stdout, tables[0], statsHeader, tt.want)
			}
			if len(tt.wantGen) > 0 {
				check(t, r.stdout, tables[len(tables)-1], genHeader, tt.wantGen)
			}
			ts.broker.mu.Lock()
			got := ts.broker.lastStats.GetModel()
			ts.broker.mu.Unlock()
			if got != tt.wantModel {
				t.Errorf("request model = %q, want %q", got, tt.wantModel)
			}
		})
	}
}

func TestStatsJSON(t *testing.T) {
	ts := startServer(t)
	r := ts.run(t, nil, "stats", "--json")
	if r.code != ExitOK {
		t.Fatalf("got %v", r)
	}
	var got brokerv1.GetStatsResponse
	if err := protojson.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("does not parse as GetStatsResponse: %v\n%s", err, r.stdout)
	}
	if want := (&brokerv1.GetStatsResponse{Stats: cannedStats()}); !proto.Equal(&got, want) {
		t.Errorf("round trip differs:\ngot  %v\nwant %v", &got, want)
	}
	if !strings.Contains(r.stdout, `"completed": "12345"`) || !strings.Contains(r.stdout, `"p99_seconds": 0.0101`) {
		t.Errorf("not the documented protojson conventions:\n%s", r.stdout)
	}
}

func TestStatsUnknownModel(t *testing.T) {
	ts := startServer(t)
	r := ts.run(t, nil, "stats", "--model", "nope")
	if want := "brokerctl: stats: model \"nope\" not found (NOT_FOUND)\n"; r.code != ExitError || r.stderr != want {
		t.Errorf("got %v\nwant exit 1, stderr %q", r, want)
	}
}

func TestAcceptCell(t *testing.T) {
	for _, tt := range []struct {
		drafted, accepted int64
		want              string
	}{
		{0, 0, "-"},
		{400, 250, "62.5%"},
		{3, 0, "0.0%"},
		{7, 7, "100.0%"},
	} {
		g := &brokerv1.GenerationStats{SpecDraftTokens: tt.drafted, SpecAcceptedTokens: tt.accepted}
		if got := acceptCell(g); got != tt.want {
			t.Errorf("acceptCell(%d drafted, %d accepted) = %q, want %q", tt.drafted, tt.accepted, got, tt.want)
		}
	}
	if got := acceptCell(nil); got != "-" {
		t.Errorf("acceptCell(nil) = %q, want -", got)
	}
}

func TestFailureCell(t *testing.T) {
	tests := []struct {
		in   map[string]int64
		want string
	}{
		{nil, "-"},
		{map[string]int64{"timeout": 0}, "-"},
		{map[string]int64{"backend": 1, "timeout": 2}, "timeout=2 backend=1"},
		{map[string]int64{"zeta": 1, "alpha": 3, "rejected": 5, "cancelled": 4}, "rejected=5 cancelled=4 alpha=3 zeta=1"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := failureCell(tt.in); got != tt.want {
				t.Errorf("failureCell(%v) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestDrain(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantExit bool
		want     string
	}{
		{name: "stay", args: []string{"drain"},
			want: "drained: 42 item(s) completed while draining\nbrokerd accepts no new work until it restarts\n"},
		{name: "exit", args: []string{"drain", "--exit"}, wantExit: true,
			want: "drained: 42 item(s) completed while draining\nbrokerd is exiting\n"},
		{name: "json", args: []string{"drain", "--exit", "--json"}, wantExit: true, want: "{\n  \"completed\": \"42\"\n}\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := startServer(t)
			r := ts.run(t, nil, tt.args...)
			if r.code != ExitOK || r.stdout != tt.want {
				t.Errorf("got %v\nwant stdout %q", r, tt.want)
			}
			ts.broker.mu.Lock()
			req := ts.broker.lastDrain
			ts.broker.mu.Unlock()
			if req == nil || req.GetExit() != tt.wantExit {
				t.Errorf("drain request = %v, want exit %v", req, tt.wantExit)
			}
		})
	}
}
