package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/server/config"
)

// slowTokenizer is byteTokenizer whose detokenizer takes delay a token, so
// a generation of many tokens lasts far longer than a test's grace.
type slowTokenizer struct {
	byteTokenizer
	delay time.Duration
}

func (s slowTokenizer) NewDetokenizer() llm.Detokenizer {
	return &slowDetok{byteDetok: &byteDetok{}, delay: s.delay}
}

type slowDetok struct {
	*byteDetok
	delay time.Duration
}

func (d *slowDetok) Next(id int32) string {
	time.Sleep(d.delay)
	return d.byteDetok.Next(id)
}

// startGenerator starts brokerd with the tiny random LLM "tiny-llm" whose
// tokens each take delay, the HTTP APIs, and grace.
func startGenerator(t *testing.T, delay, grace time.Duration) *daemon {
	t.Helper()
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.LoadModels = "tiny-llm"
	cfg.HTTPListen = "127.0.0.1:0"
	cfg.HTTPAllowUnauthenticated = true
	cfg.ShutdownGrace = config.Duration(grace)
	writeTinyLlama(t, cfg.ModelRepo, "tiny-llm")
	tok := slowTokenizer{delay: delay}
	return startDaemonWith(t, Options{Config: cfg, Tokenizers: func(context.Context, string, func(string, int64) ([]byte, error)) (llm.Tokenizer, llm.ChatTemplate, error) {
		return tok, tok, nil
	}})
}

// httpStream is one streaming HTTP call: its lines as they came, and how
// its body ended.
type httpStream struct {
	name    string
	lines   []string
	readErr error // nil: the body ended cleanly (its last chunk came)
	code    int
}

// startStreams starts a streaming call on each of the four streaming
// routes, each asking for maxTokens greedy tokens, and returns once each
// has sent its first line; done receives each stream when it ends.
func startStreams(t *testing.T, base string, maxTokens int) (done chan *httpStream) {
	t.Helper()
	bodies := map[string]string{
		"/v1/chat/completions": `{"model":"tiny-llm","stream":true,"temperature":0,"max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`,
		"/v1/completions":      `{"model":"tiny-llm","stream":true,"temperature":0,"max_tokens":%d,"prompt":"the council meets"}`,
		"/api/chat":            `{"model":"tiny-llm","options":{"temperature":0,"num_predict":%d},"messages":[{"role":"user","content":"hi"}]}`,
		"/api/generate":        `{"model":"tiny-llm","options":{"temperature":0,"num_predict":%d},"prompt":"the council meets"}`,
	}
	done = make(chan *httpStream, len(bodies))
	started := make(chan string, len(bodies))
	for route, body := range bodies {
		body = fmt.Sprintf(body, maxTokens)
		go func() {
			s := &httpStream{name: route}
			defer func() { done <- s }()
			resp, err := http.Post(base+route, "application/json", strings.NewReader(body))
			if err != nil {
				s.readErr = err
				started <- route
				return
			}
			defer resp.Body.Close()
			s.code = resp.StatusCode
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			first := true
			for sc.Scan() {
				if sc.Text() == "" {
					continue
				}
				s.lines = append(s.lines, sc.Text())
				if first {
					started <- route
					first = false
				}
			}
			if first {
				started <- route
			}
			s.readErr = sc.Err()
		}()
	}
	for range bodies {
		select {
		case <-started:
		case <-time.After(60 * time.Second):
			t.Fatal("a stream sent nothing within 60s")
		}
	}
	return done
}

// stopAndWait cancels the daemon's context and waits (up to limit) for Run
// to return, reporting how long it took.
func stopAndWait(t *testing.T, d *daemon, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	d.stop()
	d.stop = nil
	select {
	case err := <-d.done:
		if err != nil {
			t.Errorf("Run returned %v", err)
		}
	case <-time.After(limit):
		t.Fatalf("brokerd did not stop within %v", limit)
	}
	d.conn.Close()
	return time.Since(start)
}

// lineJSON decodes a stream's line (less an SSE "data: " prefix).
func lineJSON(line string) map[string]any {
	var v map[string]any
	_ = json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &v)
	return v
}

