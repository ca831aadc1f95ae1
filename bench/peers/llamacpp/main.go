// Command llamacpp measures brokerd's generation against llama.cpp on the
// same random weights and machine: bench/modelkit writes a decoder
// checkpoint (Qwen2.5-0.5B's shape by default, with the Qwen tokenizer)
// and the same weights as GGUF; llama.cpp runs through node-llama-cpp
// 3.21.1's prebuilt CPU build (installed here with npm ci on first run);
// brokerd runs in process, through the scheduler's continuous batching and
// the LLM engine on oneDNN. Before timing anything it checks that brokerd,
// llama.cpp and an eager PyTorch decoder (bench/peers/llm_torch.py,
// Debian's python3-torch, float64) give the same greedy tokens.
//
// Then, in interleaved rounds (brokerd, llama.cpp, brokerd, ...):
//
//   - scaling: N concurrent sequences (1, 2, 4, ... 32), each a prompt of
//     -prompt-tokens and exactly -gen-tokens greedy tokens; aggregate
//     generated tokens/s of each and their ratio, plus the single stream's
//     decode-only rate against the memory-bandwidth limit; drawn as a PNG;
//
//   - a council round: 16 prompts with answers of 16 to 256 tokens, all
//     submitted at once (llama.cpp: a 16-sequence context); useful tokens/s
//     and time to first token p99;
//
//   - prefill: one 512-token prompt, its time to first token, and brokerd's
//     rate against the adapter's measured matmul peak.
//
//     make build && go run ./bench/peers/llamacpp [-dtype bf16] [-rounds 3]
//
// With -quant TYPE (f32, bf16, q8_0, q4_0, q4_k_m, q5_k_m, q6_k) both
// engines read the same GGUF file: ggml's own quantizer (libggml-base.so
// of the installed node-llama-cpp, through runtime/quant/ggmlref) writes
// it in llama-quantize's mix for that type (bench/modelkit), and brokerd
// loads it through its model repository as a user's file. The token check
// is then against llama.cpp itself (PyTorch has only the unquantized
// weights): identical greedy tokens except at llama.cpp's near ties, as
// TestGreedyAgainstLlamaCpp checks. It also reports brokerd's resident
// memory after the load against the file's size, the decode bandwidth
// limit from the file's bytes per token over a vector-load read
// bandwidth, and with -daemon the same file served by bin/brokerd
// (brokerctl load, then brokerctl bench --generate at 1 and 16 streams).
//
//	make build && go run ./bench/peers/llamacpp -shape llama-12x1024 -quant q4_k_m -daemon
//
// With -spec N both engines decode speculatively by prompt lookup, up to
// N guessed tokens a step: brokerd's generation replica gets SpecTokens N
// (SpecMaxRunning its default, 4) over an engine of MaxDrafts 4N, and
// with -daemon bin/brokerd runs with --speculative-tokens N and its
// metrics on a free loopback port; llama.cpp gives each sequence
// node-llama-cpp's InputLookupTokenPredictor (3 to 5 token patterns, up to
// max(N, 3) tokens: the predictor never guesses fewer than its shortest
// pattern). Every measurement then runs with guesses, and each round's
// single stream also without them first (brokerd, llama.cpp without;
// brokerd, llama.cpp with), so the table prints both engines' decode
// rates both ways and the ratios. The guesses are counted beside them:
// brokerd's from the scheduler's spec_decode_draft_tokens_total and
// _accepted_tokens_total (in process from the round's own registry,
// through the daemon from /metrics around each level), llama.cpp's from
// each sequence's tokenPredictions (validated of validated + refuted).
// The greedy check runs with guesses too, and says how far each engine's
// tokens follow its tokens without.
//
// The two predictors differ: brokerd looks the last tokens up in the
// prompt and what the sequence generated (vLLM's ngram proposer),
// node-llama-cpp's only in the prompt (its "input tokens"). These random
// untied models answer random prompts with tokens the prompt does not
// hold, so guesses are few and mostly refused; where one falls into a
// loop of its own tokens, only brokerd's lookup finds it: the engines'
// cost of guesses mostly wrong. The best case is -shape
// llama-12x1024-tied -repeat-tail 8: a random tied model repeats its last
// input token, and prompts ending in 8 copies of it give both predictors
// the pattern, so every guess is right in either engine: what each makes
// of guesses all taken.
//
//	go run ./bench/peers/llamacpp -shape llama-12x1024 -quant q8_0 -spec 3 [-daemon]
//	go run ./bench/peers/llamacpp -shape llama-12x1024-tied -repeat-tail 8 -quant q8_0 -spec 3
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/brokerd/brokerd/bench/benchkit"
	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/onednn"
	"github.com/brokerd/brokerd/runtime/quant/ggmlref"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// shapes are the checkpoints -shape names.
var shapes = map[string]modelkit.LLM{
	// Qwen2.5-0.5B's shape (untied here: random tied embeddings make a
	// model that repeats its input, which would make the token check
	// vacuous; a decode step reads the same bytes either way).
	"qwen2.5-0.5b": {Arch: "qwen2", Layers: 24, Hidden: 896, Heads: 14, KVHeads: 2, Intermediate: 4864, Vocab: 151936},
	// A Llama whose rows divide by 256, so K types apply everywhere (the
	// issue's 12 × 1024 shape; smaller than Llama 3.2 1B's 16 × 2048):
	// untied, Llama 3's tokenizer.
	"llama-12x1024": {Arch: "llama", Layers: 12, Hidden: 1024, Heads: 16, KVHeads: 4, Intermediate: 2816, Vocab: 128256},
	// The same, tied: random tied embeddings make a model that repeats
	// its last input token, so with -repeat-tail every guess of a prompt
	// lookup is right, in either engine: speculative decoding's best case.
	"llama-12x1024-tied": {Arch: "llama", Layers: 12, Hidden: 1024, Heads: 16, KVHeads: 4, Intermediate: 2816, Vocab: 128256, Tied: true},
	// Something quick, for trying the script.
	"small": {Arch: "qwen3", Layers: 4, Hidden: 256, Heads: 4, KVHeads: 2, HeadDim: 64, Intermediate: 768, Vocab: 151936},
}

