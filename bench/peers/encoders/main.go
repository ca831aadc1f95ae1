// Command encoders compares brokerd's in-process BERT encoder with ONNX
// Runtime on the same random weights, in interleaved rounds on this
// machine: the peer table of bench/RESULTS.md.
//
// For each model shape (MiniLM-L6: 6 layers × 384; BERT-base: 12 × 768) it
// writes a random checkpoint (bench/modelkit, 30,522-token vocabulary),
// exports it to ONNX with an independent PyTorch BERT (bench/peers/bert.py,
// Debian's python3-torch), checks brokerd's and ONNX Runtime's embeddings
// agree with PyTorch's float64 forward, then times both at every sequence
// length and batch, alternating brokerd and ORT within each round. ORT runs
// in node (onnxruntime-node 1.30.0, bench/peers/package-lock.json) with the
// same number of intra-op threads as brokerd's device.
//
//	make build && go run ./bench/peers/encoders            # after: cd bench/peers && npm ci (done for you)
//	go run ./bench/peers/encoders -models minilm -seqs 16 -batches 1,8 -rounds 3 -seconds 2
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/brokerd/brokerd/bench/benchkit"
	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/repo"
	"github.com/brokerd/brokerd/runtime/onednn"
)

func main() {
	modelsFlag := flag.String("models", "minilm,base", "model shapes: minilm (6×384), base (12×768)")
	seqsFlag := flag.String("seqs", "16,128", "sequence lengths (tokens, with [CLS] and [SEP])")
	batchesFlag := flag.String("batches", "1,8,32", "batch sizes")
	rounds := flag.Int("rounds", 3, "interleaved rounds (brokerd, ORT, brokerd, ORT, ...)")
	seconds := flag.Float64("seconds", 2, "timed seconds per engine, shape and round")
	threads := flag.Int("threads", goruntime.NumCPU(), "threads of each engine (oneDNN device and ORT intra-op)")
	dtype := flag.String("dtype", "f32", "brokerd's compute dtype: f32 or bf16 (ORT runs f32)")
	work := flag.String("work", "", "working directory for checkpoints and ONNX files (default: a temporary one)")
	flag.Parse()
	if err := run(*modelsFlag, ints(*seqsFlag), ints(*batchesFlag), *rounds, *seconds, *threads, *dtype, *work); err != nil {
		fmt.Fprintln(os.Stderr, "encoders:", err)
		os.Exit(1)
	}
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "encoders: %q is not a list of positive integers\n", s)
			os.Exit(2)
		}
		out = append(out, n)
	}
	return out
}

// setup installs the peers when missing: onnxruntime-node from the lock
// file (its install script, which fetches GPU extras, skipped) and
// python3-torch from Debian.
func setup(peers string) error {
	if _, err := os.Stat(filepath.Join(peers, "node_modules", "onnxruntime-node", "package.json")); err != nil {
		fmt.Println("installing onnxruntime-node (npm ci in bench/peers)...")
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir, cmd.Stdout, cmd.Stderr = peers, os.Stdout, os.Stderr
		cmd.Env = append(os.Environ(), "ONNXRUNTIME_NODE_INSTALL=skip")
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("npm ci: %w", err)
		}
	}
	return benchkit.InstallTorch()
}

// ortWorker is the node process running ONNX Runtime.
type ortWorker struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startORT(peers, model string, threads int) (*ortWorker, error) {
	cmd := exec.Command("node", "ort_worker.mjs", model, strconv.Itoa(threads))
	cmd.Dir, cmd.Stderr = peers, os.Stderr
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
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<28)
	return &ortWorker{cmd: cmd, in: in, out: sc}, nil
}

func (w *ortWorker) call(cmd map[string]any, reply any) error {
	b, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	if _, err := w.in.Write(append(b, '\n')); err != nil {
		return err
	}
	if !w.out.Scan() {
		return fmt.Errorf("onnxruntime worker: %v", w.out.Err())
	}
	return json.Unmarshal(w.out.Bytes(), reply)
}

func (w *ortWorker) close() {
	w.in.Close()
	w.cmd.Wait() //nolint:errcheck // it exits when its stdin closes
}

type row struct {
	model         string
	seq, batch    int
	flops         float64
	broker, ort   []float64 // items/s per round
	maxDiffBroker float64
	maxDiffORT    float64
}

