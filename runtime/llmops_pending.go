package runtime

// The decoder ops h/llmops is adding, declared here only so the engine in
// runtime/models/llm builds before that branch lands; no adapter runs them
// yet. This file goes when h/llmops is merged (its declarations replace it).
const (
	OpRMSNorm OpKind = 200 + iota
	OpSiLU
	OpSwiGLU
	OpRoPE
	OpKVWrite
	OpPagedAttention
)
