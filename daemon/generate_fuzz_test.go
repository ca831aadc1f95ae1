package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/models/llm"
	modelrepo "github.com/brokerd/brokerd/runtime/models/repo"
)

// Whole generation requests fuzzed through a real brokerd: the HTTP APIs'
// JSON bodies and the gRPC API's messages reach every layer (the edges'
// conversion, sampling, the chat template, tokenization, constraints,
// tools, thinking, the scheduler and the engine). The daemon serves two
// models: qwen-tools, Qwen3's real tokenizer and chat template with
// weights that think nothing and call get_weather (writeToolModel), and
// tiny-llm, the byte tokenizer's random model. A small context bounds
// each input's work.

const (
	fuzzQwen = "qwen-tools"
	fuzzTiny = "tiny-llm"
	// fuzzBound is how long one input may take to be answered in full:
	// far above what the largest one costs (two sequences to the end of
	// fuzzContext at Qwen's vocabulary: 3 s, some 20 s under -race on a
	// loaded machine), so only a hang trips it.
	fuzzBound = 3 * time.Minute
	// fuzzContext bounds every sequence (the tools' prompt of Qwen3's
	// template is some 160 tokens).
	fuzzContext = 384
)

// genFuzz is the daemon one fuzz target drives.
type genFuzz struct {
	d      *daemon
	base   string
	client *http.Client
	logs   *observer.ObservedLogs
	// want are the companions' tokens, as they come alone.
	want [][]int32
}

// companions are greedy calls, one per model, that run beside each
// input: whatever the input does to the steps it shares with them, their
// tokens are the ones they have alone (tiny-llm's depend on its KV cache
// too).
var companions = []*brokerv1.GenerateRequest{
	{Model: fuzzQwen, Prompts: []string{"Weather in Paris?"}, Sampling: &brokerv1.SamplingParams{MaxTokens: 12, Temperature: new(float32), IgnoreEos: true}},
	{Model: fuzzTiny, Prompts: []string{"The quick brown fox"}, Sampling: &brokerv1.SamplingParams{MaxTokens: 24, Temperature: new(float32), IgnoreEos: true}},
}

// companionTokens runs companion i and returns its tokens.
func (g *genFuzz) companionTokens(ctx context.Context, i int) ([]int32, error) {
	st, err := brokerv1.NewBrokerServiceClient(g.d.conn).Generate(ctx, companions[i])
	if err != nil {
		return nil, err
	}
	var ids []int32
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return ids, nil
		}
		if err != nil {
			return nil, err
		}
		for _, d := range m.GetDeltas() {
			ids = append(ids, d.GetTokenIds()...)
		}
	}
}

