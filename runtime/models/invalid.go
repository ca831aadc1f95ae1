package models

import "errors"

// ErrInvalidModel means a model's files cannot be used: the repository
// holds a model that cannot be served as it is (INVALID_ARGUMENT at the
// edge, like a bad request: what the admin asked to load is not loadable).
// Every InvalidModelKind matches it, so one test covers them all.
var ErrInvalidModel = errors.New("invalid model")

// InvalidModelKind is one kind of invalid model file. Its words lead an
// error's message and say what is wrong ("invalid model config: ...",
// "invalid tokenizer: ..."), and it matches ErrInvalidModel.
type InvalidModelKind string

func (k InvalidModelKind) Error() string { return string(k) }

// Is makes every kind an ErrInvalidModel.
func (k InvalidModelKind) Is(target error) bool { return target == ErrInvalidModel }

// The kinds of invalid model files (the weight formats have their own:
// safetensors.ErrInvalid).
var (
	// ErrInvalidConfig: a configuration file (config.json, brokerd.json,
	// model.json, the sentence-transformers modules) is malformed, states
	// sizes out of bounds, or asks for something not supported.
	ErrInvalidConfig = InvalidModelKind("invalid model config")
	// ErrInvalidGenerationConfig: generation_config.json is malformed or
	// out of range.
	ErrInvalidGenerationConfig = InvalidModelKind("invalid generation config")
	// ErrInvalidTokenizer: tokenizer.json or tokenizer_config.json (its
	// chat template) cannot be used, or does not fit the model's vocabulary.
	ErrInvalidTokenizer = InvalidModelKind("invalid tokenizer")
	// ErrInvalidWeights: the weights, read without error, do not fit the
	// architecture (a missing or misshapen tensor).
	ErrInvalidWeights = InvalidModelKind("invalid model weights")
)
