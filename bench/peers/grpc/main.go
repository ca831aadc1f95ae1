// Command grpc measures what serving costs: brokerd's encoder through gRPC
// (brokerctl bench's closed-loop clients pinned to one core, brokerd to the
// other, with taskset) over the same forward in process on one core at the
// batch size brokerd ran, on the same texts, in interleaved rounds.
//
//	make build && go run ./bench/peers/grpc -model minilm -text-bytes 72 -rounds 3
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/client"
	"github.com/brokerd/brokerd/cmd/brokerctl/cli"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/repo"
	"github.com/brokerd/brokerd/runtime/onednn"
)

func main() {
	model := flag.String("model", "minilm", "model shape: minilm or base")
	textBytes := flag.Int("text-bytes", 72, "bench text size in bytes (72: about 16 tokens)")
	concurrency := flag.Int("concurrency", 64, "closed-loop gRPC clients")
	rounds := flag.Int("rounds", 3, "interleaved rounds")
	seconds := flag.Float64("seconds", 10, "measured seconds per phase and round")
	bin := flag.String("bin", "bin", "directory of brokerd and brokerctl (make build)")
	inProcess := flag.String("in-process", "", "internal: run the in-process phase on this checkpoint directory")
	batch := flag.Int("batch", 32, "internal: in-process batch size")
	flag.Parse()
	var err error
	if *inProcess != "" {
		err = runInProcess(*inProcess, *textBytes, *concurrency, *batch, *seconds)
	} else {
		err = run(*model, *textBytes, *concurrency, *rounds, *seconds, *bin)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpc:", err)
		os.Exit(1)
	}
}

// texts are the texts bench's clients send at this size (one per client).
func texts(size, clients int) []string {
	out := make([]string, clients)
	for w := range out {
		out[w] = cli.BenchText(1, uint64(clients), uint64(w), size)
	}
	return out
}

// runInProcess prints the in-process items/s of dir's encoder on this
// process's CPUs (taskset by the parent) at batch size batch.
func runInProcess(dir string, size, clients, batch int, seconds float64) error {
	ctx := context.Background()
	r, err := repo.Open(filepath.Dir(filepath.Dir(dir)), nil)
	if err != nil {
		return err
	}
	l, err := r.Load(ctx, filepath.Base(filepath.Dir(dir)), 1)
	if err != nil {
		return err
	}
	m, err := l.Model()
	if err != nil {
		return err
	}
	dev, err := onednn.New(onednn.Options{}).Open(ctx, runtime.DeviceSpec{Threads: goruntime.NumCPU(), DType: runtime.F32})
	if err != nil {
		return err
	}
	defer dev.Close()
	rep, err := m.NewReplica(ctx, dev, batch)
	if err != nil {
		return err
	}
	defer rep.Close()
	var items []any
	tokens := 0
	for _, t := range texts(size, clients) {
		ids, types, err := l.Tokenizer.Encode(t, "", 512, true)
		if err != nil {
			return err
		}
		tokens += len(ids)
		items = append(items, models.TextInput{IDs: ids, TypeIDs: types, Normalize: true})
	}
	for len(items) < batch {
		items = append(items, items...)
	}
	items = items[:batch]
	if _, err := rep.Execute(ctx, items); err != nil {
		return err
	}
	n := 0
	start := time.Now()
	for time.Since(start).Seconds() < seconds {
		if _, err := rep.Execute(ctx, items); err != nil {
			return err
		}
		n += len(items)
	}
	fmt.Printf("%f %f\n", float64(n)/time.Since(start).Seconds(), float64(tokens)/float64(clients))
	return nil
}

