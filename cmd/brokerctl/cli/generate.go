package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// genFlags are the flags generate and chat share.
type genFlags struct {
	model                               string
	maxTokens                           int
	temperature, topP, minP, repetition float64
	presence, frequency                 float64
	topK                                int
	seed                                uint64
	stop                                stringList
	logprobs                            int
	priority, device, typ               string
	maxTime                             time.Duration
	asJSON                              bool
	// Structured output: at most one of these (read by routing).
	jsonObject              bool
	jsonSchema, gbnf, regex string
	constraint              *brokerv1.Constraint
}

func (f *genFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.model, "model", "", "generator model `NAME` (required)")
	fs.IntVar(&f.maxTokens, "max-tokens", 0, "most tokens `N` to generate per prompt (0: no limit: to a stop or the end of the model's context, unless its generation_config.json sets max_new_tokens)")
	fs.Float64Var(&f.temperature, "temperature", 0, "sampling temperature `T` (0: greedy; default: the model's generation_config)")
	fs.Float64Var(&f.topP, "top-p", 0, "nucleus sampling probability `P` (default: the model's)")
	fs.IntVar(&f.topK, "top-k", 0, "sample among the `K` most likely tokens (default: the model's)")
	fs.Float64Var(&f.minP, "min-p", 0, "drop tokens less likely than `P` times the most likely one")
	fs.Float64Var(&f.repetition, "repetition-penalty", 0, "repetition penalty `R` (1: off; default: the model's)")
	fs.Float64Var(&f.presence, "presence-penalty", 0, "presence penalty `P` (-2 to 2)")
	fs.Float64Var(&f.frequency, "frequency-penalty", 0, "frequency penalty `P` (-2 to 2)")
	fs.Uint64Var(&f.seed, "seed", 0, "sampling seed `S`: the same seed gives the same tokens")
	fs.Var(&f.stop, "stop", "stop `STRING` (repeatable); not part of the output")
	fs.IntVar(&f.logprobs, "logprobs", 0, "with --json, each token's log-probability and `N` alternatives (0-20; -1: none)")
	fs.StringVar(&f.priority, "priority", "", "scheduling priority `P`: low, normal or high (default: normal)")
	fs.StringVar(&f.device, "device", "", "run on device `ID`, e.g. gpu:0")
	fs.StringVar(&f.typ, "type", "", "run on a device of type `T`: cpu, gpu or tpu")
	fs.DurationVar(&f.maxTime, "max-time", 0, "end each sequence after `DUR` with what it has (finish reason deadline)")
	fs.BoolVar(&f.asJSON, "json", false, "print one JSON result per prompt (text, token ids, finish reason, usage, timings) instead of streaming text")
	fs.BoolVar(&f.jsonObject, "json-object", false, "structured output: the answer is a JSON object (Ollama's format json)")
	fs.StringVar(&f.jsonSchema, "json-schema", "", "structured output: the answer is JSON that validates against the JSON Schema in `FILE`")
	fs.StringVar(&f.gbnf, "grammar", "", "structured output: the answer is a sentence of the GBNF grammar (llama.cpp's, start rule root) in `FILE`")
	fs.StringVar(&f.regex, "regex", "", "structured output: the answer is a full match of the regular expression `RE` (RE2 syntax)")
}

// readConstraint reads the structured-output flags into f.constraint.
func (f *genFlags) readConstraint() error {
	var given []string
	read := func(flag, path string, kind brokerv1.Constraint_Kind) error {
		given = append(given, flag)
		b, err := os.ReadFile(path)
		if err != nil {
			return usagef("%s: %v", flag, err)
		}
		f.constraint = &brokerv1.Constraint{Kind: kind, Source: string(b)}
		return nil
	}
	if f.jsonObject {
		given = append(given, "--json-object")
		f.constraint = &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_JSON}
	}
	if f.jsonSchema != "" {
		if err := read("--json-schema", f.jsonSchema, brokerv1.Constraint_KIND_JSON_SCHEMA); err != nil {
			return err
		}
	}
	if f.gbnf != "" {
		if err := read("--grammar", f.gbnf, brokerv1.Constraint_KIND_GBNF); err != nil {
			return err
		}
	}
	if f.regex != "" {
		given = append(given, "--regex")
		f.constraint = &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_REGEX, Source: f.regex}
	}
	if len(given) > 1 {
		return usagef("%s: give at most one structured-output constraint", strings.Join(given, ", "))
	}
	return nil
}

