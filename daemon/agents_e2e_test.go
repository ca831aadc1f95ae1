package daemon

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/tokenizer/bpe"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// qwenTokenizer is Qwen3's real tokenizer (the test copy qwenDir writes).
func qwenTokenizer(t testing.TB) *bpe.Tokenizer {
	t.Helper()
	qwenParsed.Do(func() {
		tj, cfg := qwenTokenizerFiles(t)
		qwenParsed.tok, qwenParsed.err = bpe.Parse(tj, cfg, nil)
	})
	if qwenParsed.tok == nil {
		t.Fatalf("Qwen3's tokenizer: %v", qwenParsed.err)
	}
	return qwenParsed.tok
}

// qwenParsed is Qwen3's tokenizer parsed once per test binary (seconds
// under -race; tokenizers are safe for concurrent use).
var qwenParsed struct {
	sync.Once
	tok *bpe.Tokenizer
	err error
}

// TestLogprobsText: over gRPC every logprob entry, the chosen token and
// each of top_logprobs alternatives, carries the token's bytes as Qwen3's
// tokenizer has them and its text (the bytes when UTF-8, else vLLM's
// "bytes:\xNN" form), on a random-weight model served by a real brokerd.
func TestLogprobsText(t *testing.T) {
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.LoadModels = "qwen-tiny"
	v, eos := qwenDir(t, cfg.ModelRepo, "qwen-tiny")
	writeTinyLlamaVocab(t, cfg.ModelRepo, "qwen-tiny", v, eos)
	tok := qwenTokenizer(t)
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	const n, top = 24, 5
	st, err := c.Generate(testCtx(t), &brokerv1.GenerateRequest{Model: "qwen-tiny", Prompts: []string{"Name a color 🎨 and a fruit"},
		Sampling: &brokerv1.SamplingParams{MaxTokens: n, IgnoreEos: true, Temperature: new(float32), Logprobs: true, TopLogprobs: top}})
	if err != nil {
		t.Fatal(err)
	}
	entries := 0
	var ids []int32
	check := func(what string, lp *brokerv1.TokenLogprob) {
		want := tok.TokenBytes(lp.GetTokenId())
		if string(lp.GetBytes()) != string(want) || len(want) == 0 {
			t.Errorf("%s: token %d bytes %q, want %q", what, lp.GetTokenId(), lp.GetBytes(), want)
		}
		switch {
		case utf8.Valid(want) && lp.GetText() != string(want):
			t.Errorf("%s: token %d text %q, want %q", what, lp.GetTokenId(), lp.GetText(), want)
		case !utf8.Valid(want) && !strings.HasPrefix(lp.GetText(), `bytes:\x`):
			t.Errorf("%s: token %d of partial UTF-8 %q has text %q", what, lp.GetTokenId(), want, lp.GetText())
		}
	}
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, dl := range m.GetDeltas() {
			ids = append(ids, dl.GetTokenIds()...)
			for i, e := range dl.GetLogprobs() {
				entries++
				check("chosen", e.GetChosen())
				if e.GetChosen().GetTokenId() != dl.GetTokenIds()[i] {
					t.Errorf("chosen token %d, delta's %d", e.GetChosen().GetTokenId(), dl.GetTokenIds()[i])
				}
				if len(e.GetTop()) != top {
					t.Errorf("%d alternatives, want %d", len(e.GetTop()), top)
				}
				for _, a := range e.GetTop() {
					check("alternative", a)
				}
				// Greedy: the chosen token is the most likely one.
				if e.GetTop()[0].GetTokenId() != e.GetChosen().GetTokenId() {
					t.Errorf("greedy chose %d, the likeliest is %d", e.GetChosen().GetTokenId(), e.GetTop()[0].GetTokenId())
				}
			}
		}
	}
	if entries != n || len(ids) != n {
		t.Errorf("%d logprob entries and %d ids for %d tokens", entries, len(ids), n)
	}
}

// Thinking end to end: a model with Qwen3's real tokenizer and chat
// template whose weights are made to say one thing. Every layer is zero,
// so the last position's hidden state is its token's embedding, and the
// embeddings and lm_head make each token of a script predict the next
// (greedy): after the generation prompt's "\n" it thinks, then answers;
// after the empty think block Qwen3's template writes when thinking is
// off ("</think>\n\n"), it answers at once.
const (
	scriptReasoning = "hmm red or blue"
	scriptContent   = "Blue."
)

// writeScriptedQwen writes the model and returns the ids of its script.
func writeScriptedQwen(t *testing.T, repo, name string) {
	t.Helper()
	v, eos := qwenDir(t, repo, name)
	tok := qwenTokenizer(t)
	one := func(s string) int32 {
		ids := tok.Encode(s, false)
		if len(ids) != 1 {
			t.Fatalf("%q is %d tokens", s, len(ids))
		}
		return ids[0]
	}
	// What the model writes, token by token, after the prompt's "\n".
	script := []int32{one("\n"), one("<think>")}
	script = append(script, tok.Encode(scriptReasoning, false)...)
	script = append(script, one("</think>"), one("\n\n"))
	script = append(script, tok.Encode(scriptContent, false)...)
	script = append(script, int32(eos))
	writeScript(t, tok, repo, name, v, eos, script, nil)
}

