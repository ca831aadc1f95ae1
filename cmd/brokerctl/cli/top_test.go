package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// splitTopFrame cuts a plain frame into its title and its tables: devices,
// queues, and generators when there are any.
func splitTopFrame(t *testing.T, frame string) (title, devices, queues string) {
	t.Helper()
	title, devices, queues, _ = splitTopFrameGen(t, frame)
	return title, devices, queues
}

func splitTopFrameGen(t *testing.T, frame string) (title, devices, queues, gens string) {
	t.Helper()
	parts := strings.Split(frame, "\n\n")
	if len(parts) != 3 && len(parts) != 4 {
		t.Fatalf("frame has %d blank-line separated parts, want 3 or 4:\n%s", len(parts), frame)
	}
	if len(parts) == 4 {
		gens = parts[3]
	}
	return parts[0], parts[1], parts[2], gens
}

func TestTopOnce(t *testing.T) {
	ts := startServer(t)
	tests := []struct {
		name       string
		args       []string
		wantModels []string // MODEL/DEVICE of each queue row, in order
	}{
		{name: "all models", args: []string{"top", "--once"}, wantModels: []string{"bert-small/gpu:0", "nbmf-hash-v1/all", "nbmf-hash-v1/cpu:0"}},
		{name: "one model", args: []string{"top", "--once", "--model", "bert-small"}, wantModels: []string{"bert-small/gpu:0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ts.run(t, nil, tt.args...)
			if r.code != ExitOK || r.stderr != "" {
				t.Fatalf("got %v", r)
			}
			if strings.ContainsAny(r.stdout, "\x1b\r") {
				t.Fatalf("--once output has escape codes or carriage returns: %q", r.stdout)
			}
			title, devs, queues := splitTopFrame(t, r.stdout)
			// One frame: no refresh interval, no keys to quit with.
			if !regexp.MustCompile(`^brokerd top  \d\d:\d\d:\d\d$`).MatchString(title) {
				t.Errorf("title %q", title)
			}
			byID := map[string]map[string]string{}
			for _, row := range checkTable(t, devs, []string{"DEVICE", "TYPE", "NAME", "MEMORY", "UTIL", "TEMP", "HEALTH", "CORDONED"}) {
				byID[row["DEVICE"]] = row
			}
			want := map[string]map[string]string{
				"cpu:0":    {"TYPE": "cpu", "MEMORY": "64.0 GiB", "UTIL": "-", "TEMP": "-", "HEALTH": "healthy", "CORDONED": "no"},
				"gpu:0":    {"NAME": "NVIDIA H100 80GB HBM3", "MEMORY": "600.0 MiB / 79.6 GiB", "UTIL": "12%", "TEMP": "34 C"},
				"amdgpu:0": {"TYPE": "amdgpu", "MEMORY": "64.0 GiB", "UTIL": "-"},
			}
			if len(byID) != len(want) {
				t.Errorf("%d device rows, want %d:\n%s", len(byID), len(want), devs)
			}
			for id, cols := range want {
				for col, v := range cols {
					if got := byID[id][col]; got != v {
						t.Errorf("%s %s = %q, want %q", id, col, got, v)
					}
				}
			}
			rows := checkTable(t, queues, []string{"MODEL", "DEVICE", "QUEUED", "RUNNING", "ITEMS/S", "BUSY-ITEMS/S", "P99", "MEAN-BATCH"})
			var got []string
			for _, row := range rows {
				got = append(got, row["MODEL"]+"/"+row["DEVICE"])
			}
			if strings.Join(got, ",") != strings.Join(tt.wantModels, ",") {
				t.Fatalf("queue rows %v, want %v", got, tt.wantModels)
			}
			if tt.name == "all models" {
				if r := rows[1]; r["QUEUED"] != "3" || r["ITEMS/S"] != "812.3" || r["BUSY-ITEMS/S"] != "4321.6" || r["P99"] != "10.100ms" || r["MEAN-BATCH"] != "7.50" {
					t.Errorf("nbmf-hash-v1 total row %v", r)
				}
			}
			// The generators have a table of their own, after the queues.
			_, _, _, gens := splitTopFrameGen(t, r.stdout)
			if tt.name != "all models" {
				if gens != "" {
					t.Errorf("a generator table for %v:\n%s", tt.args, gens)
				}
				return
			}
			g := checkTable(t, gens, genHeader)
			if len(g) != 2 || g[0]["MODEL"] != "qwen@1" || g[0]["DEVICE"] != "all" || g[0]["RUNNING"] != "8" || g[0]["WAITING"] != "2" ||
				g[0]["OUT-TOK/S"] != "96.0" || g[0]["TTFT-P99"] != "200.000ms" || g[0]["ITL-P50"] != "12.000ms" || g[0]["KV-BLOCKS"] != "12/64" ||
				g[0]["PREEMPTED"] != "3" || g[1]["DEVICE"] != "cpu:0" {
				t.Errorf("generator rows %v", g)
			}
		})
	}
}

