package server

import (
	"context"
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

// countingText is a text model that counts tokenisations.
type countingText struct {
	models.Model
	calls int
}

func (c *countingText) Tokenize(ctx context.Context, text, pair string, truncate, normalize bool) (models.TextInput, error) {
	c.calls++
	return models.TextInput{IDs: []int32{1}}, nil
}