// writeScript writes a model of Qwen3's vocabulary whose greedy output
// after script[0] (the prompt's last token) is the rest of script: every
// layer is zero, so the last position's hidden state is its token's
// embedding, and the embeddings and lm_head make each token predict the
// next. A token may come once only (else its successor is ambiguous).
// more, when not nil, sets more of the embeddings and lm_head (rows of h
// values) once the script's are in.
func writeScript(t testing.TB, tok *bpe.Tokenizer, repo, name string, v, eos int, script []int32, more func(embed, head []float32, h int)) {
	t.Helper()
	const h = 32
	if len(script) > h {
		t.Fatalf("a script of %d tokens needs a hidden size of as many", len(script))
	}
	for i, id := range script[:len(script)-1] {
		if slices.Contains(script[:i], id) {
			t.Fatalf("token %d (%q) comes twice in the script: the next token would be ambiguous", id, tok.Decode([]int32{id}, false))
		}
	}
	embed := make([]float32, v*h)
	head := make([]float32, v*h)
	for i, id := range script[:len(script)-1] {
		embed[int(id)*h+i] = 1          // token i of the script is the unit vector i
		head[int(script[i+1])*h+i] = 10 // which the next token's row reads
	}
	if more != nil {
		more(embed, head, h)
	}
	zeros := func(shape ...int) models.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		return models.Tensor{Shape: shape, Data: make([]float32, n)}
	}
	ones := func(n int) models.Tensor {
		d := make([]float32, n)
		for i := range d {
			d[i] = 1
		}
		return models.Tensor{Shape: []int{n}, Data: d}
	}
	const heads, kv, inter = 2, 1, 32
	d := h / heads
	w := map[string]models.Tensor{
		"model.embed_tokens.weight": {Shape: []int{v, h}, Data: embed},
		"lm_head.weight":            {Shape: []int{v, h}, Data: head},
		"model.norm.weight":         ones(h),
	}
	p := "model.layers.0."
	w[p+"self_attn.q_proj.weight"], w[p+"self_attn.k_proj.weight"] = zeros(heads*d, h), zeros(kv*d, h)
	w[p+"self_attn.v_proj.weight"], w[p+"self_attn.o_proj.weight"] = zeros(kv*d, h), zeros(h, heads*d)
	w[p+"mlp.gate_proj.weight"], w[p+"mlp.up_proj.weight"], w[p+"mlp.down_proj.weight"] = zeros(inter, h), zeros(inter, h), zeros(h, inter)
	w[p+"input_layernorm.weight"], w[p+"post_attention_layernorm.weight"] = ones(h), ones(h)
	dir := filepath.Join(repo, name, "1")
	writeJSON(t, filepath.Join(dir, "config.json"), map[string]any{
		"architectures": []string{llm.ArchLlama}, "vocab_size": v, "hidden_size": h, "num_hidden_layers": 1,
		"num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": inter,
		"max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "eos_token_id": eos,
	})
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), w, "F32"); err != nil {
		t.Fatal(err)
	}
}

