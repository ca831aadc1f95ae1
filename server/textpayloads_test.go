package server

import (
	"context"
	"fmt"
	"testing"

	"github.com/brokerd/brokerd/lifecycle"
	"github.com/brokerd/brokerd/runtime/models"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestTokenisingStopsWhenTheCallerLeaves: host work on a request stops
// between items once its caller is gone.
func TestTokenisingStopsWhenTheCallerLeaves(t *testing.T) {
	s := &BrokerService{log: zap.NewNop(), DataPlane: DataPlane{limits: Limits{MaxItemsPerRequest: 100, MaxItemBytes: 1 << 20}}}
	tm := &countingText{}
	sv := lifecycle.ServedModel(models.Info{Name: "m"}, tm)
	texts := make([]string, 50)
	for i := range texts {
		texts[i] = "some text"
	}
	tn := &tensor{name: "text", dtype: "BYTES", shape: []int64{50}, data: bytesLE(texts...)}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.textPayloads(ctx, sv, tn, nil, inferOptions{truncate: true})
	if status.Code(err) != codes.Canceled || tm.calls != 0 {
		t.Errorf("cancelled: %v after %d tokenisations", err, tm.calls)
	}
	if _, err := s.textPayloads(context.Background(), sv, tn, nil, inferOptions{truncate: true}); err != nil || tm.calls != 50 {
		t.Errorf("live: %v after %d tokenisations", err, tm.calls)
	}
}

// TestCallerLeavingWhileTokenising: a caller that leaves during a text's
// tokenising is answered CANCELLED, whether the tokenizer stopped with the
// context's error or finished, never INVALID_ARGUMENT for the text.
func TestCallerLeavingWhileTokenising(t *testing.T) {
	s := &BrokerService{log: zap.NewNop(), DataPlane: DataPlane{limits: Limits{MaxItemsPerRequest: 100, MaxItemBytes: 1 << 20}}}
	tn := &tensor{name: "text", dtype: "BYTES", shape: []int64{3}, data: bytesLE("a", "b", "c")}
	for _, stops := range []bool{true, false} {
		ctx, cancel := context.WithCancel(context.Background())
		tm := &countingText{leave: cancel, stops: stops}
		sv := lifecycle.ServedModel(models.Info{Name: "m"}, tm)
		_, err := s.textPayloads(ctx, sv, tn, nil, inferOptions{truncate: true})
		if status.Code(err) != codes.Canceled || tm.calls != 1 {
			t.Errorf("tokenizer stops %v: %v after %d tokenisations", stops, err, tm.calls)
		}
	}
}

// countingText is a text model that counts tokenisations; with leave set,
// its caller leaves during the first, which stops with the context's error
// when stops is set.
type countingText struct {
	models.Model
	calls int
	leave func()
	stops bool
}

func (c *countingText) Tokenize(ctx context.Context, text, pair string, truncate, normalize bool) (models.TextInput, error) {
	c.calls++
	if c.leave != nil {
		c.leave()
		if c.stops {
			return models.TextInput{}, fmt.Errorf("tokenize: %w", ctx.Err())
		}
	}
	return models.TextInput{IDs: []int32{1}}, nil
}
