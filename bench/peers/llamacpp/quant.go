package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/brokerd/brokerd/bench/benchkit"
	"github.com/brokerd/brokerd/lifecycle"
	"github.com/brokerd/brokerd/runtime/gguf"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/repo"
	"github.com/brokerd/brokerd/scheduler"
)

// tieGap is the logit gap (llama.cpp's best minus its second best, in
// logits: ln p1/p2) under which brokerd may pick llama.cpp's second token,
// and the most the two engines' gaps may differ where they agree. They
// read the same quantized weights but multiply differently: llama.cpp
// rounds the activations to 8 bits per block of 32 or 256 (Q8_0 / Q8_K)
// for its integer dot products, brokerd (today) multiplies the dequantized
// weights in float32. On TestGreedyAgainstLlamaCpp's models that moves the
// gaps by up to 0.06 (Q8_0) and 0.13 (Q4_K_M, with a prefill's attention
// on bf16 products; the test logs it); 0.25 leaves room for the quantized
// engine's own rounding of the activations.
// The logits of these random models are flat (top-2 gaps of 0.01 to 0.3
// are common), so what catches a wrong weight, row or block is mostly the
// second condition, that brokerd's token is llama.cpp's runner-up: another
// file's weights fail every prompt at its first token.
const tieGap = 0.25