type options struct {
	shape, dtype, work, plot, levels string
	quant, bin                       string
	daemon, amxRelaid                bool
	kv                               string // -kv
	daemonTime                       time.Duration
	rounds, threads, promptTokens    int
	genTokens, checkTokens, prefill  int
	council, torch                   bool
	spec, repeatTail                 int    // -spec, -repeat-tail
	peers                            string // the checkout's bench/peers, found at run time
}

func main() {
	var o options
	flag.StringVar(&o.shape, "shape", "qwen2.5-0.5b", "checkpoint shape: qwen2.5-0.5b, llama-12x1024, llama-12x1024-tied or small")
	flag.StringVar(&o.dtype, "dtype", "f32", "compute type: f32 (F32 GGUF) or bf16 (BF16 GGUF); with -quant, brokerd's compute type")
	flag.StringVar(&o.quant, "quant", "", "GGUF file type both engines read: "+strings.Join(modelkit.FileTypes, ", ")+" (default: brokerd reads the safetensors checkpoint, llama.cpp a GGUF of -dtype)")
	flag.BoolVar(&o.daemon, "daemon", false, "with -quant, also serve the file from bin/brokerd and run brokerctl bench --generate at 1 and 16 streams")
	flag.DurationVar(&o.daemonTime, "daemon-duration", 30*time.Second, "measurement window of each brokerctl bench level")
	flag.StringVar(&o.bin, "bin", "", "directory of brokerd and brokerctl (default: the checkout's bin)")
	flag.StringVar(&o.work, "work", filepath.Join(os.TempDir(), "brokerd-llamacpp-bench"), "directory for the checkpoint and GGUF (kept between runs)")
	flag.StringVar(&o.plot, "plot", "", "PNG of the scaling table (default: scaling-<shape>-<dtype>.png in -work)")
	flag.StringVar(&o.levels, "concurrency", "1,2,4,8,16,32", "concurrent sequences of the scaling table")
	flag.IntVar(&o.rounds, "rounds", 3, "interleaved rounds")
	flag.IntVar(&o.promptTokens, "prompt-tokens", 32, "prompt tokens per sequence in the scaling table")
	flag.IntVar(&o.genTokens, "gen-tokens", 64, "generated tokens per sequence in the scaling table")
	flag.IntVar(&o.checkTokens, "check-tokens", 24, "greedy tokens compared across the engines")
	flag.IntVar(&o.prefill, "prefill-tokens", 512, "prompt of the prefill measurement (0: skip)")
	flag.BoolVar(&o.council, "council", true, "run the council round")
	flag.BoolVar(&o.torch, "torch", true, "check tokens against PyTorch too")
	flag.StringVar(&o.kv, "kv", "auto", "brokerd's KV cache type (auto, f32, bf16, f16, q8_0, q4_0; the daemon's --kv-cache-dtype); with f16 llama.cpp keeps its default F16, with q8_0 or q4_0 its keys and values are Q8_0 or Q4_0 too (with flash attention, which its quantized values need), else its default F16")
	flag.IntVar(&o.repeatTail, "repeat-tail", 0, "end every prompt with `N` copies of its last token, a pattern an input lookup (llama.cpp's predictor) can find; with -shape llama-12x1024-tied the output repeats that token")
	flag.IntVar(&o.spec, "spec", 0, "speculative decoding by prompt lookup, at most `N` guessed tokens a step: brokerd's SpecTokens (the daemon's --speculative-tokens), llama.cpp's InputLookupTokenPredictor per sequence; the single stream then also runs without, interleaved (0: off)")
	flag.BoolVar(&o.amxRelaid, "amx-relaid", false, "on a CPU with AMX, brokerd relays quantized weights by 16 rows as without AMX (onednn.Options.AMXRelaid; the daemon's --cpu-amx-relaid)")
	flag.Parse()
	// brokerd's OpenMP threads are all cores unless OMP_NUM_THREADS says
	// otherwise (libgomp reads it at load); llama.cpp gets the same count.
	o.threads = goruntime.NumCPU()
	if n, err := strconv.Atoi(os.Getenv("OMP_NUM_THREADS")); err == nil && n > 0 {
		o.threads = n
	}
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "llamacpp:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	shape, ok := shapes[o.shape]
	if !ok {
		return fmt.Errorf("-shape %q: want qwen2.5-0.5b, llama-12x1024, llama-12x1024-tied or small", o.shape)
	}
	if o.quant != "" && !slices.Contains(modelkit.FileTypes, o.quant) {
		return fmt.Errorf("-quant %q: want one of %v", o.quant, modelkit.FileTypes)
	}
	quantized := o.quant != "" && o.quant != "f32" && o.quant != "f16" && o.quant != "bf16"
	if quantized {
		o.torch = false // PyTorch would run the unquantized weights
	}
	if o.spec < 0 {
		return fmt.Errorf("-spec %d: want 0 (off) or more", o.spec)
	}
	if o.daemon && o.quant == "" {
		return errors.New("-daemon needs -quant (the daemon reads the GGUF file)")
	}
	var dt runtime.DType
	switch o.dtype {
	case "f32":
		dt = runtime.F32
	case "bf16":
		dt = runtime.BF16
	default:
		return fmt.Errorf("-dtype %q: want f32 or bf16", o.dtype)
	}
	var levels []int
	for _, f := range strings.Split(o.levels, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return fmt.Errorf("-concurrency %q: want positive numbers", o.levels)
		}
		levels = append(levels, n)
	}
	peers, err := benchkit.PeersDir()
	if err != nil {
		return err
	}
	o.peers = peers
	here := filepath.Join(peers, "llamacpp")
	if err := npmInstall(here); err != nil {
		return err
	}
	if o.torch {
		if err := benchkit.InstallTorch(); err != nil {
			return err
		}
	}
	dir, gguf, err := checkpoint(here, o, shape)
	if err != nil {
		return err
	}

	ctxLen := max(o.promptTokens+o.genTokens, 48+256, o.prefill+1, 48+o.checkTokens) + 16
	debug.FreeOSMemory()
	rssBefore := rssOf(os.Getpid())
	var m *llm.Model
	var repoRoot, repoName string
	if o.quant != "" {
		repoRoot, repoName, err = repoFor(o, gguf)
		if err == nil {
			m, err = loadGGUF(repoRoot, repoName, ctxLen)
		}
	} else {
		m, err = loadModel(dir, ctxLen)
	}
	if err != nil {
		return err
	}
	debug.FreeOSMemory()
	rssLoaded := rssOf(os.Getpid())
	dev, err := onednn.New(onednn.Options{AMXRelaid: o.amxRelaid}).Open(ctx, runtime.DeviceSpec{ID: "cpu:0", DType: dt})
	if err != nil {
		return err
	}
	defer dev.Close()
	maxSeqs := max(slices.Max(levels), 16)
	blocks := int64(maxSeqs) * int64((ctxLen+llm.DefaultBlockSize-1)/llm.DefaultBlockSize+1)
	// No prefix cache: rounds repeat their prompts, and llama.cpp's fresh
	// contexts recompute them; both engines must do the same work.
	kv, ok := map[string]runtime.DType{"auto": 0, "f32": runtime.F32, "bf16": runtime.BF16, "f16": runtime.F16, "q8_0": runtime.Q8_0, "q4_0": runtime.Q4_0}[o.kv]
	if !ok {
		return fmt.Errorf("-kv %q: auto, f32, bf16, f16, q8_0 or q4_0", o.kv)
	}
	cacheBytes := blocks * m.CacheBlockBytes(dev, kv, 0)
	eng, err := m.NewEngine(ctx, dev, llm.EngineOptions{CacheBytes: cacheBytes, MaxSeqs: maxSeqs, MaxStepTokens: 2048, DisablePrefixCache: true, KVDType: kv,
		MaxDrafts: maxDrafts(o.spec, maxSeqs)})
	if err != nil {
		return err
	}
	closeEngine := sync.OnceValue(eng.Close)
	defer closeEngine() //nolint:errcheck // closed again below when it matters
	debug.FreeOSMemory()
	rssEngine := rssOf(os.Getpid())
	fileBytes := int64(0)
	if fi, err := os.Stat(gguf); err == nil {
		fileBytes = fi.Size()
	}

	peer, err := startWorker(here)
	if err != nil {
		return err
	}
	defer peer.close()

	// The read bandwidth with vector loads (the limit's denominator), and
	// benchkit's scalar probe beside it for comparison with older figures.
	bw, vec := readBandwidth(o.threads)
	scalarBW := benchkit.ReadBandwidth()
	peak, err := benchkit.MatMulPeak(ctx, dev, dt)
	if err != nil {
		return err
	}
	probe := "AVX2 loads"
	if !vec {
		probe = "scalar loads (no AVX2)"
	}
	fmt.Printf("CPU: %s (%s), %d threads per engine; read bandwidth %.1f GB/s (%s, %d threads, 1 GiB; benchkit's scalar probe %.1f); matmul peak through the adapter (%s, 1024³) %.0f GFLOP/s\n",
		benchkit.CPUModel(), benchkit.CPUFlags(), o.threads, bw/1e9, probe, o.threads, scalarBW/1e9, dt, peak)
	// A decode step reads every weight once except the embedding table
	// (untied in these shapes), of which it reads one row.
	perToken := m.WeightBytes(dt) - int64(shape.Vocab*shape.Hidden)*int64(dt.Size())
	read := fmt.Sprintf("%s weights", dt)
	if o.quant != "" {
		// The bytes of the file's tensors (what a kernel on the quantized
		// weights reads), less the untied embedding table.
		if perToken, err = fileBytesPerToken(gguf); err != nil {
			return err
		}
		read = "the file's " + o.quant + " weights"
	}
	fmt.Printf("model: %s shape (%s, %d layers, hidden %d, %d/%d heads, intermediate %d, vocab %d); %s read per token %.0f MiB\n",
		o.shape, shape.Arch, shape.Layers, shape.Hidden, shape.Heads, shape.KVHeads, shape.Intermediate, shape.Vocab, read, float64(perToken)/(1<<20))
	fileType := strings.ToUpper(o.dtype)
	if o.quant != "" {
		fileType = strings.ToUpper(o.quant)
		fmt.Printf("file: %s, %.1f MiB; brokerd loads it through its repository (%s compute for activations; block-quantized matrices stay as stored)\n", gguf, float64(fileBytes)/(1<<20), dt)
	}
	fmt.Printf("brokerd resident memory: %.0f MiB before the load, %.0f after it (+%.0f), %.0f with the engine (+%.0f in all; %.2f× the file's %.0f MiB; KV cache reserved %.0f MiB)\n",
		mib(rssBefore), mib(rssLoaded), mib(rssLoaded-rssBefore), mib(rssEngine), mib(rssEngine-rssBefore),
		float64(rssEngine-rssBefore)/float64(max(fileBytes, 1)), mib(fileBytes), mib(cacheBytes))
	peerCache := "F16 (its default)"
	if k := peerKV(o.kv); k != "" {
		peerCache = k + " with flash attention"
	}
	fmt.Printf("llama.cpp: node-llama-cpp 3.21.1 prebuilt linux-x64 CPU build, %s GGUF, KV cache %s when timed; brokerd's KV cache %s\n",
		fileType, peerCache, eng.Options().KVDType)

	rng := rand.New(rand.NewPCG(7, 8))
	ordinary := min(150000, 128000, shape.Vocab) // ordinary tokens, below the specials
	prompt := func(n int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32(rng.IntN(ordinary))
		}
		for i := max(0, n-o.repeatTail); i < n-1; i++ {
			p[i] = p[n-1]
		}
		return p
	}

	// 1. The same greedy tokens, or nothing is timed.
	checks := []benchkit.Job{{Prompt: prompt(8), Out: o.checkTokens}, {Prompt: prompt(48), Out: o.checkTokens}}
	if quantized && kv == runtime.Q4_0 {
		// A Q4_0 cache's rounding alone moves these random-weight models'
		// greedy tokens past the near ties: on Qwen's shape llama.cpp's
		// own Q4_0 cache changed the fourth token of the first check from
		// its F32 cache's, and brokerd's and llama.cpp's Q4_0 runs differed
		// from the first token, at gaps of 0.65 and 0.16. So the engines
		// are held to each other with the default caches, as at -kv auto;
		// runtime/onednn's tests hold the Q4_0 cache to ggml's bits.
		fmt.Println("-kv q4_0: the greedy check runs brokerd's default cache against llama.cpp's F32 one")
		var ce *llm.Engine
		ce, err = m.NewEngine(ctx, dev, llm.EngineOptions{CacheBytes: 4 * int64(ctxLen/llm.DefaultBlockSize+2) * m.CacheBlockBytes(dev, 0, 0),
			MaxSeqs: 2, MaxStepTokens: 2048, DisablePrefixCache: true, MaxDrafts: maxDrafts(o.spec, 2)})
		if err == nil {
			err = agreeQuantized(ctx, o, m, ce, peer, gguf, checks, ctxLen)
			ce.Close()
		}
	} else if quantized {
		err = agreeQuantized(ctx, o, m, eng, peer, gguf, checks, ctxLen)
	} else {
		err = agree(ctx, o, m, eng, peer, gguf, dir, checks, ctxLen)
	}
	if err != nil {
		return err
	}
	if rss := rssOf(peer.cmd.Process.Pid); rss > 0 {
		fmt.Printf("llama.cpp resident memory with the file loaded (node included, one %d-token context): %.0f MiB\n", ctxLen, mib(rss))
	}

	// both runs jobs on brokerd (running at once, prefill chunk chunk,
	// guessing up to spec tokens a step), then on llama.cpp in a fresh,
	// warmed context of as many sequences (its predictor at spec).
	both := func(jobs []benchkit.Job, running, chunk, spec int) (benchkit.RoundResult, guesses, peerRun, error) {
		b, g, err := genRound(ctx, m, eng, jobs, running, chunk, spec)
		if err != nil {
			return b, g, peerRun{}, err
		}
		if err := peer.load(gguf, o.threads, ctxLen, running, peerKV(o.kv)); err != nil {
			return b, g, peerRun{}, err
		}
		p, err := peer.run(jobs, spec)
		return b, g, p, err
	}

	// 2. Scaling, interleaved. With -spec, every level runs with guesses,
	// and the single stream also without them (brokerd, llama.cpp without;
	// brokerd, llama.cpp with), for the decode rates both ways.
	type cell struct {
		broker, peer, brokerDecode, peerDecode []float64
		brokerOff, peerOff                     []float64 // the single stream's decode rates without guesses (-spec)
		brokerGuess, peerGuess                 guesses
	}
	table := make([]cell, len(levels))
	jobsAt := make([][]benchkit.Job, len(levels))
	for i, c := range levels {
		for range c {
			jobsAt[i] = append(jobsAt[i], benchkit.Job{Prompt: prompt(o.promptTokens), Out: o.genTokens})
		}
	}
	// brokerd's engine lives across the rounds; a short pass at each level
	// first creates its kernels for those batch sizes, as the peer's load
	// warms its context, so neither pays for that in the first round.
	for _, c := range levels {
		warm := make([]benchkit.Job, c)
		for j := range warm {
			warm[j] = benchkit.Job{Prompt: prompt(o.promptTokens), Out: 4}
		}
		if _, _, err := genRound(ctx, m, eng, warm, c, 512, o.spec); err != nil {
			return err
		}
	}
	decodeRate := func(start, end float64) float64 { return float64(o.genTokens-1) / (end - start) }
	peerPredictionMax := 0
	for r := range o.rounds {
		for i, c := range levels {
			if c == 1 && o.spec > 0 {
				b, _, p, err := both(jobsAt[i], c, 512, 0)
				if err != nil {
					return err
				}
				table[i].brokerOff = append(table[i].brokerOff, decodeRate(b.TTFT[0].Seconds(), b.End[0].Seconds()))
				table[i].peerOff = append(table[i].peerOff, decodeRate(p.TTFT[0], p.End[0]))
				fmt.Printf("round %d, %2d sequences without guesses: decode only brokerd %7.1f tokens/s, llama.cpp %7.1f\n", r+1, c, table[i].brokerOff[r], table[i].peerOff[r])
			}
			b, bg, p, err := both(jobsAt[i], c, 512, o.spec)
			if err != nil {
				return err
			}
			table[i].broker = append(table[i].broker, float64(c*o.genTokens)/b.Took.Seconds())
			table[i].peer = append(table[i].peer, float64(c*o.genTokens)/p.Seconds)
			if c == 1 {
				table[i].brokerDecode = append(table[i].brokerDecode, decodeRate(b.TTFT[0].Seconds(), b.End[0].Seconds()))
				table[i].peerDecode = append(table[i].peerDecode, decodeRate(p.TTFT[0], p.End[0]))
			}
			line := fmt.Sprintf("round %d, %2d sequences: brokerd %7.1f tokens/s, llama.cpp %7.1f", r+1, c, table[i].broker[r], table[i].peer[r])
			if o.spec > 0 {
				pg := peerGuesses(p)
				table[i].brokerGuess, table[i].peerGuess = table[i].brokerGuess.add(bg), table[i].peerGuess.add(pg)
				peerPredictionMax = p.PredictionMax
				line += fmt.Sprintf(" (guesses: brokerd %s, llama.cpp %s)", bg, pg)
			}
			fmt.Println(line)
		}
	}
	limit := bw / float64(perToken)
	specNote := ""
	if o.spec > 0 {
		specNote = fmt.Sprintf(", with speculative decoding (-spec %d)", o.spec)
	}
	fmt.Printf("\nscaling (%s%s): %d-token prompts, %d generated tokens each, generated tokens/s (prefill included), median of %d rounds\n", dt, specNote, o.promptTokens, o.genTokens, o.rounds)
	fmt.Printf("%11s %10s %10s %7s\n", "sequences", "brokerd", "llama.cpp", "ratio")
	var bs, ps benchkit.Series
	bs.Name, ps.Name = "brokerd "+o.dtype, "llama.cpp "+fileType+" GGUF"
	if o.quant != "" {
		bs.Name = "brokerd " + o.dtype + " from " + fileType + " GGUF"
	}
	if o.spec > 0 {
		bs.Name += fmt.Sprintf(", spec %d", o.spec)
		ps.Name += fmt.Sprintf(", spec %d", o.spec)
	}
	for i, c := range levels {
		ratios := make([]float64, o.rounds)
		for r := range ratios {
			ratios[r] = table[i].broker[r] / table[i].peer[r]
		}
		b, p := benchkit.Median(table[i].broker), benchkit.Median(table[i].peer)
		fmt.Printf("%11d %10.1f %10.1f %7.2f", c, b, p, benchkit.Median(ratios))
		if o.spec > 0 {
			fmt.Printf("   guesses taken: brokerd %s, llama.cpp %s", table[i].brokerGuess, table[i].peerGuess)
		}
		fmt.Println()
		bs.X, bs.Y = append(bs.X, float64(c)), append(bs.Y, b)
		ps.X, ps.Y = append(ps.X, float64(c)), append(ps.Y, p)
		if c != 1 {
			continue
		}
		bd, pd := benchkit.Median(table[i].brokerDecode), benchkit.Median(table[i].peerDecode)
		if o.spec == 0 {
			fmt.Printf("%11s single stream, decode only: brokerd %.1f tokens/s (%.2f of the bandwidth limit %.1f), llama.cpp %.1f; ratio %.2f\n",
				"", bd, bd/limit, limit, pd, bd/pd)
			continue
		}
		bo, po := benchkit.Median(table[i].brokerOff), benchkit.Median(table[i].peerOff)
		fmt.Printf("%11s single stream, decode only, without guesses: brokerd %.1f tokens/s (%.2f of the bandwidth limit %.1f), llama.cpp %.1f; ratio %.2f\n",
			"", bo, bo/limit, limit, po, bo/po)
		fmt.Printf("%11s single stream, decode only, with -spec %d: brokerd %.1f tokens/s (%.2f of the limit), llama.cpp %.1f; ratio %.2f\n",
			"", o.spec, bd, bd/limit, pd, bd/pd)
		noise := ""
		if table[i].brokerGuess.drafted == 0 && table[i].peerGuess.drafted == 0 {
			noise = "; neither engine guessed, so on / off is the rounds' noise"
		}
		fmt.Printf("%11s with guesses / without: brokerd %.2f, llama.cpp %.2f (medians of the rounds' rates); guesses taken over %d rounds: brokerd %s, llama.cpp %s (its predictor guesses up to %d)%s\n",
			"", bd/bo, pd/po, o.rounds, table[i].brokerGuess, table[i].peerGuess, peerPredictionMax, noise)
	}
	plot := o.plot
	if plot == "" {
		plot = filepath.Join(o.work, fmt.Sprintf("scaling-%s-%s.png", o.shape, strings.ToLower(fileType)))
	}
	title := fmt.Sprintf("%s shape, %s, %s: generated tokens/s by concurrent sequences", o.shape, fileType, benchkit.CPUModel())
	if err := benchkit.PlotPNG(plot, title, "concurrent sequences", "tokens/s", []benchkit.Series{bs, ps}); err != nil {
		return err
	}
	fmt.Println("plot:", plot)

	// 3. The council round.
	if o.council {
		var round []benchkit.Job
		useful := 0
		for i := range 16 {
			n := 16 + i*(256-16)/15
			round = append(round, benchkit.Job{Prompt: prompt(48), Out: n})
			useful += n
		}
		rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		var brate, prate, ratios []float64
		var bttft, pttft []float64
		for r := range o.rounds {
			b, bg, p, err := both(round, 16, 512, o.spec)
			if err != nil {
				return err
			}
			brate = append(brate, float64(useful)/b.Took.Seconds())
			prate = append(prate, float64(useful)/p.Seconds)
			ratios = append(ratios, brate[r]/prate[r])
			for i := range round {
				bttft = append(bttft, b.TTFT[i].Seconds())
				pttft = append(pttft, p.TTFT[i])
			}
			guessed := ""
			if o.spec > 0 {
				guessed = fmt.Sprintf(" (guesses: brokerd %s, llama.cpp %s)", bg, peerGuesses(p))
			}
			fmt.Printf("council round %d: brokerd %.1f useful tokens/s, llama.cpp %.1f%s\n", r+1, brate[r], prate[r], guessed)
		}
		fmt.Printf("\ncouncil (16 prompts of 48 tokens, answers 16-256, %d useful tokens): brokerd %.1f tokens/s, llama.cpp (16 sequences) %.1f; ratio %.2f (rounds %.2f)\n",
			useful, benchkit.Median(brate), benchkit.Median(prate), benchkit.Median(ratios), ratios)
		fmt.Printf("time to first token p50/p99: brokerd %.2f/%.2f s, llama.cpp %.2f/%.2f s\n", quantile(bttft, 0.5), quantile(bttft, 0.99), quantile(pttft, 0.5), quantile(pttft, 0.99))
	}

	// 4. Prefill.
	if o.prefill > 0 {
		job := []benchkit.Job{{Prompt: prompt(o.prefill), Out: 1}}
		var bt, pt []float64
		for range o.rounds {
			b, _, p, err := both(job, 1, o.prefill, o.spec) // one token: nothing to guess
			if err != nil {
				return err
			}
			bt, pt = append(bt, b.TTFT[0].Seconds()), append(pt, p.TTFT[0])
		}
		flops := prefillFLOPs(shape, m, o.prefill)
		b, p := benchkit.Median(bt), benchkit.Median(pt)
		fmt.Printf("\nprefill of %d tokens: brokerd %.3f s (%.0f GFLOP/s, %.2f of the %s matmul peak), llama.cpp %.3f s (%.0f GFLOP/s); ratio %.2f\n",
			o.prefill, b, flops/b/1e9, flops/b/1e9/peak, dt, p, flops/p/1e9, p/b)
	}

	// 5. The same file through the daemon.
	if o.daemon {
		// Free the in-process engine and model first: the daemon loads its own.
		peer.close()
		if err := closeEngine(); err != nil {
			return err
		}
		m = nil
		debug.FreeOSMemory()
		return daemonBench(o, repoRoot, repoName, fileBytes, limit)
	}
	return nil
}