// startCompanions runs the companions beside an input; the function it
// returns waits for them and fails t unless each got its own tokens.
func (g *genFuzz) startCompanions(t *testing.T) func() {
	ctx, cancel := context.WithTimeout(context.Background(), fuzzBound)
	errs := make(chan error, len(companions))
	for i := range companions {
		go func() {
			ids, err := g.companionTokens(ctx, i)
			if err == nil && !slices.Equal(ids, g.want[i]) {
				err = fmt.Errorf("companion %s got tokens %v beside the input, %v alone", companions[i].GetModel(), ids, g.want[i])
			}
			errs <- err
		}()
	}
	return func() {
		t.Helper()
		defer cancel()
		for range companions {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	}
}

// startGenFuzz starts a fuzz target's daemon, once before f.Fuzz, and
// records what its companions generate alone.
func startGenFuzz(tb testing.TB) *genFuzz {
	tb.Helper()
	cfg := httpTestConfig(tb)
	cfg.LoadModels = fuzzQwen + "," + fuzzTiny
	cfg.MaxContext = fuzzContext
	cfg.MaxItemsPerRequest = 2
	// BROKERD_FUZZ_SPECULATIVE_TOKENS=N fuzzes with speculative decoding
	// on (its guesses change the steps' shapes and, by rounding, could
	// move a companion's near tie, so make test's seeds run without).
	if n, err := strconv.Atoi(os.Getenv("BROKERD_FUZZ_SPECULATIVE_TOKENS")); err == nil {
		cfg.SpeculativeTokens = n
	}
	writeToolModel(tb, cfg.ModelRepo, fuzzQwen)
	writeTinyLlama(tb, cfg.ModelRepo, fuzzTiny)
	// Every warning or error brokerd logs is an internal error, a
	// replica's failure or worse: none may come of what a client sends.
	core, logs := observer.New(zap.WarnLevel)
	d := startDaemonLog(tb, Options{Config: cfg, Tokenizers: func(ctx context.Context, dir string, read func(string, int64) ([]byte, error)) (llm.Tokenizer, llm.ChatTemplate, error) {
		if strings.Contains(dir, "/"+fuzzTiny+"/") {
			return byteTokenizer{}, byteTokenizer{}, nil
		}
		return modelrepo.BPETokenizers(ctx, dir, read)
	}}, zap.New(core))
	logs.TakeAll() // the start's own (--http-allow-unauthenticated's)
	g := &genFuzz{d: d, base: "http://" + d.addrs.HTTP, client: &http.Client{Timeout: fuzzBound}, logs: logs}
	ctx, cancel := context.WithTimeout(context.Background(), fuzzBound)
	defer cancel()
	for i := range companions {
		ids, err := g.companionTokens(ctx, i)
		if err != nil {
			tb.Fatal(err)
		}
		g.want = append(g.want, ids)
	}
	return g
}

// checkLogs fails t for each warning or error brokerd logged since the
// last check.
func (g *genFuzz) checkLogs(t *testing.T) {
	t.Helper()
	for _, e := range g.logs.TakeAll() {
		t.Errorf("brokerd logged %s: %s %v", e.Level, e.Message, e.ContextMap())
	}
}

// checkServing fails t unless both models still generate: a request that
// broke the engine, the scheduler or a model's gate shows here.
func (g *genFuzz) checkServing(t *testing.T) {
	t.Helper()
	for _, m := range []string{fuzzQwen, fuzzTiny} {
		code, body, err := g.post("/v1/completions", `{"model":"`+m+`","prompt":"hi","max_tokens":1,"temperature":0}`)
		if err != nil || code != http.StatusOK {
			t.Fatalf("brokerd stopped serving %s: %d %v %s", m, code, err, body)
		}
	}
}

// idleGauges are the metrics that are zero when no call is being served:
// a sequence, its KV blocks or its bytes left behind by a call that
// ended is work nobody reads (or a leak that starves the next caller).
var idleGauges = []string{
	"brokerd_generation_running_sequences{",
	"brokerd_generation_waiting_sequences{",
	`brokerd_generation_kv_cache_blocks{device="cpu:0",model="` + fuzzQwen + `@1",state="used"}`,
	`brokerd_generation_kv_cache_blocks{device="cpu:0",model="` + fuzzTiny + `@1",state="used"}`,
	"brokerd_inflight_request_bytes ",
}

// checkIdle fails t unless brokerd goes back to idle once a call has
// ended: a sequence ends (and frees its blocks) on the scheduler's
// goroutine a moment after its last event, so it polls, within a bound
// far above that moment.
func (g *genFuzz) checkIdle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(fuzzBound)
	for {
		busy, err := g.busyGauges()
		if err != nil {
			t.Fatalf("metrics: %v", err)
		}
		if len(busy) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("brokerd still busy %v after the call ended: %s", fuzzBound, strings.Join(busy, "; "))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// busyGauges are the lines of idleGauges whose value is not 0.
func (g *genFuzz) busyGauges() ([]string, error) {
	resp, err := g.client.Get("http://" + g.d.addrs.Metrics + "/metrics")
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	var busy []string
	seen := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		for _, gauge := range idleGauges {
			if strings.HasPrefix(line, gauge) {
				seen[gauge] = true
				if !strings.HasSuffix(line, " 0") {
					busy = append(busy, line)
				}
			}
		}
	}
	for _, gauge := range idleGauges {
		if !seen[gauge] {
			return nil, fmt.Errorf("no %s in the metrics", gauge)
		}
	}
	return busy, nil
}

func (g *genFuzz) post(path, body string) (int, []byte, error) {
	resp, err := g.client.Post(g.base+path, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// fuzzRoutes are the generation routes FuzzHTTPGeneration's selector picks.
var fuzzRoutes = []string{"/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate", "/v1/responses"}

// fuzzRoute is the route a selector without the overlay bit picks: bits
// 0-1 and 3 (routeSel's inverse).
func fuzzRoute(sel uint8) string { return fuzzRoutes[int(sel&3|sel>>1&4)%len(fuzzRoutes)] }

// routeSel is the selector of route i.
func routeSel(i int) uint8 { return uint8(i&3 | i&4<<1) }

// httpSeeds are realistic bodies, each for a route, among them every
// field the four routes read.
var httpSeeds = []struct {
	route int
	body  string
}{
	{0, `{"model":"qwen-tools","messages":[{"role":"user","content":"Weather in Paris?"}],"max_tokens":24,"temperature":0}`},
	{0, `{"model":"qwen-tools","stream":true,"stream_options":{"include_usage":true},"temperature":0,"max_tokens":32,
		"tools":[{"type":"function","function":{"name":"get_weather","description":"Get the weather in a city.","parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Paris","Rome"]}},"required":["city"]}}}],
		"tool_choice":"auto","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Weather in Paris?"}]}`},
	{0, `{"model":"qwen-tools","max_completion_tokens":24,"temperature":0,"tool_choice":"required","parallel_tool_calls":false,
		"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Paris","Rome"]}},"required":["city"]}}},{"type":"function","function":{"name":"now","strict":true}}],
		"messages":[{"role":"user","content":"Weather?"}]}`},
	{0, `{"model":"qwen-tools","stream":true,"max_tokens":16,"temperature":0,"tool_choice":{"type":"function","function":{"name":"get_weather"}},
		"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],
		"messages":[{"role":"user","content":"Weather in Rome?"}]}`},
	{0, `{"model":"qwen-tools","max_tokens":24,"tool_choice":"none","tools":[{"type":"function","function":{"name":"get_weather"}}],
		"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":"Let me check.","reasoning_content":"the user wants weather",
		"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
		{"role":"tool","tool_call_id":"call_1","content":"{\"temp\": 21}"}]}`},
	{0, `{"model":"qwen-tools","max_tokens":12,"seed":7,"temperature":0.8,"top_p":0.9,"top_k":20,"min_p":0.05,"repetition_penalty":1.1,
		"presence_penalty":0.5,"frequency_penalty":0.5,"logprobs":true,"top_logprobs":3,"logit_bias":{"13":5,"198":-100},"stop":["check","\n\n"],
		"chat_template_kwargs":{"enable_thinking":false},"messages":[{"role":"user","content":[{"type":"text","text":"Name a color 🎨"}]}]}`},
	{0, `{"model":"qwen-tools","max_tokens":16,"temperature":0,"response_format":{"type":"json_schema","json_schema":{"name":"w","strict":true,
		"schema":{"type":"object","properties":{"city":{"type":"string","maxLength":5}},"required":["city"],"additionalProperties":false}}},
		"messages":[{"role":"user","content":"JSON please"}]}`},
	{0, `{"model":"qwen-tools","stream":true,"max_tokens":8,"n":1,"response_format":{"type":"json_object"},"messages":[{"role":"user","content":"{"}]}`},
	{0, `{"model":"tiny-llm","stream":true,"max_tokens":8,"stop":"AB","guided_choice":["yes","no"],"messages":[{"role":"user","content":"x"}]}`},
	{0, `{"model":"tiny-llm","max_tokens":6,"guided_regex":"[a-c]{2,4}","logprobs":true,"top_logprobs":2,"messages":[{"role":"user","content":"x"}]}`},
	{0, `{"model":"qwen-tools","max_tokens":10,"min_tokens":3,"include_stop_str_in_output":true,"stop":["a"],"stop_token_ids":[13],"ignore_eos":false,
		"continue_final_message":true,"add_generation_prompt":false,"messages":[{"role":"user","content":"JSON"},{"role":"assistant","content":"{"}]}`},
	{0, `{"model":"qwen-tools","max_tokens":24,"tool_choice":"required","parallel_tool_calls":false,"chat_template_kwargs":{"enable_thinking":true},
		"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}}],"messages":[{"role":"user","content":"call f"}]}`},
	{1, `{"model":"tiny-llm","prompt":["hello","bye"],"echo":true,"stream":true,"min_tokens":2,"n":2,"seed":4}`},
	{0, `{"model":"qwen-tools","n":3,"stream":true,"max_tokens":6,"temperature":1,"messages":[{"role":"user","content":"Verdict?"}]}`},
	{1, `{"model":"tiny-llm","prompt":"hello","max_tokens":8,"logprobs":2,"stream":true,"stream_options":{"include_usage":true},"seed":3,"temperature":1.5}`},
	{1, `{"model":"qwen-tools","prompt":["Name a fruit","Name a color"],"max_tokens":6,"echo":false,"stop":["\n"],"n":1,"best_of":1,
		"guided_grammar":"root ::= \"a\" | \"b\"","logit_bias":{"64":2}}`},
	{1, `{"model":"qwen-tools","prompt":"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n","max_tokens":10,"guided_json":{"type":"array","items":{"type":"integer"},"maxItems":2}}`},
	{2, `{"model":"qwen-tools","stream":false,"think":false,"options":{"num_predict":24,"temperature":0,"seed":3,"top_k":5,"top_p":0.9,"min_p":0.1,
		"repeat_penalty":1.1,"presence_penalty":0.2,"frequency_penalty":0.2,"stop":["Paris"]},
		"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
		"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":"","thinking":"hmm",
		"tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"Paris"}}}]},{"role":"tool","tool_name":"get_weather","content":"21"}]}`},
	{2, `{"model":"qwen-tools","think":true,"logprobs":true,"top_logprobs":2,"format":"json","options":{"num_predict":12},"keep_alive":"5m",
		"messages":[{"role":"user","content":"hi"}]}`},
	{2, `{"model":"qwen-tools:latest","think":"high","format":{"type":"object","properties":{"n":{"type":"integer"}}},"options":{"num_predict":12},
		"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`},
	{2, `{"model":"qwen-tools","stream":true,"options":{"num_predict":8},"messages":[{"role":"user","content":"Verdict?"},{"role":"assistant","content":"{\"ok\":"}]}`},
	{3, `{"model":"qwen-tools","prompt":"Weather in Paris?","system":"You are terse.","stream":false,"options":{"num_predict":24,"temperature":0}}`},
	{3, `{"model":"tiny-llm","prompt":"abc","raw":true,"stream":true,"logprobs":true,"top_logprobs":3,"options":{"num_predict":8,"seed":1,"stop":["z"]}}`},
	{3, `{"model":"qwen-tools","prompt":"count","think":false,"format":{"type":"array","items":{"type":"integer","minimum":0}},"options":{"num_predict":10}}`},
	{4, `{"model":"qwen-tools","input":"Weather in Paris?","instructions":"You are terse.","max_output_tokens":24,"temperature":0}`},
	{4, `{"model":"qwen-tools","stream":true,"temperature":0,"max_output_tokens":32,"tool_choice":"auto","max_tool_calls":2,
		"tools":[{"type":"function","name":"get_weather","description":"Get the weather in a city.","parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Paris","Rome"]}},"required":["city"]}}],
		"input":[{"role":"user","content":"Weather in Paris?"}],"store":false,"metadata":{"k":"v"}}`},
	{4, `{"model":"qwen-tools","max_output_tokens":16,"reasoning":{"effort":"none"},"include":["message.output_text.logprobs"],"top_logprobs":2,
		"text":{"format":{"type":"json_schema","name":"w","strict":true,"schema":{"type":"object","properties":{"city":{"type":"string","maxLength":5}},"required":["city"]}}},
		"input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"JSON only"}]},{"role":"user","content":"Weather?"},
		{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"look it up"}]},
		{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
		{"type":"function_call_output","call_id":"call_1","output":"{\"temp\": 21}"}],"truncation":"auto"}`},
	{4, `{"model":"qwen-tools","stream":true,"max_output_tokens":12,"reasoning":{"effort":"high"},"text":{"format":{"type":"json_object"}},
		"parallel_tool_calls":false,"tool_choice":{"type":"allowed_tools","mode":"required","tools":[{"type":"function","name":"f"}]},
		"tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}},{"type":"function","name":"g"}],
		"input":"call f","previous_response_id":"resp_0"}`},
}

// httpOverlays are small bodies that FuzzHTTPGeneration's merge mode
// lays over a seed: a field or two, which mutations keep valid JSON more
// often than a whole body.
var httpOverlays = []string{
	`{"stream":true,"stream_options":{"include_usage":true}}`,
	`{"stream":false,"logprobs":true,"top_logprobs":3}`,
	`{"stop":["e","\n"],"max_tokens":3}`,
	`{"think":true,"options":{"num_predict":20,"stop":["a"]}}`,
	`{"chat_template_kwargs":{"enable_thinking":true},"seed":5,"temperature":1}`,
	`{"tool_choice":"required","parallel_tool_calls":false}`,
	`{"response_format":{"type":"json_object"},"logit_bias":{"90":3}}`,
	`{"format":"json","raw":true}`,
	`{"stream":true,"include":["message.output_text.logprobs"],"top_logprobs":2,"reasoning":{"effort":"low"}}`,
}

// FuzzHTTPGeneration: whatever the body of a generation request on the
// OpenAI and Ollama APIs, brokerd answers it within fuzzBound without a
// 500 (INTERNAL is for bugs) or an error logged, a stream it answers is
// well formed (SSE events of JSON ending with [DONE]; NDJSON lines ending
// with done or an error), it goes back to idle once the call ended, and it
// keeps serving both models.
//
// The selector's bits 0-1 and 3 pick the route; with bit 2 set, the body (a
// JSON object) is laid over the seed that bits 3-7 pick, field by field,
// and sent to that seed's route. A cut other than 0 is a client that
// reads that many bytes of the answer and goes away: its work must stop
// (brokerd idle again, checkIdle).
func FuzzHTTPGeneration(f *testing.F) {
	for i, s := range httpSeeds {
		cut := uint16(0)
		if i%4 == 1 {
			cut = uint16(1 + i*37) // the client goes away part way
		}
		f.Add(routeSel(s.route), cut, s.body)
	}
	for i, o := range httpOverlays {
		f.Add(uint8(4|(i*5%len(httpSeeds))<<3), uint16(0), o)
	}
	g := startGenFuzz(f)
	f.Fuzz(func(t *testing.T, sel uint8, cut uint16, body string) {
		path := fuzzRoute(sel)
		if sel&4 != 0 {
			seed := httpSeeds[int(sel>>3)%len(httpSeeds)]
			path = fuzzRoutes[seed.route]
			body = overlay(seed.body, body)
		}
		// A client of its own, so that one that goes away takes its
		// connection with it.
		client := &http.Client{Timeout: fuzzBound, Transport: &http.Transport{DisableKeepAlives: true}}
		companions := g.startCompanions(t)
		resp, err := client.Post(g.base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if cut > 0 {
			// The client reads cut bytes at most and goes away.
			_, err = io.ReadFull(resp.Body, make([]byte, cut))
			resp.Body.Close()
			if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
				t.Fatalf("%s: reading the answer: %v", path, err)
			}
		} else {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("%s: reading the answer: %v", path, err)
			}
			checkHTTPAnswer(t, path, resp, b)
		}
		companions()
		g.checkIdle(t)
		g.checkServing(t)
		g.checkLogs(t)
	})
}

// overlay is base (a JSON object) with the fields of over set over its
// own; over itself when it is not a JSON object.
func overlay(base, over string) string {
	var b, o map[string]json.RawMessage
	if json.Unmarshal([]byte(over), &o) != nil || json.Unmarshal([]byte(base), &b) != nil {
		return over
	}
	for k, v := range o {
		b[k] = v
	}
	out, err := json.Marshal(b)
	if err != nil {
		return over
	}
	return string(out)
}

// checkHTTPAnswer checks one answer of a generation route.
func checkHTTPAnswer(t *testing.T, path string, resp *http.Response, b []byte) {
	t.Helper()
	// 500 is a bug; 502 and 503 (a failed step, no device) cannot come of
	// one client's request to a healthy daemon either. 501 is a feature
	// brokerd does not implement.
	if resp.StatusCode >= 500 && resp.StatusCode != http.StatusNotImplemented {
		t.Fatalf("%s: %d: %s", path, resp.StatusCode, b)
	}
	ct := resp.Header.Get("Content-Type")
	switch {
	case strings.HasPrefix(ct, "text/event-stream"):
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: a stream with status %d", path, resp.StatusCode)
		}
		check := checkSSE
		if path == "/v1/responses" {
			check = checkResponseEvents
		}
		if err := check(b); err != nil {
			t.Fatalf("%s: %v:\n%s", path, err, b)
		}
	case strings.HasPrefix(ct, "application/x-ndjson"):
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: a stream with status %d", path, resp.StatusCode)
		}
		if err := checkNDJSON(b); err != nil {
			t.Fatalf("%s: %v:\n%s", path, err, b)
		}
	default:
		if !json.Valid(b) {
			t.Fatalf("%s: %d, not JSON (Content-Type %q): %q", path, resp.StatusCode, ct, b)
		}
	}
}