// TestShutdownEndsStreamsCleanly (Hardening II, finding 5): with
// --shutdown-grace 5s brokerd exited after 16.7 s (the drain, the HTTP
// server's Shutdown and gRPC's GracefulStop each waited a whole grace),
// and HTTP streams still running were cut with no error event, [DONE] or
// done line, like a network fault. Now one deadline bounds the stop: what
// still runs when the grace ends is ended with an error its client reads
// (OpenAI: an error event, then data: [DONE]; Ollama: a last line with an
// "error" field; gRPC: UNAVAILABLE), and Run returns shortly after.
func TestShutdownEndsStreamsCleanly(t *testing.T) {
	const grace = time.Second
	// 200 tokens at 30 ms each: six seconds or more, far past the grace.
	d := startGenerator(t, 30*time.Millisecond, grace)
	done := startStreams(t, "http://"+d.addrs.HTTP, 200)
	// And one over gRPC.
	gst, err := brokerv1.NewBrokerServiceClient(d.conn).Generate(testCtx(t), &brokerv1.GenerateRequest{Model: "tiny-llm", Prompts: []string{"a"},
		Sampling: &brokerv1.SamplingParams{Temperature: new(float32), MaxTokens: 200, IgnoreEos: true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gst.Recv(); err != nil {
		t.Fatal(err)
	}
	gerr := make(chan error, 1)
	go func() {
		for {
			if _, err := gst.Recv(); err != nil {
				gerr <- err
				return
			}
		}
	}()

	took := stopAndWait(t, d, 30*time.Second)
	t.Logf("Run returned %v after the stop (grace %v)", took, grace)

	for range 4 {
		s := <-done
		if s.readErr != nil || s.code != http.StatusOK || len(s.lines) < 2 {
			t.Errorf("%s: status %d, %d lines, ended with %v: want a stream that ends cleanly", s.name, s.code, len(s.lines), s.readErr)
			continue
		}
		last := s.lines[len(s.lines)-1]
		if strings.HasPrefix(s.name, "/v1/") {
			// OpenAI: the error event, then [DONE].
			if last != "data: [DONE]" {
				t.Errorf("%s ended with %q, want data: [DONE]", s.name, last)
			}
			e, _ := lineJSON(s.lines[len(s.lines)-2])["error"].(map[string]any)
			if msg, _ := e["message"].(string); e == nil || !strings.Contains(msg, "draining") || e["code"] != "unavailable" {
				t.Errorf("%s: the event before [DONE] is %q, want an error event saying brokerd is draining", s.name, s.lines[len(s.lines)-2])
			}
			continue
		}
		// Ollama: a last line with an error.
		if msg, _ := lineJSON(last)["error"].(string); !strings.Contains(msg, "draining") {
			t.Errorf("%s ended with %q, want a line with an error saying brokerd is draining", s.name, last)
		}
	}
	if err := <-gerr; status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "draining") {
		t.Errorf("the gRPC stream ended with %v, want UNAVAILABLE saying brokerd is draining", err)
	}
}

// TestShutdownLetsStreamsFinish: streams that finish within the grace
// finish normally (drain semantics), and Run returns once they have.
func TestShutdownLetsStreamsFinish(t *testing.T) {
	// Ten tokens at 20 ms each: well inside a 20 s grace.
	d := startGenerator(t, 20*time.Millisecond, 20*time.Second)
	done := startStreams(t, "http://"+d.addrs.HTTP, 10)
	took := stopAndWait(t, d, 60*time.Second)
	t.Logf("Run returned %v after the stop (grace 20s)", took)
	for range 4 {
		s := <-done
		if s.readErr != nil || s.code != http.StatusOK || len(s.lines) < 2 {
			t.Errorf("%s: status %d, %d lines, ended with %v", s.name, s.code, len(s.lines), s.readErr)
			continue
		}
		last := s.lines[len(s.lines)-1]
		if strings.HasPrefix(s.name, "/v1/") {
			if last != "data: [DONE]" || lineJSON(s.lines[len(s.lines)-2])["error"] != nil {
				t.Errorf("%s ended with %q, %q: want the last chunk and [DONE]", s.name, s.lines[len(s.lines)-2], last)
			}
			continue
		}
		if v := lineJSON(last); v["done"] != true || v["error"] != nil {
			t.Errorf("%s ended with %q, want done:true", s.name, last)
		}
	}
}