func run(modelNames string, seqs, batches []int, rounds int, seconds float64, threads int, dtype, work string) error {
	peers, err := benchkit.PeersDir()
	if err != nil {
		return err
	}
	if err := setup(peers); err != nil {
		return err
	}
	if work == "" {
		if work, err = os.MkdirTemp("", "brokerd-peers"); err != nil {
			return err
		}
		defer os.RemoveAll(work)
	}
	dt := runtime.F32
	if dtype == "bf16" {
		dt = runtime.BF16
	}
	ctx := context.Background()
	dev, err := onednn.New(onednn.Options{}).Open(ctx, runtime.DeviceSpec{Threads: threads, DType: dt})
	if err != nil {
		return fmt.Errorf("oneDNN device: %w", err)
	}
	defer dev.Close()
	peak, err := benchkit.MatMulPeak(ctx, dev, runtime.F32)
	if err != nil {
		return err
	}
	fmt.Printf("CPU: %s; %d threads each; sgemm peak through the adapter (1024³, best of 5): %.1f GFLOP/s\n", benchkit.CPUModel(), threads, peak)

	var rows []*row
	for _, name := range strings.Split(modelNames, ",") {
		b, ok := modelkit.EncoderShapes[name]
		if !ok {
			return fmt.Errorf("unknown model %q (minilm, base)", name)
		}
		dir := filepath.Join(work, name, "1")
		if err := modelkit.WriteBERT(dir, b); err != nil {
			return err
		}
		onnx := filepath.Join(work, name+".onnx")
		exp := exec.Command(benchkit.Python(), filepath.Join(peers, "bert.py"), "export", dir, onnx)
		if out, err := exp.CombinedOutput(); err != nil {
			return fmt.Errorf("export %s to ONNX: %v\n%s", name, err, out)
		}
		r, err := repo.Open(work, nil)
		if err != nil {
			return err
		}
		l, err := r.Load(ctx, name, 1)
		if err != nil {
			return err
		}
		m, err := l.Model()
		if err != nil {
			return err
		}
		rep, err := m.NewReplica(ctx, dev, slices.Max(batches))
		if err != nil {
			return err
		}
		ort, err := startORT(peers, onnx, threads)
		if err != nil {
			rep.Close()
			return err
		}
		rng := rand.New(rand.NewPCG(uint64(len(name)), 7))
		cases := map[[2]int][][]int32{}
		for _, seq := range seqs {
			for _, batch := range batches {
				ids := make([][]int32, batch)
				for i := range ids {
					ids[i] = make([]int32, seq)
					for j := range ids[i] {
						ids[i][j] = int32(5 + rng.IntN(b.Vocab-5))
					}
					ids[i][0], ids[i][seq-1] = 2, 3 // [CLS] ... [SEP]
				}
				cases[[2]int{seq, batch}] = ids
				rw := &row{model: name, seq: seq, batch: batch, flops: forwardFLOPs(b, batch, seq)}
				if err := agree(ctx, rep, ort, peers, dir, ids, rw); err != nil {
					rep.Close()
					ort.close()
					return fmt.Errorf("%s seq %d batch %d: %w", name, seq, batch, err)
				}
				rows = append(rows, rw)
			}
		}
		for round := range rounds {
			for _, rw := range rows {
				if rw.model != name {
					continue
				}
				ids := cases[[2]int{rw.seq, rw.batch}]
				br, err := timeBroker(ctx, rep, ids, seconds)
				if err != nil {
					return err
				}
				var reply struct {
					Iters   int     `json:"iters"`
					Seconds float64 `json:"seconds"`
				}
				if err := ort.call(map[string]any{"cmd": "time", "ids": ids, "seconds": seconds}, &reply); err != nil {
					return err
				}
				rw.broker = append(rw.broker, br)
				rw.ort = append(rw.ort, float64(reply.Iters*rw.batch)/reply.Seconds)
				fmt.Fprintf(os.Stderr, "round %d %s seq %d batch %d: brokerd %.1f, ORT %.1f items/s\n", round+1, name, rw.seq, rw.batch, br, rw.ort[len(rw.ort)-1])
			}
		}
		rep.Close()
		ort.close()
	}
	fmt.Printf("brokerd %s in process vs ONNX Runtime 1.30.0 f32 (onnxruntime-node), items/s, median of %d interleaved rounds\n", dtype, rounds)
	fmt.Printf("%-7s %4s %5s %12s %12s %8s %11s %11s %9s %9s\n", "model", "seq", "batch", "brokerd", "ORT", "ratio", "brokerd GF", "ORT GF", "b/peak", "diff")
	for _, rw := range rows {
		ratios := make([]float64, len(rw.broker))
		for i := range ratios {
			ratios[i] = rw.broker[i] / rw.ort[i]
		}
		b, o := benchkit.Median(rw.broker), benchkit.Median(rw.ort)
		bg, og := b/float64(rw.batch)*rw.flops/1e9, o/float64(rw.batch)*rw.flops/1e9
		fmt.Printf("%-7s %4d %5d %12.1f %12.1f %8.2f %11.1f %11.1f %9.2f %9.1e\n", rw.model, rw.seq, rw.batch, b, o, benchkit.Median(ratios), bg, og, bg/peak, max(rw.maxDiffBroker, rw.maxDiffORT))
	}
	return nil
}