// checkSSE checks an OpenAI stream: events "data: <JSON>", the last
// "data: [DONE]", and no error event (a request of a lone client to a
// healthy daemon fails before its stream starts, if at all).
func checkSSE(b []byte) error {
	s := string(b)
	if !strings.HasSuffix(s, "data: [DONE]\n\n") {
		return errors.New("the stream does not end with data: [DONE]")
	}
	events := strings.Split(strings.TrimSuffix(s, "\n\n"), "\n\n")
	for i, e := range events {
		data, ok := strings.CutPrefix(e, "data: ")
		if !ok || strings.Contains(data, "\n") {
			return fmt.Errorf("event %d is not one data line: %q", i, e)
		}
		if i == len(events)-1 {
			break // [DONE]
		}
		if data == "[DONE]" {
			return fmt.Errorf("[DONE] at event %d of %d", i, len(events))
		}
		if !json.Valid([]byte(data)) {
			return fmt.Errorf("event %d is not JSON: %q", i, data)
		}
		var ev struct {
			Error *struct {
				Type, Message string
			}
		}
		_ = json.Unmarshal([]byte(data), &ev)
		if ev.Error != nil {
			// Errors mid-stream come of the engine or the scheduler,
			// never of a lone client's request: none is expected here.
			return fmt.Errorf("an error event: %s: %s", ev.Error.Type, ev.Error.Message)
		}
	}
	return nil
}

