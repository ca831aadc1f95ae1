// Package models holds the neural models brokerd serves from its model
// repository (MLPs and BERT-family encoders and classifiers) as op graphs over
// a runtime.Device, and the types the repository loader, the scheduler's
// executors and the server share.
//
// The repository loader (runtime/models/repo) reads a model directory
// (safetensors weights, config, tokenizer) and builds a Model with the
// constructors here; the server places replicas of it on devices and sends
// batches of payloads (TextInput, RowInput) through the scheduler.
package models

import (
	"context"
	"fmt"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/quant"
)

// Kind is a model kind of the repository.
type Kind string

// Model kinds.
const (
	KindMLP            Kind = "mlp"
	KindBERT           Kind = "bert"
	KindBERTClassifier Kind = "bert-classifier"
)

// Tensor is a host tensor, row-major: float32 values, or a block-quantized
// weight as its file stores it. Float weights of any stored dtype (F32,
// F16, BF16) are converted to float32 when loaded; the device converts
// again if it computes in bf16. Block-quantized weights (GGUF's Q4_K, …)
// stay as stored: a device that holds them (runtime.RawDevice) gets the
// bytes, others their values (Float32).
type Tensor struct {
	Shape []int
	Data  []float32 // nil for a block-quantized tensor
	// Stored is the block type of Raw (0: the tensor is Data).
	Stored runtime.DType
	// Raw are the stored bytes in pieces laid end to end, each whole rows
	// (a fused weight is its parts'); they may lie in a file's mapping.
	Raw [][]byte
}

// Quantized says whether t is held in a block type.
func (t Tensor) Quantized() bool { return t.Stored.Quantized() }

// Elements is the product of t's dimensions.
func (t Tensor) Elements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// RawBytes is the length of Raw's pieces together.
func (t Tensor) RawBytes() int64 {
	var n int64
	for _, p := range t.Raw {
		n += int64(len(p))
	}
	return n
}

// Float32 is t's values: Data, or Raw dequantized into a new slice.
func (t Tensor) Float32() ([]float32, error) {
	if !t.Quantized() {
		return t.Data, nil
	}
	q, _ := t.Stored.GGML()
	n := t.Elements()
	if want := t.Stored.Bytes(int64(n)); want != t.RawBytes() {
		return nil, fmt.Errorf("%w: %d bytes of %s for %v", ErrInvalidWeights, t.RawBytes(), t.Stored, t.Shape)
	}
	out := make([]float32, n)
	at := 0
	for _, p := range t.Raw {
		in, _ := q.Info()
		elems := len(p) / in.BlockBytes * in.BlockElems
		if err := quant.Dequantize(q, p, out[at:at+elems]); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidWeights, err)
		}
		at += elems
	}
	return out, nil
}

// TensorSpec describes a model input or output as Infer and KServe see it.
// DType is a KServe datatype name: "FP32", "INT64", "BYTES", ...; -1 in Shape
// is a free dimension (the batch, the sequence).
type TensorSpec struct {
	Name  string
	DType string
	Shape []int64
}

// Info is what the server needs to know of a model.
type Info struct {
	Name    string
	Version int64
	Kind    Kind
	Inputs  []TensorSpec
	Outputs []TensorSpec
	// BaseBatch is the model's base batch (the batch plan scales it per device type).
	BaseBatch int
	// MaxBatchTokens bounds the tokens of one batch for text models (0: none).
	MaxBatchTokens int
	// MaxSeqLen is the longest token sequence (max_position_embeddings).
	MaxSeqLen int
	// Dim is the embedding size for encoders, the number of logits for
	// classifiers, the output width for MLPs.
	Dim int
	// Labels are the classifier's label names (id2label), when known.
	Labels []string
}

// Model is a loaded model, ready to be placed on devices.
type Model interface {
	Info() Info
	// MemoryBytes is what one replica needs on a device computing in dt:
	// resident weights plus the workspace of a full batch.
	MemoryBytes(dt runtime.DType, maxBatch int) int64
	// NewReplica uploads the weights to dev (once; they stay resident) and
	// returns an executor for batches of payloads.
	NewReplica(ctx context.Context, dev runtime.Device, maxBatch int) (Replica, error)
	// Cost is an item's share of the batch budget: its token count for text
	// models (so batches respect MaxBatchTokens), 1 otherwise.
	Cost(payload any) int
}

// Replica is a model on one device. It implements the scheduler's Executor:
// one output per input, in order.
type Replica interface {
	Execute(ctx context.Context, inputs []any) ([]any, error)
	Close() error
}

// TextInput is one item for an encoder or classifier. Tokenisation happens
// when the payload is built (TokenizeText), not on the device.
type TextInput struct {
	IDs       []int32 // token ids with special tokens ([CLS] ... [SEP] ...)
	TypeIDs   []int32 // token type ids (0 first segment, 1 second)
	Normalize bool    // encoders: L2-normalise the pooled vector
	// Truncated says the text had more tokens than the model takes and was
	// cut (the result describes its beginning only).
	Truncated bool
}

// RowInput is one row (batch element) of an Infer request for an MLP: the
// input vector without its batch dimension.
type RowInput struct {
	Values []float32
}

// Output is one item's result: an embedding, logits, or an MLP output row.
type Output struct {
	Values []float32
}