// TestTopGeneratorsOnly: a frame of generators alone shows their table
// where the queues' would be (with 8 sequences generating, top showed no
// model at all).
func TestTopGeneratorsOnly(t *testing.T) {
	ts := startServer(t)
	r := ts.run(t, nil, "top", "--once", "--model", "qwen@1")
	if r.code != ExitOK || r.stderr != "" {
		t.Fatalf("got %v", r)
	}
	_, _, table := splitTopFrame(t, r.stdout)
	rows := checkTable(t, table, genHeader)
	if len(rows) != 2 || rows[0]["RUNNING"] != "8" || rows[1]["DEVICE"] != "cpu:0" {
		t.Errorf("rows %v\n%s", rows, r.stdout)
	}
}

func TestTopUsageAndErrors(t *testing.T) {
	ts := startServer(t)
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStderr string
	}{
		{"zero interval", []string{"top", "--interval", "0s"}, ExitUsage, "brokerctl: top: --interval 0s: must be positive\n"},
		{"unknown model", []string{"top", "--once", "--model", "gpt-9"}, ExitError, "brokerctl: top: model \"gpt-9\" not found (NOT_FOUND)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ts.run(t, nil, tt.args...)
			if r.code != tt.wantCode || !strings.HasPrefix(r.stderr, tt.wantStderr) || r.stdout != "" {
				t.Errorf("got %v\nwant exit %d, stderr starting %q", r, tt.wantCode, tt.wantStderr)
			}
		})
	}
}