// checkNDJSON checks an Ollama stream: lines of JSON objects, the last
// done, none an error (as checkSSE).
func checkNDJSON(b []byte) error {
	s := string(b)
	if !strings.HasSuffix(s, "\n") {
		return errors.New("the stream does not end with a newline")
	}
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	for i, l := range lines {
		var obj struct {
			Done  bool    `json:"done"`
			Error *string `json:"error"`
		}
		if err := json.Unmarshal([]byte(l), &obj); err != nil {
			return fmt.Errorf("line %d is not a JSON object: %v", i, err)
		}
		if obj.Error != nil {
			return fmt.Errorf("an error line: %s", *obj.Error)
		}
		if obj.Done != (i == len(lines)-1) {
			return fmt.Errorf("line %d of %d has done %v", i, len(lines), obj.Done)
		}
	}
	return nil
}

// grpcSeeds are realistic gRPC requests, ChatRequest or GenerateRequest.
func grpcSeeds() []proto.Message {
	tools := []*brokerv1.Tool{{Name: "get_weather", Description: "Get the weather in a city.", Parameters: toolSchema}}
	user := &brokerv1.ChatMessage{Role: "user", Content: toolUserQuery}
	conv := func(m ...*brokerv1.ChatMessage) []*brokerv1.Conversation {
		return []*brokerv1.Conversation{{Messages: m}}
	}
	kw, _ := structpb.NewStruct(map[string]any{"enable_thinking": false, "x": []any{1, "a"}})
	zero := new(float32)
	return []proto.Message{
		&brokerv1.ChatRequest{Model: fuzzQwen, Conversations: conv(user), Tools: tools, Sampling: &brokerv1.SamplingParams{Temperature: zero, MaxTokens: 32}},
		&brokerv1.ChatRequest{Model: fuzzQwen, Conversations: conv(user), Tools: tools, ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED,
			Sampling: &brokerv1.SamplingParams{Temperature: zero, MaxTokens: 24, Logprobs: true, TopLogprobs: 2}},
		&brokerv1.ChatRequest{Model: fuzzQwen, Conversations: conv(user), Tools: tools, ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION,
			ToolChoiceFunction: "get_weather", Sampling: &brokerv1.SamplingParams{MaxTokens: 16, Seed: proto.Uint64(9)}},
		&brokerv1.ChatRequest{Model: fuzzQwen, EnableThinking: proto.Bool(true), ChatTemplateKwargs: kw, Tools: tools, ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE,
			Conversations: conv(user, &brokerv1.ChatMessage{Role: "assistant", Content: toolContent, Reasoning: "hmm",
				ToolCalls: []*brokerv1.ToolCall{{Id: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
				&brokerv1.ChatMessage{Role: "tool", Content: toolResult, ToolCallId: "call_1"}),
			Sampling: &brokerv1.SamplingParams{MaxTokens: 16, Stop: []string{"check"}, StopTokenIds: []int32{13}, LogitBias: map[int32]float32{198: -5}}},
		&brokerv1.ChatRequest{Model: fuzzQwen, Conversations: conv(&brokerv1.ChatMessage{Role: "system", Content: "JSON"}, user),
			MaxTime: durationpb.New(10 * time.Second), Priority: brokerv1.Priority(1),
			Sampling: &brokerv1.SamplingParams{MaxTokens: 12, Constraint: &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_JSON_SCHEMA,
				Source: `{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}`}}},
		&brokerv1.GenerateRequest{Model: fuzzTiny, Prompts: []string{"abc", "xyz"}, Sampling: &brokerv1.SamplingParams{MaxTokens: 8,
			Temperature: proto.Float32(0.7), TopP: proto.Float32(0.9), TopK: proto.Int32(10), MinP: proto.Float32(0.05), RepetitionPenalty: proto.Float32(1.2),
			PresencePenalty: proto.Float32(0.1), FrequencyPenalty: proto.Float32(0.1), Seed: proto.Uint64(1), IgnoreEos: true,
			Constraint: &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_REGEX, Source: "[a-z]+"}}},
		&brokerv1.GenerateRequest{Model: fuzzQwen, Prompts: []string{"Name a color 🎨"}, AddSpecialTokens: proto.Bool(false),
			Sampling: &brokerv1.SamplingParams{MaxTokens: 8, Logprobs: true, TopLogprobs: 5, Constraint: &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_GBNF, Source: `root ::= [0-9]+`}}},
		&brokerv1.GenerateRequest{Model: fuzzTiny, Prompts: []string{"x"}, MaxTime: durationpb.New(time.Millisecond),
			Sampling: &brokerv1.SamplingParams{Constraint: &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_JSON}, MaxTokens: 10}},
	}
}

