package lifecycle

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/scheduler"
)

// A servable is one kind of model as placement sees it, as a backend is to
// Triton's model lifecycle: what a replica needs of a device's budget, how
// to start one there and have the scheduler run it. The built-in
// encoders, the repository's batch models (encoders, MLPs) and its
// generators (decoder LLMs, generator.go) are the three kinds; placeLocked
// places any of them, and a Served's kind is its servable's.
type servable interface {
	info() models.Info
	// need is what one replica running maxBatch at once needs of od's
	// budget to be admitted there.
	need(od openDevice, maxBatch int) int64
	// needs says what need covers, for a refusal ("" where plain).
	needs() string
	// start makes a replica on od. free is what od's budget leaves (-1:
	// od has no budget); bytes is what the replica reserves of it.
	start(ctx context.Context, od openDevice, maxBatch int, free int64) (r instance, bytes int64, err error)
	// unit names a replica in messages.
	unit() string
}

// instance is a servable's replica on one device (Triton's model instance).
type instance interface {
	// join adds it to the scheduler's queue key.
	join(h Host, key string, dev scheduler.Device, opts ...scheduler.ReplicaOption) error
	// placed is the log line of a replica that joined (the model, device
	// and memory are added to it).
	placed() (msg string, fields []zap.Field)
	Close() error
}

// builtinServable is a built-in encoder as a servable: its replicas run a batch
// each, as its budget counts one.
type builtinServable struct{ e Encoder }

func (b builtinServable) info() models.Info {
	return models.Info{Name: b.e.Name(), Version: b.e.Version(), Kind: models.Kind(b.e.Kind()), BaseBatch: b.e.BaseBatch()}
}
func (b builtinServable) need(openDevice, int) int64 { return b.e.MemoryBytes() }
func (builtinServable) needs() string                { return "" }
func (builtinServable) unit() string                 { return "Replica" }
func (b builtinServable) start(ctx context.Context, od openDevice, maxBatch int, _ int64) (instance, int64, error) {
	r, err := b.e.NewReplica(ctx, od.dev)
	if err != nil {
		return nil, 0, err
	}
	return batchInstance{Replica: r, maxBatch: maxBatch, inFlight: 1}, b.e.MemoryBytes(), nil
}

// batchServable is a repository model served through Infer (and Encode for
// encoders): batches of items.
type batchServable struct {
	m         models.Model
	maxTokens int // a text model's batch token budget (Set.maxTokens); 0 for others
}

func (b batchServable) info() models.Info { return b.m.Info() }

// need covers a batch's workspace for each batch in flight: a pipelined
// replica holds that many batches' buffers.
func (b batchServable) need(od openDevice, maxBatch int) int64 {
	return b.m.MemoryBytes(od.dtype, maxBatch*od.inFlight)
}
func (batchServable) needs() string { return "" }
func (batchServable) unit() string  { return "Replica" }
func (b batchServable) start(ctx context.Context, od openDevice, maxBatch int, _ int64) (instance, int64, error) {
	r, err := b.m.NewReplica(ctx, od.dev, maxBatch)
	if err != nil {
		return nil, 0, err
	}
	// A replica that can warm up (BERT: its weights packed at load, not in
	// a client's first request) does so before it serves.
	if w, ok := r.(interface{ WarmUp(context.Context) error }); ok {
		if err := w.WarmUp(ctx); err != nil {
			r.Close()
			return nil, 0, fmt.Errorf("warm-up: %w", err)
		}
	}
	return batchInstance{Replica: r, maxBatch: maxBatch, inFlight: od.inFlight, maxTokens: b.maxTokens}, b.need(od, maxBatch), nil
}

// batchInstance is a batch Replica with what the scheduler needs to run it.
type batchInstance struct {
	Replica
	maxBatch  int
	inFlight  int // batches at once: the next is copied in while one runs
	maxTokens int // a batch's token budget; 0: none
}

func (r batchInstance) join(h Host, key string, dev scheduler.Device, opts ...scheduler.ReplicaOption) error {
	if r.maxTokens > 0 {
		// Items cost their tokens (Served.Costs): a batch stays within the budget.
		opts = append(opts, scheduler.WithMaxBatchCost(r.maxTokens))
	}
	if r.inFlight > 1 {
		opts = append(opts, scheduler.WithMaxInFlight(r.inFlight))
	}
	return h.AddReplica(key, dev, r.maxBatch, r.Replica, opts...)
}

func (r batchInstance) placed() (string, []zap.Field) {
	return "model placed", []zap.Field{zap.Int("max_batch", r.maxBatch), zap.Int("batches_in_flight", r.inFlight)}
}