// agree checks brokerd's and ORT's embeddings of ids against PyTorch's
// float64 forward, on the batch's first two rows (Debian's torch runs on
// the reference BLAS: a whole BERT-base batch in float64 takes minutes);
// brokerd and ORT are also compared with each other on every row.
func agree(ctx context.Context, rep models.Replica, ort *ortWorker, peers, dir string, ids [][]int32, rw *row) error {
	ref := exec.Command(benchkit.Python(), filepath.Join(peers, "bert.py"), "embed", dir)
	in, _ := json.Marshal(ids[:min(2, len(ids))])
	ref.Stdin = strings.NewReader(string(in))
	out, err := ref.Output()
	if err != nil {
		return fmt.Errorf("PyTorch reference: %w", err)
	}
	var want [][]float64
	if err := json.Unmarshal(out, &want); err != nil {
		return err
	}
	got, err := executeBroker(ctx, rep, ids)
	if err != nil {
		return err
	}
	var ortOut struct {
		Out [][]float64 `json:"out"`
	}
	if err := ort.call(map[string]any{"cmd": "run", "ids": ids}, &ortOut); err != nil {
		return err
	}
	for i := range want {
		for j := range want[i] {
			rw.maxDiffBroker = max(rw.maxDiffBroker, math.Abs(float64(got[i][j])-want[i][j]))
			rw.maxDiffORT = max(rw.maxDiffORT, math.Abs(ortOut.Out[i][j]-want[i][j]))
		}
	}
	for i := range got {
		for j := range got[i] {
			rw.maxDiffBroker = max(rw.maxDiffBroker, math.Abs(float64(got[i][j])-ortOut.Out[i][j]))
		}
	}
	// Unit vectors: f32 engines agree with float64 to about 1e-6; bf16
	// products to about 1e-2.
	if tol := 2e-2; rw.maxDiffBroker > tol || rw.maxDiffORT > tol {
		return fmt.Errorf("outputs differ from PyTorch's float64: brokerd %.2e, ORT %.2e", rw.maxDiffBroker, rw.maxDiffORT)
	}
	return nil
}

func executeBroker(ctx context.Context, rep models.Replica, ids [][]int32) ([][]float32, error) {
	items := make([]any, len(ids))
	for i, x := range ids {
		items[i] = models.TextInput{IDs: x, TypeIDs: make([]int32, len(x)), Normalize: true}
	}
	out, err := rep.Execute(ctx, items)
	if err != nil {
		return nil, err
	}
	res := make([][]float32, len(out))
	for i, o := range out {
		v, ok := o.(models.Output)
		if !ok {
			return nil, fmt.Errorf("brokerd returned %T for an embedding", o)
		}
		res[i] = v.Values
	}
	return res, nil
}

func timeBroker(ctx context.Context, rep models.Replica, ids [][]int32, seconds float64) (float64, error) {
	if _, err := executeBroker(ctx, rep, ids); err != nil { // warm-up: this shape's primitives
		return 0, err
	}
	iters := 0
	start := time.Now()
	for time.Since(start).Seconds() < seconds {
		if _, err := executeBroker(ctx, rep, ids); err != nil {
			return 0, err
		}
		iters++
	}
	return float64(iters*len(ids)) / time.Since(start).Seconds(), nil
}

// forwardFLOPs counts a forward pass's multiply-adds ×2: the projections
// and feed-forward per token, and attention's two batched products.
func forwardFLOPs(b modelkit.BERT, batch, seq int) float64 {
	h, in := float64(b.Hidden), float64(b.Intermediate)
	tokens := float64(batch * seq)
	return float64(b.Layers) * (2*tokens*(4*h*h+2*h*in) + 4*float64(batch)*float64(seq)*float64(seq)*h)
}

// matmulPeak is a 1024³ f32 matmul through the adapter, best of 5 rounds.