// grpcOverlays are small requests that FuzzGRPCGeneration's merge mode
// merges into a seed.
func grpcOverlays() []proto.Message {
	return []proto.Message{
		&brokerv1.ChatRequest{Sampling: &brokerv1.SamplingParams{Logprobs: true, TopLogprobs: 3, Stop: []string{"e"}}},
		&brokerv1.ChatRequest{EnableThinking: proto.Bool(true), Sampling: &brokerv1.SamplingParams{MaxTokens: 20}},
		&brokerv1.ChatRequest{ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED},
		&brokerv1.GenerateRequest{Sampling: &brokerv1.SamplingParams{Stop: []string{"a", "\n"}, StopTokenIds: []int32{90}}},
		&brokerv1.GenerateRequest{Sampling: &brokerv1.SamplingParams{Constraint: &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_JSON}}},
	}
}

// FuzzGRPCGeneration: whatever ChatRequest or GenerateRequest a client
// sends, brokerd answers it within fuzzBound with a status other than
// INTERNAL or UNKNOWN, logs no error, goes back to idle once the call
// ended (leave other than 0: the client went away after that many
// responses) and keeps serving both models.
//
// The fuzz bytes are unmarshalled into a ChatRequest (selector bit 0
// clear) or a GenerateRequest (set); bit 1 sets the model to one served,
// bit 2 which; with bit 3 set they are merged into the seed of that type
// that bits 4-7 pick (a field or two over a whole request).
func FuzzGRPCGeneration(f *testing.F) {
	var chats, gens []proto.Message
	for _, m := range grpcSeeds() {
		if _, ok := m.(*brokerv1.GenerateRequest); ok {
			gens = append(gens, m)
		} else {
			chats = append(chats, m)
		}
	}
	add := func(sel, leave uint8, m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		if _, ok := m.(*brokerv1.GenerateRequest); ok {
			sel |= 1
		}
		f.Add(sel, leave, b)
	}
	for i, m := range grpcSeeds() {
		add(0, uint8(i%3), m)
	}
	for i, m := range grpcOverlays() {
		add(uint8(8|i<<4), 0, m)
	}
	g := startGenFuzz(f)
	c := brokerv1.NewBrokerServiceClient(g.d.conn)
	f.Fuzz(func(t *testing.T, sel, leave uint8, msg []byte) {
		var req proto.Message = &brokerv1.ChatRequest{}
		bases := chats
		if sel&1 != 0 {
			req, bases = &brokerv1.GenerateRequest{}, gens
		}
		if sel&8 != 0 {
			proto.Merge(req, bases[int(sel>>4)%len(bases)])
		}
		if (proto.UnmarshalOptions{Merge: true}).Unmarshal(msg, req) != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), fuzzBound)
		defer cancel()
		companions := g.startCompanions(t)
		// leave other than 0: the client goes away after that many
		// responses.
		call, callCancel := context.WithCancel(ctx)
		defer callCancel()
		var err error
		switch req := req.(type) {
		case *brokerv1.ChatRequest:
			if sel&2 != 0 {
				req.Model = []string{fuzzQwen, fuzzTiny}[sel>>2&1]
			}
			st, cerr := c.Chat(call, req)
			err = drainGRPC(st, cerr, int(leave), callCancel)
		case *brokerv1.GenerateRequest:
			if sel&2 != 0 {
				req.Model = []string{fuzzQwen, fuzzTiny}[sel>>2&1]
			}
			st, cerr := c.Generate(call, req)
			err = drainGRPC(st, cerr, int(leave), callCancel)
		}
		if ctx.Err() != nil {
			t.Fatalf("no answer within %v: %v", fuzzBound, err)
		}
		if leave > 0 && status.Code(err) == codes.Canceled {
			err = nil // the client's own going away
		}
		companions()
		g.checkIdle(t)
		// INTERNAL and UNKNOWN are bugs; UNAVAILABLE and DATA_LOSS (a
		// failed step, no device) cannot come of one client's request to
		// a healthy daemon either.
		switch status.Code(err) {
		case codes.Internal, codes.Unknown, codes.Unavailable, codes.DataLoss:
			t.Fatalf("%v", err)
		}
		g.checkServing(t)
		g.checkLogs(t)
	})
}