// repoFor lays out a model repository holding the GGUF file (hard-linked,
// or copied across file systems) as version 1 of a model named after it,
// as a user drops a .gguf into the repository.
func repoFor(o options, path string) (string, string, error) {
	root := filepath.Join(o.work, "repo")
	name := strings.ReplaceAll(strings.TrimSuffix(filepath.Base(path), ".gguf"), ".", "-")
	dir := filepath.Join(root, name, "1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	dst := filepath.Join(dir, filepath.Base(path))
	src, err1 := os.Stat(path)
	have, err2 := os.Stat(dst)
	if err1 == nil && err2 == nil && os.SameFile(src, have) {
		return root, name, nil
	}
	_ = os.Remove(dst)
	if err := os.Link(path, dst); err != nil {
		if err := copyFile(path, dst); err != nil {
			return "", "", err
		}
	}
	return root, name, nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// loadGGUF loads the repository's model as brokerd's server does.
func loadGGUF(root, name string, ctxLen int) (*llm.Model, error) {
	r, err := repo.Open(root, nil, repo.WithMaxContext(ctxLen))
	if err != nil {
		return nil, err
	}
	l, err := r.Load(context.Background(), name, 1)
	if err != nil {
		return nil, err
	}
	if l.LLM == nil {
		return nil, fmt.Errorf("%s loaded as %s, not a generator", name, l.Kind)
	}
	return l.LLM, nil
}

// fileBytesPerToken is the bytes of the file's tensors a decode step
// reads: all of them, but only a row of token_embd.weight when the model
// has its own output.weight (in a tied model the table is the output
// matrix, read whole).
func fileBytesPerToken(path string) (int64, error) {
	f, err := gguf.Open(path, gguf.Limits{})
	if err != nil {
		return 0, err
	}
	defer f.Close()
	_, untied := f.Tensor("output.weight")
	var n int64
	for _, t := range f.Tensors {
		if untied && t.Name == "token_embd.weight" {
			continue
		}
		n += t.Size
	}
	return n, nil
}

// rssOf is a process's resident memory (VmRSS) in bytes, 0 if unknown.
func rssOf(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// agreeQuantized runs the check prompts greedily through brokerd and
// llama.cpp (F32 KV cache) on the same quantized file and fails unless
// their tokens are the same, but where, at the first difference, brokerd's
// token is among llama.cpp's best four and its logit within tieGap of
// llama.cpp's best (a near tie of two or more tokens).
func agreeQuantized(ctx context.Context, o options, m *llm.Model, eng *llm.Engine, peer *worker, path string, jobs []benchkit.Job, ctxLen int) error {
	b, err := greedyWithGaps(ctx, m, eng, jobs, o.spec)
	if err != nil {
		return err
	}
	if err := peer.load(path, o.threads, ctxLen, 1, "F32"); err != nil {
		return err
	}
	var bad []string
	var pOn [][]int32
	var pg guesses
	for i, j := range jobs {
		p, err := peer.runMeta([]benchkit.Job{j}, true, o.spec)
		if err != nil {
			return err
		}
		pOn, pg = append(pOn, p.Tokens[0]), pg.add(peerGuesses(p))
		want, gaps := p.Tokens[0], p.Gaps[0]
		got := b.tokens[i]
		k := prefix(got, want)
		line := fmt.Sprintf("check %d (%d-token prompt), %d greedy tokens against llama.cpp on the same file:", i+1, len(j.Prompt), len(want))
		var g float64
		var near bool
		if k < len(want) {
			g, near = nearGap(p.Near[0][k], got[k])
		}
		switch {
		case k == len(want):
			line += " all agree"
		case near && g < tieGap:
			line += fmt.Sprintf(" the first %d agree, then a near tie (brokerd's token is %.2g below llama.cpp's best logit)", k, g)
		default:
			line += fmt.Sprintf(" the first %d agree (llama.cpp's gap there %.2g: NOT a tie)", k, gaps[k])
			bad = append(bad, fmt.Sprintf("check %d: brokerd %v, llama.cpp %v", i+1, got, want))
		}
		fmt.Println(line)
	}
	if err := checkWithout(ctx, o, m, eng, peer, jobs, b.tokens, pOn, b.guessed, pg); err != nil {
		return err
	}
	if bad != nil {
		return fmt.Errorf("brokerd and llama.cpp disagree, nothing timed:\n%s", strings.Join(bad, "\n"))
	}
	return nil
}

// daemonBench serves the repository's model from bin/brokerd and runs
// brokerctl bench --generate against it at 1 and 16 streams.
func daemonBench(o options, root, name string, fileBytes int64, limit float64) error {
	bin := o.bin
	if bin == "" {
		bin = filepath.Join(o.peers, "..", "..", "bin")
	}
	for _, b := range []string{"brokerd", "brokerctl"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return fmt.Errorf("-daemon needs %s (make build): %w", filepath.Join(bin, b), err)
		}
	}
	work, err := os.MkdirTemp(o.work, "daemon-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	sock := filepath.Join(work, "brokerd.sock")
	logf, err := os.Create(filepath.Join(work, "brokerd.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	// With -spec the daemon guesses (--speculative-tokens) and serves its
	// metrics, whose speculative decoding counters are read around each
	// level.
	metrics, specArgs, specNote := "", []string(nil), ""
	var specEnv []string
	if o.spec > 0 {
		if metrics, err = freeAddr(); err != nil {
			return err
		}
		help, _ := exec.Command(filepath.Join(bin, "brokerd"), "--help").CombinedOutput()
		if bytes.Contains(help, []byte("speculative-tokens")) {
			specArgs = []string{"--speculative-tokens", strconv.Itoa(o.spec)}
			specNote = fmt.Sprintf(", --speculative-tokens %d", o.spec)
		} else {
			specEnv = []string{"BROKERD_SPECULATIVE_TOKENS=" + strconv.Itoa(o.spec)}
			specNote = fmt.Sprintf(", BROKERD_SPECULATIVE_TOKENS=%d (this bin/brokerd has no --speculative-tokens flag and may ignore it)", o.spec)
		}
	}
	args := append([]string{"--socket", sock, "--state-dir", filepath.Join(work, "state"),
		"--model-repo", root, "--metrics-listen", metrics, "--log-level", "warn", "--cpu-amx-relaid=" + strconv.FormatBool(o.amxRelaid),
		"--kv-cache-dtype", o.kv}, specArgs...)
	d := exec.Command(filepath.Join(bin, "brokerd"), args...)
	d.Env = append(os.Environ(), specEnv...)
	d.Stdout, d.Stderr = logf, logf
	if err := d.Start(); err != nil {
		return err
	}
	defer func() {
		_ = d.Process.Signal(syscall.SIGTERM)
		_ = d.Wait()
	}()
	ctl := func(args ...string) ([]byte, error) {
		c := exec.Command(filepath.Join(bin, "brokerctl"), append([]string{"--socket", sock}, args...)...)
		var stderr bytes.Buffer
		c.Stderr = &stderr
		out, err := c.Output()
		if err != nil {
			return out, fmt.Errorf("brokerctl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return out, nil
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := ctl("health"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			return fmt.Errorf("brokerd did not start:\n%s", log)
		}
		time.Sleep(200 * time.Millisecond)
	}
	before := rssOf(d.Process.Pid)
	t := time.Now()
	if _, err := ctl("load", name); err != nil {
		return err
	}
	loaded := rssOf(d.Process.Pid)
	fmt.Printf("\ndaemon: bin/brokerd serves %s (its default settings but --kv-cache-dtype %s%s: f32 compute on the CPU, its own KV cache reservation); brokerctl load took %.1f s; resident memory %.0f MiB before the load, %.0f after (+%.0f; %.2f× the file)\n",
		name, o.kv, specNote, time.Since(t).Seconds(), mib(before), mib(loaded), mib(loaded-before), float64(loaded-before)/float64(max(fileBytes, 1)))
	textBytes := o.promptTokens * 4 // about 4 bytes a token of English words
	// One brokerctl bench per level (each level has its own warmup either
	// way), so that the guesses can be counted per level.
	for _, level := range []string{"1", "16"} {
		if err := daemonLevel(ctl, name, level, o, textBytes, metrics, limit); err != nil {
			return err
		}
	}
	return nil
}

// daemonLevel runs brokerctl bench --generate at one concurrency level and
// prints what it measured, and with a metrics address the guesses the
// daemon made meanwhile (warmup included).
func daemonLevel(ctl func(...string) ([]byte, error), name, level string, o options, textBytes int, metrics string, limit float64) error {
	args := []string{"bench", "--generate", "--model", name, "--concurrency", level, "--max-tokens", strconv.Itoa(o.genTokens),
		"--text-bytes", strconv.Itoa(textBytes), "--duration", o.daemonTime.String(), "--warmup", "5s", "--json"}
	fmt.Printf("brokerctl %s\n", strings.Join(args, " "))
	var before guesses
	if metrics != "" {
		var err error
		if before, err = scrapeGuesses(metrics); err != nil {
			return err
		}
	}
	out, err := ctl(args...)
	if err != nil {
		return err
	}
	guessed := ""
	if metrics != "" {
		after, err := scrapeGuesses(metrics)
		if err != nil {
			return err
		}
		guessed = fmt.Sprintf("; guesses, warmup included: %s", guesses{after.drafted - before.drafted, after.accepted - before.accepted})
	}
	var rep struct {
		Levels []struct {
			Concurrency           int     `json:"concurrency"`
			Requests              int     `json:"requests"`
			OutputTokensPerSecond float64 `json:"output_tokens_per_second"`
			PromptTokens          int     `json:"prompt_tokens"`
			TTFT                  struct {
				P50 float64 `json:"p50"`
			} `json:"time_to_first_token_ms"`
			ITL struct {
				Mean float64 `json:"mean"`
				P50  float64 `json:"p50"`
			} `json:"inter_token_ms"`
			MeanBatchSize  float64 `json:"mean_batch_size"`
			FailedRequests int     `json:"failed_requests"`
		} `json:"levels"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		return fmt.Errorf("brokerctl bench --json: %w\n%s", err, out)
	}
	for _, l := range rep.Levels {
		fmt.Printf("daemon, %2d streams: %.1f output tokens/s (%d requests, %d failed; %.0f prompt tokens each; TTFT p50 %.0f ms; inter-token p50 %.1f ms",
			l.Concurrency, l.OutputTokensPerSecond, l.Requests, l.FailedRequests, float64(l.PromptTokens)/float64(max(l.Requests, 1)), l.TTFT.P50, l.ITL.P50)
		if l.Concurrency == 1 && l.ITL.P50 > 0 {
			fmt.Printf(", decode %.1f tokens/s = %.2f of the bandwidth limit", 1000/l.ITL.P50, 1000/l.ITL.P50/limit)
		}
		fmt.Printf("%s)\n", guessed)
		if l.FailedRequests > 0 {
			return errors.New("brokerctl bench: failed requests")
		}
	}
	return nil
}

// greedyRun is brokerd's side: each job's greedy tokens, and per step the
// gap between its best two logprobs (= logits) and the runner-up.
type greedyRun struct {
	tokens, second [][]int32
	gaps           [][]float64
	guessed        guesses // with spec
}

// greedyWithGaps runs jobs at once through the scheduler over eng, greedy,
// ignoring EOS, with the top two logprobs of every token, guessing up to
// spec tokens a step (0: none).
func greedyWithGaps(ctx context.Context, m *llm.Model, eng *llm.Engine, jobs []benchkit.Job, spec int) (greedyRun, error) {
	reg := prometheus.NewRegistry()
	s := scheduler.New(scheduler.Options{Registerer: reg})
	defer s.Close()
	opts := eng.Options()
	if err := s.AddGenReplica("m", scheduler.Device{ID: "cpu:0", Type: "cpu"},
		scheduler.GenOptions{MaxRunning: len(jobs), MaxStepTokens: opts.MaxStepTokens, MaxChunk: opts.MaxStepTokens, SpecTokens: spec},
		lifecycle.EngineExecutor{Engine: eng}); err != nil {
		return greedyRun{}, err
	}
	n := len(jobs)
	res := greedyRun{tokens: make([][]int32, n), second: make([][]int32, n), gaps: make([][]float64, n)}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, j := range jobs {
		seq, err := m.NewSequence(llm.Sampling{IgnoreEOS: true, Logprobs: true, TopLogprobs: 2}, j.Prompt)
		if err != nil {
			return res, err
		}
		st, err := s.Generate(ctx, scheduler.GenRequest{Model: "m", Prompt: j.Prompt, MaxNewTokens: j.Out, State: seq})
		if err != nil {
			return res, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ev, err := st.Recv()
				if errors.Is(err, io.EOF) {
					return
				}
				if err != nil {
					errs[i] = err
					return
				}
				if d, ok := ev.Out.(llm.Delta); ok {
					for _, lp := range d.Logprobs {
						if len(lp.Top) < 2 || lp.Top[0].Token != lp.Token {
							errs[i] = fmt.Errorf("token %d: top logprobs %+v", lp.Token, lp.Top)
							return
						}
						res.tokens[i] = append(res.tokens[i], lp.Token)
						res.second[i] = append(res.second[i], lp.Top[1].Token)
						res.gaps[i] = append(res.gaps[i], float64(lp.Top[0].Logprob)-float64(lp.Top[1].Logprob))
					}
				}
			}
		}()
	}
	wg.Wait()
	for i, j := range jobs {
		if errs[i] == nil && len(res.tokens[i]) != j.Out {
			errs[i] = fmt.Errorf("job %d: %d tokens with logprobs, want %d", i, len(res.tokens[i]), j.Out)
		}
	}
	var err error
	res.guessed, err = gathered(reg)
	return res, errors.Join(append(errs, err)...)
}
