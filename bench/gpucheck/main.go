// Command gpucheck is the Go side of bench/gpu_check.sh's generation
// check: it tokenizes fixed prompts with brokerd's own tokenizer
// (runtime/models/tokenizer/bpe, read from the checkpoint directory as the
// daemon reads it), sends them to a running brokerd as one greedy Generate
// call (temperature 0, past end-of-sequence tokens, top-2 log-probabilities)
// and writes a JSON document with the prompt token ids and brokerd's tokens,
// so a reference (bench/peers/hf_generate.py) can run the very same ids
// without a second tokenizer in the way.
//
//	gpucheck -socket S -model M -dir REPO/M/1 -type gpu -max-tokens 32 -out brokerd.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/models/tokenizer/bpe"
	"github.com/brokerd/brokerd/server/endpoint"
	"google.golang.org/protobuf/proto"
)

// Prompts are the generation check's inputs: short and long, plain and
// with digits and punctuation, so they tokenize to a spread of lengths.
var Prompts = []string{
	"The quick brown fox",
	"Once upon a time, in a land far away, there lived a broker who batched requests for accelerators.",
	"1, 2, 3, 4, 5,",
	"def fibonacci(n):\n    if n < 2:\n        return n\n",
}

// Result is the JSON document gpucheck writes.
type Result struct {
	Model     string      `json:"model"`
	DeviceID  string      `json:"device_id"`
	MaxTokens int         `json:"max_tokens"`
	Seconds   float64     `json:"seconds"`
	Prompts   []Prompt    `json:"prompts"`
	Tokens    [][]int32   `json:"tokens"`
	Gaps      [][]float64 `json:"gaps"` // brokerd's top-1 minus top-2 log-probability per token (absent without logprobs)
	Finish    []string    `json:"finish"`
	Logprobs  bool        `json:"logprobs"`
	Problems  []string    `json:"problems"`
}

// Prompt is one input and its token ids.
type Prompt struct {
	Text        string  `json:"text"`
	IDs         []int32 `json:"ids"`
	UsageTokens int32   `json:"usage_prompt_tokens"` // what brokerd counted
}

