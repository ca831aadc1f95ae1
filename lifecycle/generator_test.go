package lifecycle

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/llm/llmtest"
	"github.com/brokerd/brokerd/runtime/onednn"
	"github.com/brokerd/brokerd/scheduler"
)

// tinyLLM is a random two-layer Llama (vocabulary 300, 256 positions).
func tinyLLM(t *testing.T) *llm.Model {
	t.Helper()
	c, w := llmtest.TinyLlama(300, 2)
	cfg, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	m, err := llm.NewModel(cfg, w, llm.ModelOptions{Name: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// llmRepository holds one decoder LLM, "tiny" version 1.
type llmRepository struct{ m *llm.Model }

func (r llmRepository) List() ([]RepoEntry, error) {
	return []RepoEntry{{Name: "tiny", Kind: "llm", Versions: []int64{1}}}, nil
}
func (r llmRepository) Load(ctx context.Context, name string, version int64) (Loaded, error) {
	if name != "tiny" || version > 1 {
		return Loaded{}, notFound("model %s version %d not found", name, version)
	}
	return Loaded{LLM: r.m, Version: 1, Fingerprint: "1"}, nil
}
func (r llmRepository) Fingerprint(string, int64) (string, error) { return "1", nil }
func (r llmRepository) Canonical(name string) string              { return name }

// genOptsHost is a scheduler that keeps the GenOptions and executors of
// the generator replicas added to it.
type genOptsHost struct {
	*scheduler.Scheduler
	mu    sync.Mutex
	opts  []scheduler.GenOptions
	execs []scheduler.GenExecutor
}

func (h *genOptsHost) AddGenReplica(model string, dev scheduler.Device, opts scheduler.GenOptions, exec scheduler.GenExecutor, ropts ...scheduler.ReplicaOption) error {
	h.mu.Lock()
	h.opts, h.execs = append(h.opts, opts), append(h.execs, exec)
	h.mu.Unlock()
	return h.Scheduler.AddGenReplica(model, dev, opts, exec, ropts...)
}

// TestGeneratorSpeculativeSettings: Options.SpecTokens and SpecMaxRunning
// (--speculative-tokens, --speculative-max-running) reach the scheduler's
// GenOptions, and the engine may verify as many guesses a step as every
// sequence that may guess guessing its most (EngineOptions.MaxDrafts, 0
// when off); the replica's memory counts a logits row for each (within
// the step's token budget), and the placement's log line says them.
func TestGeneratorSpeculativeSettings(t *testing.T) {
	m := tinyLLM(t)
	const maxRunning = 8 // Options.MaxBatch
	for _, tc := range []struct {
		name                 string
		spec, specMaxRunning int
		wantMaxRunning       int // GenOptions.SpecMaxRunning
		wantDrafts           int // EngineOptions.MaxDrafts
		rows                 int // the step's logits rows counted
	}{
		{"off", 0, 0, scheduler.DefaultSpecMaxRunning, 0, maxRunning},
		{"off with a bound", 0, 2, 2, 0, maxRunning},
		{"default bound", 3, 0, scheduler.DefaultSpecMaxRunning, 3 * scheduler.DefaultSpecMaxRunning, maxRunning + 3*scheduler.DefaultSpecMaxRunning},
		{"one sequence", 16, 1, 1, 16, maxRunning + 16},
		{"bound above the running set", 5, 1024, 1024, 5 * maxRunning, maxRunning + 5*maxRunning},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sched := scheduler.New(scheduler.Options{})
			t.Cleanup(sched.Close)
			host := &genOptsHost{Scheduler: sched}
			core, logs := observer.New(zap.InfoLevel)
			cpu := detect.Entry{Device: detect.Device{ID: "cpu:0", Type: detect.TypeCPU, Runtime: onednn.Name}}
			ms := openDevices(t.Context(), []detect.Entry{cpu}, host, llmRepository{m}, Options{
				Adapters: map[string]runtime.Adapter{onednn.Name: onednn.New(onednn.Options{})}, Factors: detect.DefaultFactors(),
				MaxBatch: maxRunning, SpecTokens: tc.spec, SpecMaxRunning: tc.specMaxRunning,
			}, zap.New(core))
			t.Cleanup(func() { ms.Close() })
			sv, _, err := ms.Load(t.Context(), "tiny", 0)
			if err != nil {
				t.Fatal(err)
			}
			host.mu.Lock()
			opts, execs := host.opts, host.execs
			host.mu.Unlock()
			if len(opts) != 1 || len(sv.replicas) != 1 {
				t.Fatalf("%d generator replicas added, %d placed; want 1", len(opts), len(sv.replicas))
			}
			o := opts[0]
			if o.MaxRunning != maxRunning || o.SpecTokens != tc.spec || o.SpecMaxRunning != tc.wantMaxRunning {
				t.Errorf("GenOptions %+v: want MaxRunning %d, SpecTokens %d, SpecMaxRunning %d", o, maxRunning, tc.spec, tc.wantMaxRunning)
			}
			eng := execs[0].(EngineExecutor).Engine
			if got := eng.Options().MaxDrafts; got != tc.wantDrafts {
				t.Errorf("EngineOptions.MaxDrafts %d, want %d", got, tc.wantDrafts)
			}
			// Without a budget the cache is the whole running set's: the
			// replica is weights, a step's workspace and that cache.
			od := ms.devices[0]
			g := llmServable{m: m}
			want := m.WeightBytesOn(od.dev, od.dtype) + m.StepBytes(od.dtype, genStepTokens, tc.rows) + maxRunning*g.seqCacheBytes(od)
			if got := sv.replicas[0].bytes; got != want {
				t.Errorf("the replica's memory %d bytes, want %d (%d logits rows)", got, want, tc.rows)
			}
			placed := logs.FilterMessage("generator placed").All()
			if len(placed) != 1 {
				t.Fatalf("placement log lines %v, want one", placed)
			}
			f := placed[0].ContextMap()
			if f["speculative_tokens"] != int64(tc.spec) || f["speculative_max_running"] != int64(tc.wantMaxRunning) || f["max_drafts"] != int64(tc.wantDrafts) {
				t.Errorf("placement log line %v: want speculative_tokens %d, speculative_max_running %d, max_drafts %d", f, tc.spec, tc.wantMaxRunning, tc.wantDrafts)
			}
		})
	}
}

// TestGeneratorStepRowsWithinBudget: however many guesses the settings
// allow, a step's logits rows are its tokens, so the workspace counted is
// at most the step budget's rows.
func TestGeneratorStepRowsWithinBudget(t *testing.T) {
	m := tinyLLM(t)
	dev, err := onednn.New(onednn.Options{}).Open(t.Context(), runtime.DeviceSpec{ID: "cpu:0", DType: runtime.F32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	od := openDevice{dev: dev, dtype: runtime.F32}
	for _, tc := range []struct {
		spec, specMaxRunning, maxRunning, rows int
	}{
		{0, 4, 64, 64},
		{16, 1024, 64, 64 + 16*64},
		{16, 1024, 1024, genStepTokens},
		{16, 1024, 4096, 4096}, // a running set above the budget keeps its own rows, as without guesses
	} {
		g := llmServable{m: m, spec: tc.spec, specMaxRunning: tc.specMaxRunning}
		want := m.WeightBytesOn(dev, runtime.F32) + m.StepBytes(runtime.F32, genStepTokens, tc.rows)
		if got := g.fixed(od, tc.maxRunning); got != want {
			t.Errorf("spec %d, bound %d, running %d: fixed %d bytes, want %d (%d rows)", tc.spec, tc.specMaxRunning, tc.maxRunning, got, want, tc.rows)
		}
	}
}