// TestThinkingEndToEnd: a thinking model's reasoning comes apart from its
// answer over gRPC (GenerationDelta.reasoning), never in the text, streamed
// in pieces; with thinking off (enable_thinking or chat_template_kwargs)
// the template's empty block leaks nothing; and the official ollama (think)
// and openai (chat_template_kwargs, reasoning_content) npm clients get the
// same through the HTTP APIs.
func TestThinkingEndToEnd(t *testing.T) {
	cfg := llmHTTPConfig(t, "qwen-think", "k-think")
	writeScriptedQwen(t, cfg.ModelRepo, "qwen-think")
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)
	chat := func(req *brokerv1.ChatRequest) (text, reasoning string, deltas int) {
		t.Helper()
		req.Model = "qwen-think"
		req.Conversations = []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{{Role: "user", Content: "Red or blue?"}}}}
		req.Sampling = &brokerv1.SamplingParams{Temperature: new(float32)}
		st, err := c.Chat(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		text, reasoning, _ = readChat(t, st, func(dl *brokerv1.GenerationDelta) {
			deltas++
			if strings.Contains(dl.GetText()+dl.GetReasoning(), "think>") {
				t.Errorf("a tag leaked: %v", dl)
			}
		})
		return text, reasoning, deltas
	}
	for _, tc := range []struct {
		name      string
		req       *brokerv1.ChatRequest
		reasoning string
	}{
		{name: "the template's default (Qwen3 thinks)", req: &brokerv1.ChatRequest{}, reasoning: scriptReasoning},
		{name: "enable_thinking true", req: &brokerv1.ChatRequest{EnableThinking: proto.Bool(true)}, reasoning: scriptReasoning},
		{name: "enable_thinking false", req: &brokerv1.ChatRequest{EnableThinking: proto.Bool(false)}},
		{name: "chat_template_kwargs", req: &brokerv1.ChatRequest{ChatTemplateKwargs: mustStruct(t, map[string]any{"enable_thinking": false})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text, reasoning, deltas := chat(tc.req)
			if text != scriptContent || reasoning != tc.reasoning {
				t.Errorf("text %q reasoning %q over %d deltas; want %q and %q", text, reasoning, deltas, scriptContent, tc.reasoning)
			}
		})
	}
	runClients(t, "http://"+d.addrs.HTTP, "k-think", "daemon", "THINK_LLM=qwen-think",
		"THINK_REASONING="+scriptReasoning, "THINK_CONTENT="+scriptContent)
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestThinkingThenStructuredOutput: a thinking model asked for thinking
// and JSON thinks first and answers under the schema after its block (as
// vLLM's and Ollama's structured output with reasoning): the reasoning
// comes apart, the text is the JSON; so does one whose template opens the
// block (QwQ, DeepSeek-R1's distills), and one not asked either way (a
// hybrid model decides, as it does without a schema). With thinking off
// the answer is the JSON at once. (The constraint applied from the first
// token kept the model from thinking, and a template that opens the block
// put the JSON in the reasoning.)
func TestThinkingThenStructuredOutput(t *testing.T) {
	cfg := llmHTTPConfig(t, "qwen-json", "k-json")
	cfg.LoadModels = "qwen-json,qwen-opens"
	tok := qwenTokenizer(t)
	one := func(s string) int32 {
		ids := tok.Encode(s, false)
		if len(ids) != 1 {
			t.Fatalf("%q is %d tokens", s, len(ids))
		}
		return ids[0]
	}
	const answer = `{"ok": true}`
	// write writes a model that writes script after the prompt's "\n":
	// opening the block itself, or with a template that opens it.
	write := func(name string, opens bool) {
		v, eos := qwenDir(t, cfg.ModelRepo, name)
		script := []int32{one("\n")}
		if !opens {
			script = append(script, one("<think>"))
		}
		script = append(script, tok.Encode(scriptReasoning, false)...)
		script = append(script, one("</think>"), one("\n\n"))
		script = append(script, tok.Encode(answer, false)...)
		script = append(script, int32(eos))
		writeScript(t, tok, cfg.ModelRepo, name, v, eos, script, nil)
		if opens {
			path := filepath.Join(cfg.ModelRepo, name, "1", "tokenizer_config.json")
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var tc map[string]any
			if err := json.Unmarshal(b, &tc); err != nil {
				t.Fatal(err)
			}
			tmpl := tc["chat_template"].(string)
			const gen = `'<|im_start|>assistant\n'`
			if strings.Count(tmpl, gen) != 1 {
				t.Fatalf("Qwen3's template has %d generation prompts", strings.Count(tmpl, gen))
			}
			tc["chat_template"] = strings.Replace(tmpl, gen, `'<|im_start|>assistant\n<think>\n'`, 1)
			if b, err = json.Marshal(tc); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("qwen-json", false)
	write("qwen-opens", true)
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)
	schema := `{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]}`
	for _, tc := range []struct {
		name, model string
		think       *bool
		reasoning   string
	}{
		{"thinking", "qwen-json", proto.Bool(true), scriptReasoning},
		{"unasked: the model decides", "qwen-json", nil, scriptReasoning},
		{"thinking off", "qwen-json", proto.Bool(false), ""},
		{"the template opens the block", "qwen-opens", nil, scriptReasoning},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := c.Chat(ctx, &brokerv1.ChatRequest{
				Model: tc.model, EnableThinking: tc.think,
				Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{{Role: "user", Content: "Ok?"}}}},
				Sampling: &brokerv1.SamplingParams{Temperature: new(float32), MaxTokens: 40,
					Constraint: &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_JSON_SCHEMA, Source: schema}},
			})
			if err != nil {
				t.Fatal(err)
			}
			text, reasoning, finish := readChat(t, st, nil)
			if text != answer || reasoning != tc.reasoning || finish != brokerv1.FinishReason_FINISH_REASON_STOP {
				t.Errorf("text %q reasoning %q (%v); want %q and %q", text, reasoning, finish, answer, tc.reasoning)
			}
		})
	}
}

// readChat reads a one-conversation chat's stream to its end: its text,
// reasoning and finish reason; each, when set, sees every delta.
func readChat(t *testing.T, st grpc.ServerStreamingClient[brokerv1.ChatResponse], each func(*brokerv1.GenerationDelta)) (text, reasoning string, finish brokerv1.FinishReason) {
	t.Helper()
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return text, reasoning, finish
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, dl := range m.GetDeltas() {
			if each != nil {
				each(dl)
			}
			text += dl.GetText()
			reasoning += dl.GetReasoning()
		}
		for _, r := range m.GetResults() {
			finish = r.GetFinishReason()
		}
	}
}
