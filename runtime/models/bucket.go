package models

import (
	"slices"

	"github.com/brokerd/brokerd/runtime"
)

// bucketDevice is a device that wants batches padded to a few sizes:
// runtime/pjrt's Device, where XLA compiles one program per input shape.
// It is matched by method so models does not import an adapter.
type bucketDevice interface {
	PadBuckets() (batch, seq []int)
}

// padPlan is how a replica pads one batch. With no buckets (oneDNN, which
// runs any shape without compiling) rows are not padded and sequences go to
// a multiple of seqStep(n).
type padPlan struct {
	batch    []int // ascending batch buckets; nil: rows are not padded
	seq      []int // ascending sequence buckets; nil: multiples of seqStep(n)
	maxBatch int   // the replica's max batch: no bucket beyond it
	maxSeq   int   // the model's longest sequence (max_position_embeddings)
}

// newPadPlan reads dev's buckets, if it has any, for a replica of maxBatch
// items and sequences of at most maxSeq tokens (0 for models without).
func newPadPlan(dev runtime.Device, maxBatch, maxSeq int) padPlan {
	p := padPlan{maxBatch: maxBatch, maxSeq: maxSeq}
	if bd, ok := dev.(bucketDevice); ok {
		batch, seq := bd.PadBuckets()
		// Sorted copies: the arithmetic below takes the first that fits.
		p.batch, p.seq = cleanBuckets(batch), cleanBuckets(seq)
	}
	return p
}

// cleanBuckets returns the positive sizes of b, ascending; nil when none.
func cleanBuckets(b []int) []int {
	out := slices.DeleteFunc(slices.Clone(b), func(n int) bool { return n < 1 })
	if len(out) == 0 {
		return nil
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// nextBucket returns the smallest bucket of buckets (ascending) holding n.
func nextBucket(n int, buckets []int) (int, bool) {
	for _, b := range buckets {
		if b >= n {
			return b, true
		}
	}
	return 0, false
}

// rows returns how many rows a batch of n items runs as: the next batch
// bucket, capped at the replica's max batch (a full batch is never padded
// past the plan), never below n.
func (p padPlan) rows(n int) int {
	if p.batch == nil || n < 1 {
		return n
	}
	b, ok := nextBucket(n, p.batch)
	if !ok {
		return n
	}
	return max(min(b, p.maxBatch), n)
}

// seqLen returns the padded length of a batch whose longest sequence has n
// tokens: the next sequence bucket, or the next multiple of seqStep(n)
// without buckets or beyond the last one; capped at maxSeq, never below n.
func (p padPlan) seqLen(n int) int {
	s, ok := nextBucket(n, p.seq)
	if !ok {
		step := seqStep(n)
		s = (n + step - 1) / step * step
	}
	if p.maxSeq > 0 {
		s = min(s, p.maxSeq)
	}
	return max(s, n)
}

// seqStep is the padding granularity for a longest sequence of n tokens
// when there are no buckets: the largest power of two up to n/8. Padding
// then costs at most about 1/8 more work (a fixed step of 8 padded 18-token
// batches to 24, a third more work, and cost a fifth of the batched
// throughput at 16 tokens), while the adapter still sees about eight
// sequence lengths per doubling, so its shape-keyed primitive cache stays
// small.
func seqStep(n int) int {
	step := 1
	for step*2 <= n/8 {
		step *= 2
	}
	return step
}

// packs reports whether batches run packed (see BERT.graph): on devices
// without buckets, which run any shape as it comes.
func (p padPlan) packs() bool { return p.batch == nil && p.seq == nil }

// tokenRows is the row count of a packed batch of n real tokens: n rounded
// up to the largest power of two up to n/16. Packed matmuls have a new
// shape per row count, and the adapter creates and caches a primitive per
// shape; the rounding keeps about sixteen row counts per doubling, at most
// a sixteenth of padding.
func (p padPlan) tokenRows(n int) int {
	step := 1
	for step*2 <= n/16 {
		step *= 2
	}
	return (n + step - 1) / step * step
}