func run(model string, size, clients, rounds int, seconds float64, bin string) error {
	shape, ok := modelkit.EncoderShapes[model]
	if !ok {
		return fmt.Errorf("unknown model %q (minilm, base)", model)
	}
	if goruntime.NumCPU() < 2 {
		return errors.New("needs 2 CPUs: one for brokerd, one for its clients")
	}
	brokerd, err := filepath.Abs(filepath.Join(bin, "brokerd"))
	if err != nil {
		return err
	}
	brokerctl := filepath.Join(filepath.Dir(brokerd), "brokerctl")
	for _, b := range []string{brokerd, brokerctl} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%w (make build)", err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "brokerd-grpc")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	dir := filepath.Join(work, model, "1")
	if err := modelkit.WriteBERT(dir, shape); err != nil {
		return err
	}
	socket := filepath.Join(work, "brokerd.sock")
	d := exec.Command("taskset", "-c", "0", brokerd, "--socket", socket, "--state-dir", filepath.Join(work, "state"),
		"--model-repo", work, "--load-models", model, "--metrics-listen", "", "--log-level", "warn")
	d.Stderr = os.Stderr
	if err := d.Start(); err != nil {
		return err
	}
	defer func() { d.Process.Signal(os.Interrupt); d.Wait() }() //nolint:errcheck // best effort at exit
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, client.WithSocket(socket))
	if err != nil {
		return err
	}
	defer c.Close()
	for c.Healthy(ctx) != nil {
		if ctx.Err() != nil {
			return errors.New("brokerd did not become ready")
		}
		time.Sleep(100 * time.Millisecond)
	}

	fmt.Printf("%s (%d layers × %d), bench texts of %d bytes, %d clients; brokerd on CPU 0, clients on CPU 1, in-process on CPU 0\n",
		model, shape.Layers, shape.Hidden, size, clients)
	fmt.Printf("%-6s %14s %11s %16s %8s\n", "round", "gRPC items/s", "mean batch", "in-process", "ratio")
	var ratios []float64
	for round := 1; round <= rounds; round++ {
		var out bytes.Buffer
		b := exec.Command("taskset", "-c", "1", brokerctl, "--socket", socket, "bench", "--model", model,
			"--text-bytes", strconv.Itoa(size), "--concurrency", strconv.Itoa(clients),
			"--duration", fmt.Sprintf("%gs", seconds), "--warmup", "2s", "--json")
		b.Stdout, b.Stderr = &out, os.Stderr
		if err := b.Run(); err != nil {
			return fmt.Errorf("brokerctl bench: %w", err)
		}
		var rep struct {
			Levels []struct {
				Encode struct {
					ItemsPerSecond float64 `json:"items_per_second"`
					MeanBatchSize  float64 `json:"mean_batch_size"`
				} `json:"encode"`
			} `json:"levels"`
		}
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil || len(rep.Levels) != 1 {
			return fmt.Errorf("brokerctl bench --json: %v", err)
		}
		g := rep.Levels[0].Encode
		batch := max(1, int(g.MeanBatchSize+0.5))
		var ip bytes.Buffer
		p := exec.Command("taskset", "-c", "0", self, "-in-process", dir, "-text-bytes", strconv.Itoa(size),
			"-concurrency", strconv.Itoa(clients), "-batch", strconv.Itoa(batch), "-seconds", fmt.Sprint(seconds))
		p.Stdout, p.Stderr = &ip, os.Stderr
		if err := p.Run(); err != nil {
			return fmt.Errorf("in-process phase: %w", err)
		}
		f := strings.Fields(ip.String())
		if len(f) != 2 {
			return fmt.Errorf("in-process phase printed %q", ip.String())
		}
		inRate, _ := strconv.ParseFloat(f[0], 64)
		tokens, _ := strconv.ParseFloat(f[1], 64)
		ratios = append(ratios, g.ItemsPerSecond/inRate)
		fmt.Printf("%-6d %14.1f %11.1f %9.1f (b=%d) %8.2f   (%.1f tokens per text)\n", round, g.ItemsPerSecond, g.MeanBatchSize, inRate, batch, ratios[len(ratios)-1], tokens)
	}
	s := slices.Clone(ratios)
	sort.Float64s(s)
	fmt.Printf("gRPC over in-process, median of %d rounds: %.2f\n", rounds, s[len(s)/2])
	return nil
}
