package daemon

import (
	"errors"
	"io"
	"slices"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/scheduler"
	"github.com/brokerd/brokerd/server/config"
)

// TestSpeculativeDecodingEndToEnd: --speculative-tokens reaches a
// generator's replica (its placement's log line says it), which then
// guesses tokens by prompt lookup and keeps some (GetStats counts both per
// row, nothing when off), and greedy sequences give the tokens they give
// with it off; --speculative-max-running's default is the scheduler's.
// The random tied model repeats its input, so a repetitive prompt's
// lookups find matches.
func TestSpeculativeDecodingEndToEnd(t *testing.T) {
	if config.DefaultSpeculativeMaxRunning != scheduler.DefaultSpecMaxRunning {
		t.Errorf("--speculative-max-running's default %d, the scheduler's %d", config.DefaultSpeculativeMaxRunning, scheduler.DefaultSpecMaxRunning)
	}
	prompts := []string{"abcdefabcdefabcdefabcdef", "the council meets; the council meets; the council"}
	tokens := map[int][][]int32{}
	for _, spec := range []int{0, 4} {
		cfg := testConfig(t)
		cfg.ModelRepo = t.TempDir()
		cfg.LoadModels = "tiny-llm"
		cfg.SpeculativeTokens = spec
		writeTinyLlama(t, cfg.ModelRepo, "tiny-llm")
		core, logs := observer.New(zap.InfoLevel)
		d := startDaemonLog(t, Options{Config: cfg, Tokenizers: byteTokenizers}, zap.New(core))
		c := brokerv1.NewBrokerServiceClient(d.conn)
		ctx := testCtx(t)

		placed := logs.FilterMessage("generator placed").All()
		if len(placed) != 1 {
			t.Fatalf("spec %d: placement log lines %v, want one", spec, placed)
		}
		if f := placed[0].ContextMap(); f["speculative_tokens"] != int64(spec) || f["speculative_max_running"] != int64(cfg.SpeculativeMaxRunning) {
			t.Errorf("spec %d: placement log line %v, want speculative_tokens %d, speculative_max_running %d", spec, f, spec, cfg.SpeculativeMaxRunning)
		}
		// One stream at a time: guesses are taken while few sequences run.
		for _, p := range prompts {
			st, err := c.Generate(ctx, &brokerv1.GenerateRequest{Model: "tiny-llm", Prompts: []string{p},
				Sampling: &brokerv1.SamplingParams{Temperature: new(float32), MaxTokens: 40, IgnoreEos: true}})
			if err != nil {
				t.Fatal(err)
			}
			var ids []int32
			for {
				m, err := st.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("spec %d: %v", spec, err)
				}
				for _, dl := range m.GetDeltas() {
					ids = append(ids, dl.GetTokenIds()...)
				}
			}
			if len(ids) != 40 {
				t.Errorf("spec %d: %d tokens, want 40", spec, len(ids))
			}
			tokens[spec] = append(tokens[spec], ids)
		}
		st, err := c.GetStats(ctx, &brokerv1.GetStatsRequest{Model: "tiny-llm"})
		if err != nil || len(st.GetStats()) != 2 {
			t.Fatalf("spec %d: GetStats: %v %v", spec, st, err)
		}
		for _, r := range st.GetStats() {
			g := r.GetGeneration()
			drafted, accepted := g.GetSpecDraftTokens(), g.GetSpecAcceptedTokens()
			if (spec == 0) != (drafted == 0) || (spec == 0) != (accepted == 0) || accepted > drafted {
				t.Errorf("spec %d: GetStats row %q: %d guessed tokens, %d kept", spec, r.GetDeviceId(), drafted, accepted)
			}
		}
	}
	for i := range prompts {
		if !slices.Equal(tokens[4][i], tokens[0][i]) {
			t.Errorf("prompt %d: with guesses %v, without %v", i, tokens[4][i], tokens[0][i])
		}
	}
}