func main() {
	socket := flag.String("socket", "", "brokerd's Unix socket (required)")
	model := flag.String("model", "", "generator model name (required)")
	dir := flag.String("dir", "", "the model's checkpoint directory, for its tokenizer (required)")
	typ := flag.String("type", "", "device type to run on: cpu, gpu or tpu (default: the server's choice)")
	maxTokens := flag.Int("max-tokens", 32, "tokens to generate per prompt")
	out := flag.String("out", "", "JSON output file (default: stdout)")
	timeout := flag.Duration("timeout", 3*time.Minute, "deadline of the Generate call")
	flag.Parse()
	if *socket == "" || *model == "" || *dir == "" {
		fmt.Fprintln(os.Stderr, "gpucheck: -socket, -model and -dir are required")
		os.Exit(2)
	}
	var dt brokerv1.DeviceType
	switch *typ {
	case "":
	case "cpu":
		dt = brokerv1.DeviceType_DEVICE_TYPE_CPU
	case "gpu":
		dt = brokerv1.DeviceType_DEVICE_TYPE_GPU
	case "tpu":
		dt = brokerv1.DeviceType_DEVICE_TYPE_TPU
	default:
		fmt.Fprintf(os.Stderr, "gpucheck: -type %q: want cpu, gpu or tpu\n", *typ)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	res, err := run(ctx, *socket, *model, *dir, dt, *maxTokens)
	if res != nil {
		b, _ := json.MarshalIndent(res, "", " ")
		b = append(b, '\n')
		if *out == "" {
			os.Stdout.Write(b)
		} else if werr := os.WriteFile(*out, b, 0o644); werr != nil {
			fmt.Fprintln(os.Stderr, "gpucheck:", werr)
			os.Exit(1)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpucheck:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, socket, model, dir string, dt brokerv1.DeviceType, maxTokens int) (*Result, error) {
	tok, err := bpe.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("tokenizer of %s: %w", dir, err)
	}
	res := &Result{Model: model, MaxTokens: maxTokens, Problems: []string{}}
	for _, p := range Prompts {
		res.Prompts = append(res.Prompts, Prompt{Text: p, IDs: tok.Encode(p, true)})
	}
	conn, err := endpoint.Dial(ctx, socket, "")
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	c := brokerv1.NewBrokerServiceClient(conn)
	t0 := time.Now()
	err = generate(ctx, c, res, dt, true)
	if err != nil {
		// Log-probabilities are a diagnostic; the tokens are the check.
		res.Problems = append(res.Problems, fmt.Sprintf("Generate with logprobs: %v; retried without", err))
		t0 = time.Now()
		err = generate(ctx, c, res, dt, false)
	}
	res.Seconds = time.Since(t0).Seconds()
	if err != nil {
		res.Problems = append(res.Problems, fmt.Sprintf("Generate: %v", err))
		return res, err
	}
	bad := 0
	for i, p := range res.Prompts {
		if int(p.UsageTokens) != len(p.IDs) {
			bad++
			res.Problems = append(res.Problems, fmt.Sprintf("prompt %d: brokerd counted %d prompt tokens, the tokenizer here %d", i, p.UsageTokens, len(p.IDs)))
		}
		if len(res.Tokens[i]) != maxTokens {
			bad++
			res.Problems = append(res.Problems, fmt.Sprintf("prompt %d: %d tokens, want %d (finish %s)", i, len(res.Tokens[i]), maxTokens, res.Finish[i]))
		}
	}
	if bad > 0 {
		return res, fmt.Errorf("brokerd's answer does not match the request: %d problems (in the JSON)", bad)
	}
	return res, nil
}

// generate sends every prompt in one Generate call and collects the tokens.
func generate(ctx context.Context, c brokerv1.BrokerServiceClient, res *Result, dt brokerv1.DeviceType, logprobs bool) error {
	n := len(res.Prompts)
	res.Tokens, res.Gaps, res.Finish, res.Logprobs = make([][]int32, n), make([][]float64, n), make([]string, n), logprobs
	texts := make([]string, n)
	for i, p := range res.Prompts {
		texts[i] = p.Text
		res.Tokens[i], res.Gaps[i] = []int32{}, []float64{}
	}
	sp := &brokerv1.SamplingParams{Temperature: proto.Float32(0), MaxTokens: int32(res.MaxTokens), IgnoreEos: true}
	if logprobs {
		sp.Logprobs, sp.TopLogprobs = true, 2
	}
	s, err := c.Generate(ctx, &brokerv1.GenerateRequest{Model: res.Model, Prompts: texts, Sampling: sp, DeviceType: dt})
	if err != nil {
		return err
	}
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, d := range m.GetDeltas() {
			i := int(d.GetIndex())
			if i < 0 || i >= n {
				return fmt.Errorf("delta for prompt %d of %d", i, n)
			}
			res.Tokens[i] = append(res.Tokens[i], d.GetTokenIds()...)
			for _, lp := range d.GetLogprobs() {
				gap := -1.0 // unknown
				if top := lp.GetTop(); len(top) >= 2 {
					gap = float64(top[0].GetLogprob() - top[1].GetLogprob())
				}
				res.Gaps[i] = append(res.Gaps[i], gap)
			}
		}
		for _, r := range m.GetResults() {
			i := int(r.GetIndex())
			if i < 0 || i >= n {
				return fmt.Errorf("result for prompt %d of %d", i, n)
			}
			res.Finish[i] = r.GetFinishReason().String()
			res.Prompts[i].UsageTokens = r.GetUsage().GetPromptTokens()
			if id := r.GetExecution().GetDeviceId(); id != "" {
				res.DeviceID = id
			}
		}
	}
}