// prefillFLOPs counts a prompt's multiply-adds twice: every weight matrix
// of the layers once per token, attention's two products over the causal
// triangle, and the LM head for the last token only.
func prefillFLOPs(s modelkit.LLM, m *llm.Model, n int) float64 {
	hd := s.HeadDim
	if hd == 0 {
		hd = s.Hidden / s.Heads
	}
	q, kv := s.Heads*hd, s.KVHeads*hd
	perLayer := float64(s.Hidden*(q+2*kv) + q*s.Hidden + 3*s.Hidden*s.Intermediate)
	attn := float64(s.Layers) * 2 * float64(s.Heads*hd) * float64(n) * float64(n+1) / 2
	return 2*float64(n)*perLayer*float64(s.Layers) + 2*attn + 2*float64(s.Hidden*m.VocabSize())
}

// agree runs the check prompts greedily through brokerd, llama.cpp (with an
// f32 KV cache when comparing f32, as brokerd keeps it) and PyTorch in
// float64, and fails unless each engine gives PyTorch's tokens. Where an
// engine leaves them at a step whose best two logits are within tieGap in
// float64 (a near tie that its own rounding may flip; the rest of the
// sequence then follows another token), it says so and counts as agreeing.
// With -spec both engines guess (checkWithout then compares their tokens
// with those they give without).
func agree(ctx context.Context, o options, m *llm.Model, eng *llm.Engine, peer *worker, gguf, dir string, jobs []benchkit.Job, ctxLen int) error {
	b, bg, err := genRound(ctx, m, eng, jobs, len(jobs), 512, o.spec)
	if err != nil {
		return err
	}
	kvCheck := ""
	if o.dtype == "f32" {
		kvCheck = "F32"
	}
	if err := peer.load(gguf, o.threads, ctxLen, 1, kvCheck); err != nil {
		return err
	}
	var p [][]int32
	var pg guesses
	for _, j := range jobs {
		r, err := peer.run([]benchkit.Job{j}, o.spec)
		if err != nil {
			return err
		}
		p = append(p, r.Tokens[0])
		pg = pg.add(peerGuesses(r))
	}
	if err := checkWithout(ctx, o, m, eng, peer, jobs, b.Tokens, p, bg, pg); err != nil {
		return err
	}
	if !o.torch {
		for i := range jobs {
			fmt.Printf("check %d (%d-token prompt): brokerd and llama.cpp agree on %d of %d tokens (PyTorch not run)\n", i+1, len(jobs[i].Prompt), prefix(b.Tokens[i], p[i]), o.checkTokens)
		}
		return nil
	}
	ref, err := torchTokens(o.peers, dir, jobs, o.checkTokens)
	if err != nil {
		return err
	}
	tieGap := 0.01 // f32: logits agree to ~1e-5 of their size
	if o.dtype == "bf16" {
		tieGap = 0.25 // bf16 activations: ~0.5% of the logits' size
	}
	var bad []string
	for i := range jobs {
		line := fmt.Sprintf("check %d (%d-token prompt), %d greedy tokens against PyTorch float64:", i+1, len(jobs[i].Prompt), o.checkTokens)
		for _, e := range []struct {
			name string
			toks []int32
		}{{"brokerd", b.Tokens[i]}, {"llama.cpp", p[i]}} {
			k := prefix(e.toks, ref.Tokens[i])
			switch {
			case k == len(ref.Tokens[i]):
				line += fmt.Sprintf(" %s all", e.name)
			case ref.Gaps[i][k] < tieGap:
				line += fmt.Sprintf(" %s first %d, then a near tie (gap %.2g)", e.name, k, ref.Gaps[i][k])
			default:
				line += fmt.Sprintf(" %s first %d (gap %.2g: NOT a tie)", e.name, k, ref.Gaps[i][k])
				bad = append(bad, fmt.Sprintf("check %d: %s %v, PyTorch %v", i+1, e.name, e.toks, ref.Tokens[i]))
			}
			line += ";"
		}
		fmt.Println(strings.TrimSuffix(line, ";"))
	}
	if bad != nil {
		return fmt.Errorf("an engine disagrees with PyTorch, nothing timed:\n%s", strings.Join(bad, "\n"))
	}
	return nil
}