// sampling builds the request's parameters; only flags given are sent, so
// the model's defaults apply to the rest.
func (f *genFlags) sampling(fs *flag.FlagSet) *brokerv1.SamplingParams {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	p := &brokerv1.SamplingParams{MaxTokens: int32(f.maxTokens), Stop: f.stop}
	if set["temperature"] {
		p.Temperature = proto.Float32(float32(f.temperature))
	}
	if set["top-p"] {
		p.TopP = proto.Float32(float32(f.topP))
	}
	if set["top-k"] {
		p.TopK = proto.Int32(int32(f.topK))
	}
	if set["min-p"] {
		p.MinP = proto.Float32(float32(f.minP))
	}
	if set["repetition-penalty"] {
		p.RepetitionPenalty = proto.Float32(float32(f.repetition))
	}
	if set["presence-penalty"] {
		p.PresencePenalty = proto.Float32(float32(f.presence))
	}
	if set["frequency-penalty"] {
		p.FrequencyPenalty = proto.Float32(float32(f.frequency))
	}
	if set["seed"] {
		p.Seed = proto.Uint64(f.seed)
	}
	if set["logprobs"] && f.logprobs >= 0 {
		p.Logprobs, p.TopLogprobs = true, int32(f.logprobs)
	}
	p.Constraint = f.constraint
	return p
}

// routing validates the shared routing flags.
func (f *genFlags) routing() (brokerv1.Priority, brokerv1.DeviceType, *durationpb.Duration, error) {
	if f.model == "" {
		return 0, 0, nil, usagef("--model NAME is required")
	}
	prio, ok := parsePriority(f.priority)
	if !ok {
		return 0, 0, nil, usagef("--priority %q: want low, normal or high", f.priority)
	}
	var typ brokerv1.DeviceType
	if f.typ != "" {
		t, ok := parseDeviceType(f.typ)
		if !ok || t == brokerv1.DeviceType_DEVICE_TYPE_AMD_GPU || t == brokerv1.DeviceType_DEVICE_TYPE_EDGE_TPU {
			return 0, 0, nil, usagef("--type %q: want cpu, gpu or tpu", f.typ)
		}
		typ = t
	}
	if f.maxTokens < 0 {
		return 0, 0, nil, usagef("--max-tokens %d: want 0 or more", f.maxTokens)
	}
	if err := f.readConstraint(); err != nil {
		return 0, 0, nil, err
	}
	var mt *durationpb.Duration
	if f.maxTime > 0 {
		mt = durationpb.New(f.maxTime)
	}
	return prio, typ, mt, nil
}

// genStream is what Generate and Chat streams have in common.
type genStream interface {
	recv() ([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult, error)
}

type generateStream struct {
	s brokerv1.BrokerService_GenerateClient
}

func (g generateStream) recv() ([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult, error) {
	m, err := g.s.Recv()
	return m.GetDeltas(), m.GetResults(), err
}

type chatStream struct {
	s brokerv1.BrokerService_ChatClient
}

func (c chatStream) recv() ([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult, error) {
	m, err := c.s.Recv()
	return m.GetDeltas(), m.GetResults(), err
}

// genOutput is one prompt's output, as --json prints it.
type genOutput struct {
	Index            int32                    `json:"index"`
	Text             string                   `json:"text"`
	TokenIDs         []int32                  `json:"token_ids"`
	Logprobs         []*brokerv1.LogprobEntry `json:"-"`
	LogprobsJSON     []json.RawMessage        `json:"logprobs,omitempty"`
	FinishReason     string                   `json:"finish_reason"`
	PromptTokens     int32                    `json:"prompt_tokens"`
	CompletionTokens int32                    `json:"completion_tokens"`
	TimeToFirstMs    float64                  `json:"time_to_first_token_ms"`
	TotalMs          float64                  `json:"total_ms"`
	TokensPerSecond  float64                  `json:"tokens_per_second"`
	DeviceID         string                   `json:"device_id"`
	MaxBatch         int32                    `json:"max_batch"`
	Preemptions      int32                    `json:"preemptions"`
	CostUSD          float64                  `json:"cost_usd"`
	done             bool
}

func finishName(r brokerv1.FinishReason) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "FINISH_REASON_"))
}