// drainGRPC reads a call's stream st (err: the call's start) to its end:
// nil, or the call's error. With after other than 0 it cancels the call
// (leave) after that many responses.
func drainGRPC[M any](st interface{ Recv() (M, error) }, err error, after int, leave func()) error {
	if err != nil {
		return err
	}
	for n := 1; ; n++ {
		if _, err := st.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if n == after {
			leave()
		}
	}
}

// checkResponseEvents checks a Responses API stream: events of an event
// line and a data line of JSON whose type is the event's and whose
// sequence numbers count from 0, the last response.completed or
// response.incomplete, and no error event.
func checkResponseEvents(b []byte) error {
	events := strings.Split(strings.TrimSuffix(string(b), "\n\n"), "\n\n")
	var last string
	for i, e := range events {
		name, data, ok := strings.Cut(e, "\n")
		name, ok1 := strings.CutPrefix(name, "event: ")
		data, ok2 := strings.CutPrefix(data, "data: ")
		if !ok || !ok1 || !ok2 || strings.Contains(data, "\n") {
			return fmt.Errorf("event %d is not an event line and a data line: %q", i, e)
		}
		var ev struct {
			Type     string `json:"type"`
			Sequence *int   `json:"sequence_number"`
			Message  string `json:"message"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return fmt.Errorf("event %d is not JSON: %q", i, data)
		}
		if ev.Type != name || ev.Sequence == nil || *ev.Sequence != i {
			return fmt.Errorf("event %d: %s with type %q, sequence %v", i, name, ev.Type, ev.Sequence)
		}
		if name == "error" {
			return fmt.Errorf("an error event: %s", ev.Message)
		}
		last = name
	}
	if last != "response.completed" && last != "response.incomplete" {
		return fmt.Errorf("the stream ends with %s", last)
	}
	return nil
}