// checkWithout, with -spec, runs the check prompts through both engines
// without guesses (llama.cpp's context as loaded for the check) and says
// how far the tokens with guesses, bOn and pOn, follow those without, and
// how the guesses went. Guessing does not change what is sampled, only
// how many rows a step runs, so they differ at most where a near tie
// rounds the other way.
func checkWithout(ctx context.Context, o options, m *llm.Model, eng *llm.Engine, peer *worker, jobs []benchkit.Job, bOn, pOn [][]int32, bg, pg guesses) error {
	if o.spec == 0 {
		return nil
	}
	b, _, err := genRound(ctx, m, eng, jobs, len(jobs), 512, 0)
	if err != nil {
		return err
	}
	var p [][]int32
	for _, j := range jobs {
		r, err := peer.run([]benchkit.Job{j}, 0)
		if err != nil {
			return err
		}
		p = append(p, r.Tokens[0])
	}
	fmt.Printf("-spec %d: the check's tokens with guesses follow those without for brokerd %s, llama.cpp %s; guesses: brokerd %s, llama.cpp %s\n",
		o.spec, sameTokens(bOn, b.Tokens), sameTokens(pOn, p), bg, pg)
	return nil
}

func prefix(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func quantile(v []float64, q float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(q*float64(len(s))))-1)]
}

