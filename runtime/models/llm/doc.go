// Package llm runs decoder LLMs (Llama 3.x, Qwen2.5, Qwen3) on a
// runtime.Device with continuous batching: the scheduler decides which
// sequences run each step; this package runs the step and samples.
//
// Host side (no device):
//
//	m, err := llm.NewModel(configJSON, weights, llm.ModelOptions{Name, Version, Tokenizer, Chat, GenerationConfig, BaseBatch, MaxContext})
//	m.Encode(text, addSpecial) ([]int32, error)
//	m.RenderChat(ctx, []llm.Message{{Role, Content, Reasoning, ToolCalls, ToolCallID}}, llm.ChatOptions{AddGenerationPrompt, Vars, Tools}) (string, error)
//	m.NewSequence(llm.Sampling{...}, prompt) (*llm.Sequence, error) // validates; the step's State
//	m.NewSequenceContext(ctx, llm.Sampling{Constraint: &llm.Constraint{Kind, Source}}, prompt) // compiles a constraint under ctx (cached per model)
//	m.ContextLength(), m.DefaultSampling(), m.DefaultMaxTokens(), m.EOS(), m.Info() // Kind "llm"
//	m.WeightBytes(dt), m.CacheBlockBytes(dev, 0, blockSize), m.StepBytes(dt, maxStepTokens, maxSeqs) // placement
//	seq.Flush() llm.Delta // text held back when the scheduler ends a sequence (length, deadline)
//
// Device side:
//
//	e, err := m.NewEngine(ctx, dev, llm.EngineOptions{CacheBytes, BlockSize, MaxStepTokens, MaxSeqs, DisablePrefixCache, KVDType, MaxDrafts, DeferSampling})
//	e.Reserve(seq, tokens) bool // KV blocks for tokens positions in all; false when they do not fit now
//	e.Release(seq)              // frees them (finished, cancelled, preempted)
//	e.Step(ctx, []llm.SeqStep) ([]llm.SeqResult, error)
//	e.CacheBlocks() (used, total int) // held by sequences; idle cached blocks count as free
//	e.Stats() llm.EngineStats         // ComputedTokens, CachedTokens (prefix cache hits)
//	e.Options() llm.EngineOptions     // defaults filled: MaxSeqs ≥ running set, MaxStepTokens ≥ step budget
//	e.Close() error
//
// SeqStep and SeqResult have the fields of the scheduler's StepItem and
// StepResult (runtime does not import the scheduler); the adapter to
// scheduler.GenExecutor, lifecycle.EngineExecutor, copies them.
// SeqResult.Out is an llm.Delta{Text, TokenIDs, Logprobs}: Text is whole
// UTF-8 and never part of a stop string; Stop is set on an EOS or stop id
// or a completed stop string; Full when the sampled token takes the
// context's last position; End (FinishConstraint, no token) when the
// sequence's constraint cannot continue.
//
// Sampling is a chain per sequence, llama.cpp's order: a constrained
// sequence's grammar mask (computed by Step in a goroutine per constrained
// sequence while the forward runs; rejected logits become -Inf), the
// penalties, then temperature, min-p, top-k, top-p and the draw; the
// picked token is accepted by the grammar. With Sampling.ThinkFirst the
// grammar waits for a thinking block's end (and up to two whitespace
// tokens): the block's tokens are free. Unconstrained sequences run
// exactly as before and start no goroutine.
//
// One step is one graph over T rows (prefill chunks and decode tokens of S
// sequences, flattened): embedding gather, then per layer RMSNorm, the q, k
// and v projections (biases for Qwen2), per-head q/k RMSNorm (Qwen3), RoPE,
// K and V written into the layer's paged cache at each row's slot, paged
// causal attention with grouped-query heads, o_proj and the residual,
// RMSNorm, the fused gate|up projection, SwiGLU, down_proj and the
// residual; then only the rows that sample are gathered for the final norm
// and lm_head, so logits are [S_sample, V], not [T, V]. Matmul weights and
// the embedding table (one buffer with a tied lm_head) are stored in the
// device's compute type (bf16 where it computes in bf16); norms, biases,
// the residual stream and the cache stay f32. On devices that
// compile per shape (PJRT) rows, sequences and sampled rows are padded to
// the device's buckets, and the block table is as wide as the step's
// longest sequence needs, rounded up to a power of two (their attention
// gathers the table's whole window per row); padding rows write no cache
// slot.
//
// The KV cache is one [NumBlocks, BlockSize, Hkv, D] buffer per layer for K
// and one for V, NumBlocks from EngineOptions.CacheBytes; sequences hold
// blocks (lowest free first) and each step's block tables and slots are
// built from them.
//
// Prefix caching (on unless EngineOptions.DisablePrefixCache): a block
// whose positions are all written is registered under a hash chained over
// the sequence's tokens up to its end; a later step of another sequence
// whose next tokens fill a block with the same history maps that block and
// skips those rows, transparently to the scheduler (its Reserve and Pos
// are unchanged). So does a sequence later in the same step as the one
// writing the block (n choices of one prompt, or a round's prompts that
// arrive together): a step writes every row's K and V before any row
// attends. Released registered blocks stay cached until free blocks
// run out (oldest released evicted first), so the council's system prompt
// is prefilled once per round or less. Reserve takes blocks before Step
// sees the tokens, so in a nearly full cache it may evict a block the
// sequence could have shared.
//
// Speculative decoding (draft.go; on when EngineOptions.MaxDrafts and a
// step item's Draft allow it): a decoding sequence's step also runs up to
// Draft tokens guessed by prompt lookup (the tokens after the earliest of
// the longest 3-5 token matches of its last tokens in its prompt and
// output, vLLM's ngram proposer), every row sampled in order; a guess is
// kept while it equals what the sequence samples at its row, so one step
// may give several tokens (SeqResult.Accepted, then Token). The draws are
// those decoding without guesses makes, from the same RNG, so the tokens
// are the same up to the rounding of several rows against one (attention
// sums them in another order: logprobs agree to 1e-5). Only the rows of
// tokens kept are committed to the cache; a refused guess's rows are
// written over by the next step. A sequence guesses fewer after a refusal
// (Sequence.guessed).
//
// Batch invariance: a row's result does not depend on which other rows
// share its step, so a sequence gives the same tokens alone or in any mix
// (bit-identical on the CPU, where oneDNN's f32 matmul was checked to give
// the same row whatever M), and a seeded sequence draws from its own RNG
// once per token.
package llm
