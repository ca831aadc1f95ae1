package daemon

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/runtime/models/llm"
)

// gatedTokenizers is a tokenizer loader that says when a load reaches it
// (entered), then waits: for release, or, with honourCtx, for the load's
// context to end (returning its error, as a loader reading a large file
// under ctx does).
type gatedTokenizers struct {
	entered   chan struct{}
	release   chan struct{}
	once      sync.Once
	honourCtx bool
}

func newGatedTokenizers(honourCtx bool) *gatedTokenizers {
	return &gatedTokenizers{entered: make(chan struct{}, 16), release: make(chan struct{}), honourCtx: honourCtx}
}

func (g *gatedTokenizers) open() { g.once.Do(func() { close(g.release) }) }

func (g *gatedTokenizers) load(ctx context.Context, _ string, _ func(string, int64) ([]byte, error)) (llm.Tokenizer, llm.ChatTemplate, error) {
	g.entered <- struct{}{}
	if g.honourCtx {
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-g.release:
		}
	} else {
		<-g.release
	}
	return byteTokenizer{}, byteTokenizer{}, nil
}

// TestSigtermDuringLoadModels: SIGTERM (Run's context cancelled) while
// --load-models loads a model is a clean stop: Run returns nil, not the
// load's "context canceled" (which main reported as "brokerd failed",
// exit status 1).
func TestSigtermDuringLoadModels(t *testing.T) {
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.LoadModels = "tiny-llm"
	writeTinyLlama(t, cfg.ModelRepo, "tiny-llm")
	tok := newGatedTokenizers(true)
	defer tok.open()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Config: cfg, Version: "test", Getenv: hermeticEnv, Tokenizers: tok.load}, zap.NewNop())
	}()
	select {
	case <-tok.entered:
	case err := <-done:
		t.Fatalf("Run returned before the load began: %v", err)
	case <-time.After(startBound):
		t.Fatal("the load of --load-models never began")
	}
	cancel() // SIGTERM
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("SIGTERM during --load-models: Run returned %q; want a clean stop (nil)", err)
		}
	case <-time.After(startBound):
		t.Fatal("Run did not return after SIGTERM during --load-models")
	}
}