type torchRef struct {
	Tokens [][]int32
	Gaps   [][]float64
}

func torchTokens(peers, dir string, jobs []benchkit.Job, n int) (torchRef, error) {
	req := map[string]any{"n": n}
	var prompts [][]int32
	for _, j := range jobs {
		prompts = append(prompts, j.Prompt)
	}
	req["prompts"] = prompts
	in, _ := json.Marshal(req)
	cmd := exec.Command(benchkit.Python(), filepath.Join(peers, "llm_torch.py"), dir)
	cmd.Stdin = strings.NewReader(string(in))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	var ans torchRef
	if err == nil {
		err = json.Unmarshal(out, &ans)
	}
	if err == nil && len(ans.Tokens) != len(jobs) {
		err = fmt.Errorf("%d answers for %d prompts", len(ans.Tokens), len(jobs))
	}
	if err != nil {
		return ans, fmt.Errorf("llm_torch.py: %w", err)
	}
	return ans, nil
}

// checkpoint writes the random checkpoint (stored bf16, so the f32 and
// bf16 runs read the same values) and its GGUF into -work, unless a
// previous run left them there.
func checkpoint(here string, o options, s modelkit.LLM) (string, string, error) {
	ftype := o.dtype
	if o.quant != "" {
		ftype = o.quant
	}
	s.DType, s.Seed = "bf16", 1
	s.TokenizerDir = filepath.Join(here, "..", "..", "..", "runtime", "models", "tokenizer", "bpe", "testdata", "qwen3")
	if s.Arch == "llama" {
		s.TokenizerDir = filepath.Join(filepath.Dir(s.TokenizerDir), "llama3")
	}
	dir := filepath.Join(o.work, o.shape, "1")
	gguf := filepath.Join(o.work, o.shape+"-"+ftype+".gguf")
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err != nil {
		fmt.Printf("writing the %s checkpoint to %s...\n", o.shape, dir)
		if _, err := modelkit.WriteLLM(dir, s); err != nil {
			return "", "", err
		}
		_ = os.Remove(gguf)
	}
	if _, err := os.Stat(gguf); err != nil {
		fmt.Printf("writing %s...\n", gguf)
		// ggml's own quantizer: the libggml-base.so node-llama-cpp ships.
		lib, err := ggmlref.Open(filepath.Join(here, "node_modules", "@node-llama-cpp", "linux-x64", "bins", "linux-x64", "libggml-base.so"))
		if err != nil {
			return "", "", err
		}
		// Written aside and renamed: a run killed while writing leaves no
		// truncated file for the next run to find.
		if _, err := modelkit.WriteGGUFQuantized(dir, gguf+".tmp", ftype, lib.Quantize); err != nil {
			return "", "", err
		}
		if err := os.Rename(gguf+".tmp", gguf); err != nil {
			return "", "", err
		}
	}
	return dir, gguf, nil
}