// TestTopQuitKeyThroughPipe runs the live view with stdin a pipe holding
// "xq": it draws, ignores x, quits on q, and leaves the screen as it found it.
func TestTopQuitKeyThroughPipe(t *testing.T) {
	ts := startServer(t)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	if _, err := pw.WriteString("xq"); err != nil {
		t.Fatal(err)
	}
	defer pw.Close() // open: an ended stdin must not be what stops top

	done := make(chan result, 1)
	go func() {
		done <- runWith(t.Context(), pr, map[string]string{"BROKERD_SOCKET": ts.socket}, "top", "--interval", "1h")
	}()
	select {
	case r := <-done:
		if r.code != ExitOK || r.stderr != "" {
			t.Fatalf("got %v", r)
		}
		if !strings.HasPrefix(r.stdout, enterScreen+cursorHome) || !strings.HasSuffix(r.stdout, clearBelow+leaveScreen) {
			t.Errorf("output does not enter, draw and leave the screen: %q", r.stdout)
		}
		if !strings.Contains(r.stdout, "nbmf-hash-v1") {
			t.Errorf("no frame drawn: %q", r.stdout)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("top did not quit on q")
	}
}

// TestTopCtrlC ends the live view the way main's signal handler does: by
// cancelling the context. That is a clean exit, not an error.
func TestTopCtrlC(t *testing.T) {
	ts := startServer(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan result, 1)
	go func() {
		done <- runWith(ctx, nil, map[string]string{"BROKERD_SOCKET": ts.socket}, "top", "--interval", "10ms")
	}()
	time.Sleep(100 * time.Millisecond)
	cancel()
	select {
	case r := <-done:
		if r.code != ExitOK || r.stderr != "" || !strings.HasSuffix(r.stdout, leaveScreen) {
			t.Errorf("got %v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("top did not stop on cancel")
	}
}

func TestIsQuitKey(t *testing.T) {
	for _, tt := range []struct {
		key  byte
		want bool
	}{{'q', true}, {'Q', true}, {0x03, true}, {0x04, true}, {'x', false}, {' ', false}, {'\n', false}, {0x1b, false}} {
		t.Run(fmt.Sprintf("%#02x", tt.key), func(t *testing.T) {
			if got := isQuitKey(tt.key); got != tt.want {
				t.Errorf("isQuitKey(%q) = %v, want %v", tt.key, got, tt.want)
			}
		})
	}
}

// scriptedClient answers from a list of replies, one per refresh.
type scriptedClient struct {
	mu      sync.Mutex
	replies []error // nil: answer with the canned data; else fail with it
	calls   int
}

func (c *scriptedClient) next() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := min(c.calls, len(c.replies)-1)
	c.calls++
	return c.replies[i]
}

func (c *scriptedClient) ListDevices(context.Context, *brokerv1.ListDevicesRequest, ...grpc.CallOption) (*brokerv1.ListDevicesResponse, error) {
	if err := c.next(); err != nil {
		return nil, err
	}
	return &brokerv1.ListDevicesResponse{Devices: cannedDevices()[:1]}, nil
}

func (c *scriptedClient) GetStats(context.Context, *brokerv1.GetStatsRequest, ...grpc.CallOption) (*brokerv1.GetStatsResponse, error) {
	return &brokerv1.GetStatsResponse{Stats: cannedStats()[:1]}, nil
}

// frameWriter records each write (one per frame) and signals it.
type frameWriter struct {
	mu     sync.Mutex
	writes []string
	wrote  chan struct{}
}

func (w *frameWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.writes = append(w.writes, string(p))
	w.mu.Unlock()
	w.wrote <- struct{}{}
	return len(p), nil
}

// TestTopRedraw drives the loop with a fake clock, ticker and keyboard: one
// frame per tick, each replacing the last in place, a failed refresh shown
// over the last good data, and q ending it.
func TestTopRedraw(t *testing.T) {
	clock := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	v := &topView{
		client:   &scriptedClient{replies: []error{nil, nil, status.Error(codes.Unavailable, "connection refused"), nil}},
		interval: 2 * time.Second,
		now: func() time.Time {
			clock = clock.Add(2 * time.Second)
			return clock
		},
	}
	out := &frameWriter{wrote: make(chan struct{}, 16)}
	keys := make(chan byte)
	tick := make(chan time.Time)
	done := make(chan error, 1)
	go func() { done <- v.loop(t.Context(), out, keys, tick) }()

	wait := func(n int) {
		t.Helper()
		for range n {
			select {
			case <-out.wrote:
			case <-time.After(5 * time.Second):
				t.Fatal("no frame written")
			}
		}
	}
	wait(2) // enter the screen, first frame
	for range 3 {
		tick <- clock
		wait(1)
	}
	keys <- 'x' // ignored: no redraw
	keys <- 'q'
	wait(1) // leave the screen
	if err := <-done; err != nil {
		t.Fatalf("loop returned %v", err)
	}

	w := out.writes
	if len(w) != 6 || w[0] != enterScreen || w[5] != leaveScreen {
		t.Fatalf("writes %q: want enter, 4 frames, leave", w)
	}
	wantTimes := []string{"03:04:07", "03:04:09", "03:04:11", "03:04:13"}
	for i, frame := range w[1:5] {
		if !strings.HasPrefix(frame, cursorHome) || !strings.HasSuffix(frame, clearBelow) {
			t.Errorf("frame %d does not redraw in place: %q", i, frame)
		}
		body := strings.TrimSuffix(strings.TrimPrefix(frame, cursorHome), clearBelow)
		lines := strings.Split(strings.TrimSuffix(body, clearEOL+"\r\n"), clearEOL+"\r\n")
		if strings.Contains(strings.Join(lines, ""), "\n") {
			t.Errorf("frame %d has a line not ending in clear-to-EOL CR LF: %q", i, frame)
		}
		if !strings.Contains(lines[0], wantTimes[i]) || !strings.Contains(lines[0], "every 2s") {
			t.Errorf("frame %d title %q, want time %s", i, lines[0], wantTimes[i])
		}
		failed := strings.Contains(body, "refresh failed, showing the last frame: rpc error: code = Unavailable desc = connection refused")
		if failed != (i == 2) {
			t.Errorf("frame %d shows the failure: %v, want %v", i, failed, i == 2)
		}
		if !strings.Contains(body, "cpu:0") || !strings.Contains(body, "nbmf-hash-v1") {
			t.Errorf("frame %d lost the data: %q", i, body)
		}
	}
}

// TestTopFirstFetchFails checks a broker that cannot be reached fails at
// once, before touching the screen.
func TestTopFirstFetchFails(t *testing.T) {
	v := &topView{client: &scriptedClient{replies: []error{status.Error(codes.Unavailable, "down")}}, interval: time.Second, now: time.Now}
	var out bytes.Buffer
	err := v.loop(t.Context(), &out, nil, nil)
	if status.Code(err) != codes.Unavailable || out.Len() != 0 {
		t.Errorf("err %v, output %q: want UNAVAILABLE and nothing written", err, out.String())
	}
	if errors.Is(err, context.Canceled) {
		t.Error("reported as cancelled")
	}
}