// consume reads a stream to its end. With one prompt and no --json the
// text goes to out as it arrives; otherwise outputs are returned whole.
func consume(st genStream, n int, stream io.Writer) ([]*genOutput, error) {
	outs := make([]*genOutput, n)
	for i := range outs {
		outs[i] = &genOutput{Index: int32(i), TokenIDs: []int32{}}
	}
	for {
		deltas, results, err := st.recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return outs, err
		}
		for _, d := range deltas {
			i := int(d.GetIndex())
			if i < 0 || i >= n {
				return outs, fmt.Errorf("brokerd sent a delta for prompt %d of %d", i, n)
			}
			o := outs[i]
			o.Text += d.GetText()
			o.TokenIDs = append(o.TokenIDs, d.GetTokenIds()...)
			o.Logprobs = append(o.Logprobs, d.GetLogprobs()...)
			if stream != nil && d.GetText() != "" {
				if _, err := io.WriteString(stream, d.GetText()); err != nil {
					return outs, fmt.Errorf("write output: %w", err)
				}
			}
		}
		for _, r := range results {
			i := int(r.GetIndex())
			if i < 0 || i >= n {
				return outs, fmt.Errorf("brokerd sent a result for prompt %d of %d", i, n)
			}
			o := outs[i]
			o.done = true
			o.FinishReason = finishName(r.GetFinishReason())
			o.PromptTokens = r.GetUsage().GetPromptTokens()
			o.CompletionTokens = r.GetUsage().GetCompletionTokens()
			o.TimeToFirstMs = float64(r.GetTimeToFirstToken().AsDuration()) / 1e6
			ex := r.GetExecution()
			o.TotalMs = float64(ex.GetTotalNs()) / 1e6
			if ex.GetTotalNs() > 0 {
				o.TokensPerSecond = float64(o.CompletionTokens) / (float64(ex.GetTotalNs()) / 1e9)
			}
			o.DeviceID, o.MaxBatch, o.CostUSD = ex.GetDeviceId(), ex.GetBatchSize(), ex.GetCostUsd()
			o.Preemptions = r.GetPreemptions()
		}
	}
	for _, o := range outs {
		if !o.done {
			return outs, fmt.Errorf("the stream ended without a result for prompt %d", o.Index)
		}
	}
	return outs, nil
}

// summary is the line after a streamed or printed output.
func (o *genOutput) summary() string {
	return fmt.Sprintf("[%s · %d prompt + %d tokens · first token %.0f ms · %.1f tokens/s · %s, batch ≤ %d]",
		o.FinishReason, o.PromptTokens, o.CompletionTokens, o.TimeToFirstMs, o.TokensPerSecond, o.DeviceID, o.MaxBatch)
}

func printOutputs(inv *invocation, outs []*genOutput, asJSON, streamed bool) error {
	if asJSON {
		for _, o := range outs {
			for _, lp := range o.Logprobs {
				b, err := marshalJSON(lp)
				if err != nil {
					return err
				}
				o.LogprobsJSON = append(o.LogprobsJSON, json.RawMessage(strings.TrimSpace(string(b))))
			}
		}
		b, err := json.MarshalIndent(outs, "", "  ")
		if err != nil {
			return err
		}
		return inv.write(append(b, '\n'))
	}
	var b strings.Builder
	for _, o := range outs {
		if !streamed {
			if len(outs) > 1 {
				fmt.Fprintf(&b, "── %d ──\n", o.Index)
			}
			b.WriteString(o.Text)
		}
		fmt.Fprintf(&b, "\n%s\n", o.summary())
	}
	return inv.write([]byte(b.String()))
}