func loadModel(dir string, ctxLen int) (*llm.Model, error) {
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	st, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		return nil, err
	}
	defer st.Close()
	w := map[string]models.Tensor{}
	for _, name := range st.Names() {
		if w[name], err = st.Float32(name); err != nil {
			return nil, err
		}
	}
	return llm.NewModel(cfg, w, llm.ModelOptions{Name: "bench", Version: 1, MaxContext: ctxLen})
}

// npmInstall installs node-llama-cpp from the lock, without its optional
// GPU and other-platform binaries and without its postinstall (which would
// try to download or build llama.cpp), under a file lock: the test and a
// benchmark may start at once.
func npmInstall(here string) error {
	installed := func() bool {
		for _, p := range []string{"node-llama-cpp/package.json", "@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so"} {
			if _, err := os.Stat(filepath.Join(here, "node_modules", p)); err != nil {
				return false
			}
		}
		return true
	}
	if installed() {
		return nil
	}
	lock, err := os.OpenFile(filepath.Join(here, ".npm-ci.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing releases it too
	if installed() {
		return nil
	}
	if _, err := exec.LookPath("npm"); err != nil {
		return errors.New("node-llama-cpp is not installed in " + here + " and npm is missing (make deps installs Node.js and npm)")
	}
	fmt.Fprintln(os.Stderr, "installing node-llama-cpp 3.21.1 (npm ci in bench/peers/llamacpp)...")
	cmd := exec.Command("npm", "ci", "--omit=optional", "--ignore-scripts", "--no-audit", "--no-fund")
	cmd.Dir = here
	cmd.Env = append(os.Environ(), "NODE_LLAMA_CPP_SKIP_DOWNLOAD=true")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("npm ci in %s: %w", here, err)
	}
	if !installed() {
		return errors.New("npm ci did not install node-llama-cpp in " + here)
	}
	return nil
}

// worker is llama.cpp's side: worker.mjs, one JSON line per request.
type worker struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

type peerRun struct {
	Seconds    float64
	TTFT, End  []float64
	Tokens     [][]int32
	Error      string
	ContextLen int `json:"contextSize"`
	// With meta: per sequence and step, the gap between llama.cpp's best
	// two logits and its runner-up token; the tokens each sequence held
	// at the end.
	Gaps    [][]float64
	Second  [][]int32
	Context [][]int32
	// Near: per sequence and step, llama.cpp's best four tokens as
	// [token, its logit's gap to the best].
	Near [][][][2]float64
	// With spec: per sequence its predictor's counts, and the most
	// tokens the predictor guesses at once.
	Predictions   []peerPredictions
	PredictionMax int
}

// nearGap is llama.cpp's gap from its best logit to token tok's at one
// step, when tok is among the best four it reported.
func nearGap(near [][2]float64, tok int32) (float64, bool) {
	for _, e := range near {
		if int32(e[0]) == tok {
			return e[1], true
		}
	}
	return 0, false
}

func startWorker(here string) (*worker, error) {
	cmd := exec.Command("node", filepath.Join(here, "worker.mjs"))
	cmd.Dir = here
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &worker{cmd: cmd, in: in, out: bufio.NewReaderSize(out, 1<<20)}, nil
}

func (w *worker) call(req any) (peerRun, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return peerRun{}, err
	}
	if _, err := w.in.Write(append(b, '\n')); err != nil {
		return peerRun{}, fmt.Errorf("llama.cpp worker: %w", err)
	}
	line, err := w.out.ReadBytes('\n')
	if err != nil {
		return peerRun{}, fmt.Errorf("llama.cpp worker: %w", err)
	}
	var r peerRun
	if err := json.Unmarshal(line, &r); err != nil {
		return r, fmt.Errorf("llama.cpp worker: %w", err)
	}
	if r.Error != "" {
		return r, fmt.Errorf("llama.cpp worker: %s", r.Error)
	}
	return r, nil
}

