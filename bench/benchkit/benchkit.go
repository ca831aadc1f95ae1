// Package benchkit holds what brokerd's benchmark commands share: the
// machine's CPU and its measured limits (copy bandwidth, the adapter's
// matmul peak), medians, and a generation round through the scheduler's
// continuous batching and the LLM engine, as brokerd runs it.
package benchkit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/runtime"
)

// cpu is the host CPU as brokerd's detector sees it (nil if it finds none).
func cpu() *detect.CPUInfo {
	res := detect.NewCPUDetector(detect.DefaultRoots()).Detect(context.Background())
	if len(res.Devices) == 0 || res.Devices[0].CPU == nil {
		return nil
	}
	return res.Devices[0].CPU
}

// CPUModel is the CPU's model name ("unknown" if unreadable).
func CPUModel() string {
	if c := cpu(); c != nil && c.ModelName != "" {
		return c.ModelName
	}
	return "unknown"
}

// CPUFlags lists which of the flags that matter to the adapter's kernels
// (AVX-512, bf16, AMX) the CPU has.
func CPUFlags() string {
	c := cpu()
	if c == nil {
		return "unknown"
	}
	var have []string
	for _, f := range []string{"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"} {
		if slices.Contains(c.Flags, f) {
			have = append(have, f)
		}
	}
	return strings.Join(have, " ")
}

// ReadBandwidth measures memory read bandwidth the way a decode step
// reads its weights: every core (GOMAXPROCS goroutines) summing its share of
// a buffer far larger than the caches. Bytes read per second, best of five.
// (A single-threaded copy, which this replaced, reads with one core and
// writes as much as it reads, so it understated what 2 cores stream.)
func ReadBandwidth() float64 {
	const n = 512 << 20 / 8
	buf := make([]uint64, n)
	for i := range buf {
		buf[i] = uint64(i)
	}
	workers := goruntime.GOMAXPROCS(0)
	best := 0.0
	var sink atomic.Uint64
	for range 5 {
		var wg sync.WaitGroup
		t := time.Now()
		for w := range workers {
			part := buf[w*n/workers : (w+1)*n/workers]
			wg.Add(1)
			go func() {
				defer wg.Done()
				var s0, s1, s2, s3 uint64
				for i := 0; i+4 <= len(part); i += 4 {
					s0 += part[i]
					s1 += part[i+1]
					s2 += part[i+2]
					s3 += part[i+3]
				}
				sink.Add(s0 + s1 + s2 + s3)
			}()
		}
		wg.Wait()
		best = max(best, float64(n*8)/time.Since(t).Seconds())
	}
	return best
}

// MatMulPeak is the device's matmul rate in GFLOP/s on a 1024³ product
// of dt operands (an f32 result), best of five runs of four.
func MatMulPeak(ctx context.Context, dev runtime.Device, dt runtime.DType) (float64, error) {
	const n = 1024
	bind := map[string]runtime.Buffer{}
	defer func() {
		for _, b := range bind {
			dev.Free(b)
		}
	}()
	r := rand.New(rand.NewPCG(1, 2))
	for _, name := range []string{"a", "w", "y"} {
		bdt := dt
		if name == "y" {
			bdt = runtime.F32 // a bf16 product accumulates and is written in f32
		}
		buf, err := dev.Alloc(bdt, n, n)
		if err != nil {
			return 0, err
		}
		bind[name] = buf
		if name != "y" {
			data := make([]float32, n*n)
			for i := range data {
				data[i] = float32(r.NormFloat64())
			}
			if err := dev.CopyIn(ctx, buf, data); err != nil {
				return 0, err
			}
		}
	}
	g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpMatMul, In: []string{"a", "w"}, Out: "y"}}}
	if err := dev.Run(ctx, g, bind); err != nil {
		return 0, err
	}
	best := 0.0
	for range 5 {
		start := time.Now()
		for range 4 {
			if err := dev.Run(ctx, g, bind); err != nil {
				return 0, err
			}
		}
		best = max(best, 4*2*n*n*n/time.Since(start).Seconds()/1e9)
	}
	return best, nil
}

// PeersDir is the checkout's bench/peers, found from the working directory
// (the repository root, or anywhere below it): go run builds the command
// elsewhere, so its scripts are found from where it is run.
func PeersDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "bench", "peers")
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run it from the repository (bench/peers not found)")
		}
		dir = parent
	}
}

// Median of v (0 when empty); v is not changed.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// Python is Debian's interpreter, which has python3-torch (a python3
// earlier on PATH, such as a pyenv shim, may not).
func Python() string {
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	return "python3"
}

// InstallTorch installs Debian's python3-torch and python3-numpy (with
// sudo unless root) when Python cannot import them.
func InstallTorch() error {
	if exec.Command(Python(), "-c", "import torch, numpy").Run() == nil {
		return nil
	}
	fmt.Println("installing python3-torch (apt-get)...")
	cmd := exec.Command("sh", "-c", `if [ "$(id -u)" = 0 ]; then S=; else S=sudo; fi; $S apt-get install -y -q --no-install-recommends python3-torch python3-numpy`)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("apt-get install python3-torch: %w", err)
	}
	return nil
}