func generateCmd(fs *flag.FlagSet) action {
	f := &genFlags{}
	f.register(fs)
	noSpecial := fs.Bool("no-special-tokens", false, "do not add the tokenizer's special tokens (BOS) to the prompts")
	return func(ctx context.Context, inv *invocation, args []string) error {
		prio, typ, mt, err := f.routing()
		if err != nil {
			return err
		}
		if len(args) == 0 {
			return usagef("give at least one PROMPT")
		}
		c, err := inv.broker(ctx)
		if err != nil {
			return err
		}
		req := &brokerv1.GenerateRequest{
			Model: f.model, Prompts: args, Sampling: f.sampling(fs), Priority: prio,
			DeviceType: typ, DeviceId: f.device, MaxTime: mt,
		}
		if *noSpecial {
			req.AddSpecialTokens = proto.Bool(false)
		}
		s, err := c.Generate(ctx, req)
		if err != nil {
			return err
		}
		var stream io.Writer
		if len(args) == 1 && !f.asJSON {
			stream = inv.stdout
		}
		outs, err := consume(generateStream{s}, len(args), stream)
		if err != nil {
			return err
		}
		return printOutputs(inv, outs, f.asJSON, stream != nil)
	}
}

func chatCmd(fs *flag.FlagSet) action {
	f := &genFlags{}
	f.register(fs)
	var messages stringList
	fs.Var(&messages, "message", "a turn `ROLE=TEXT` (system, user or assistant; repeatable): answer this conversation once and exit")
	system := fs.String("system", "", "system prompt `TEXT` of an interactive chat")
	return func(ctx context.Context, inv *invocation, _ []string) error {
		prio, typ, mt, err := f.routing()
		if err != nil {
			return err
		}
		c, err := inv.broker(ctx)
		if err != nil {
			return err
		}
		ask := func(conv []*brokerv1.ChatMessage, stream io.Writer) (*genOutput, error) {
			s, err := c.Chat(ctx, &brokerv1.ChatRequest{
				Model: f.model, Conversations: []*brokerv1.Conversation{{Messages: conv}}, Sampling: f.sampling(fs),
				Priority: prio, DeviceType: typ, DeviceId: f.device, MaxTime: mt,
			})
			if err != nil {
				return nil, err
			}
			outs, err := consume(chatStream{s}, 1, stream)
			if err != nil {
				return nil, err
			}
			return outs[0], nil
		}
		if len(messages) > 0 {
			var conv []*brokerv1.ChatMessage
			for _, m := range messages {
				role, text, ok := strings.Cut(m, "=")
				if !ok || (role != "system" && role != "user" && role != "assistant") {
					return usagef("--message %q: want ROLE=TEXT with ROLE system, user or assistant", m)
				}
				conv = append(conv, &brokerv1.ChatMessage{Role: role, Content: text})
			}
			var stream io.Writer
			if !f.asJSON {
				stream = inv.stdout
			}
			o, err := ask(conv, stream)
			if err != nil {
				return err
			}
			return printOutputs(inv, []*genOutput{o}, f.asJSON, stream != nil)
		}
		if inv.stdin == nil {
			return usagef("give --message ROLE=TEXT, or run interactively with input on stdin")
		}
		// Interactive: each line is a user turn; the reply streams back.
		var conv []*brokerv1.ChatMessage
		if *system != "" {
			conv = append(conv, &brokerv1.ChatMessage{Role: "system", Content: *system})
		}
		sc := bufio.NewScanner(inv.stdin)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		fmt.Fprintf(inv.stderr, "chat with %s; an empty line or end of input quits\n> ", f.model)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" {
				break
			}
			conv = append(conv, &brokerv1.ChatMessage{Role: "user", Content: line})
			o, err := ask(conv, inv.stdout)
			if err != nil {
				return err
			}
			conv = append(conv, &brokerv1.ChatMessage{Role: "assistant", Content: o.Text})
			fmt.Fprintf(inv.stderr, "\n%s\n> ", o.summary())
		}
		return sc.Err()
	}
}