// load opens path in a fresh context; kv is its KV cache's ggml type
// (F32, Q8_0), or "" for node-llama-cpp's default (F16).
func (w *worker) load(path string, threads, ctxLen, seqs int, kv string) error {
	_, err := w.call(map[string]any{"op": "load", "path": path, "threads": threads, "contextSize": ctxLen, "sequences": seqs, "kvType": kv})
	return err
}

// peerKV is llama.cpp's cache type for -kv: Q8_0 or Q4_0 for q8_0 or
// q4_0, else its default.
func peerKV(kv string) string {
	switch kv {
	case "q8_0", "q4_0":
		return strings.ToUpper(kv)
	}
	return ""
}

// run runs jobs, each sequence guessing up to spec tokens (0: none).
func (w *worker) run(jobs []benchkit.Job, spec int) (peerRun, error) {
	return w.runMeta(jobs, false, spec)
}

// runMeta is run, with llama.cpp's logit gaps and runner-up tokens (and
// the sequences' tokens at the end) when meta is set.
func (w *worker) runMeta(jobs []benchkit.Job, meta bool, spec int) (peerRun, error) {
	prompts, n := make([][]int32, len(jobs)), make([]int, len(jobs))
	for i, j := range jobs {
		prompts[i], n[i] = j.Prompt, j.Out
	}
	r, err := w.call(map[string]any{"op": "run", "prompts": prompts, "n": n, "meta": meta, "spec": spec})
	if err == nil && len(r.Tokens) != len(jobs) {
		err = fmt.Errorf("llama.cpp worker: %d answers for %d prompts", len(r.Tokens), len(jobs))
	}
	for i := range r.Tokens {
		if err == nil && len(r.Tokens[i]) != jobs[i].Out {
			err = fmt.Errorf("llama.cpp worker: sequence %d stopped after %d of %d tokens", i, len(r.Tokens[i]), jobs[i].Out)
		}
		if err == nil && meta && (len(r.Gaps) != len(jobs) || len(r.Gaps[i]) != jobs[i].Out || len(r.Second[i]) != jobs[i].Out ||
			len(r.Near) != len(jobs) || len(r.Near[i]) != jobs[i].Out) {
			err = fmt.Errorf("llama.cpp worker: sequence %d: no gap for every token", i)
		}
	}
	return r, err
}

func (w *worker) close() {
	_ = w.in.Close()
	_ = w.cmd.Wait()
}
