// Package errtable is brokerd's one error table: the gRPC code each
// sentinel error of the packages below the edge reaches a client with, and
// the HTTP status each gRPC code becomes on the HTTP APIs. The gRPC
// services map errors with Code (server/errors.go) and the HTTP edge, which
// calls those services in process, maps their codes with HTTPStatus, so a
// sentinel has one answer on both.
//
// INTERNAL is for bugs only: every exported Err* of detect, lifecycle,
// runtime/... and scheduler is either a row of the table or named in
// internalOnPurpose with the reason it can only reach a client through a
// bug, and every exported error type of them has a row. The package's test
// parses those packages and fails on one that is neither.
package errtable

import (
	"context"
	"errors"
	"net/http"

	"google.golang.org/grpc/codes"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/lifecycle"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/hashenc"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/llm/grammar"
	"github.com/brokerd/brokerd/runtime/models/ollama"
	"github.com/brokerd/brokerd/runtime/models/repo"
	"github.com/brokerd/brokerd/runtime/models/tokenizer"
	"github.com/brokerd/brokerd/runtime/models/tokenizer/bpe"
	"github.com/brokerd/brokerd/runtime/quant"
	"github.com/brokerd/brokerd/scheduler"
)

// row maps the errors matching one sentinel (errors.Is) or one error type
// (as) to a code.
type row struct {
	err  error
	as   func(error) bool
	code codes.Code
}

func is(err error, code codes.Code) row { return row{err: err, code: code} }

func asType[T error](code codes.Code) row {
	return row{as: func(err error) bool { var t T; return errors.As(err, &t) }, code: code}
}

// table is searched in order and the first row an error matches decides
// its code. The order settles errors that wrap two sentinels: the
// scheduler's come first because it wraps what failed below it
// (ErrBackend around an executor's error is UNAVAILABLE: the batch may
// succeed elsewhere), except a device out of memory, which stays
// RESOURCE_EXHAUSTED (the next try may fit); a sentinel that wraps another
// comes before the one it wraps.
var table = []row{
	// The scheduler.
	is(scheduler.ErrQueueFull, codes.ResourceExhausted), // a *QueueFullError also carries its retry delay
	is(scheduler.ErrDraining, codes.Unavailable),
	is(scheduler.ErrUnknownModel, codes.NotFound),
	is(scheduler.ErrDeviceNotFound, codes.NotFound),
	is(runtime.ErrOutOfMemory, codes.ResourceExhausted),
	// Pinned to devices no replica runs on (a type the host lacks): a
	// retry gets the same answer, unlike cordoned replicas (ErrNoDevice,
	// which it wraps).
	is(scheduler.ErrNoMatchingReplica, codes.FailedPrecondition),
	is(scheduler.ErrNoDevice, codes.Unavailable),
	is(scheduler.ErrBackend, codes.Unavailable),
	is(scheduler.ErrInvalidArgument, codes.InvalidArgument),
	// The edge checks the model's kind first: this is a model replaced by
	// one of another kind in between (a reload).
	is(scheduler.ErrWrongKind, codes.FailedPrecondition),

	// Devices and the inventory.
	is(detect.ErrDeviceNotFound, codes.NotFound),
	is(detect.ErrInvalidArgument, codes.InvalidArgument),
	is(detect.ErrDeviceUnavailable, codes.FailedPrecondition), // ErrDeviceCordoned wraps it
	is(lifecycle.ErrModelNotFound, codes.NotFound),
	is(lifecycle.ErrModelNotLoaded, codes.FailedPrecondition),
	is(lifecycle.ErrBuiltinModel, codes.FailedPrecondition),
	asType[*lifecycle.AdmissionError](codes.ResourceExhausted),

	// A model's files, every kind (config, tokenizer, weights, layout,
	// safetensors, GGUF, Ollama blobs): what the admin asked to load is not
	// loadable, like a bad request. Every models.InvalidModelKind matches
	// ErrInvalidModel.
	is(models.ErrInvalidModel, codes.InvalidArgument),
	// A request's own values (llm.ErrInvalidSampling wraps it; so does a
	// chat template that cannot render the request's messages).
	is(models.ErrInvalidInput, codes.InvalidArgument),
	// A request's structured-output constraint, at compile time or past
	// its run-time bounds (too ambiguous a grammar).
	is(grammar.ErrInvalidGrammar, codes.InvalidArgument),
	is(grammar.ErrUnsupportedSchema, codes.InvalidArgument),
	is(grammar.ErrGrammarTooLarge, codes.InvalidArgument),

	is(context.DeadlineExceeded, codes.DeadlineExceeded),
	is(context.Canceled, codes.Canceled),

	// The rows below were INTERNAL until the table covered every
	// sentinel; below the others, an error matching an earlier row keeps
	// its code.
	is(scheduler.ErrBatchTimeout, codes.Unavailable), // wrapped together with ErrBackend
	is(repo.ErrNotFound, codes.NotFound),
	is(ollama.ErrNotFound, codes.NotFound),
	// Model files again, where the loaders do not wrap them in an
	// InvalidModelKind.
	is(tokenizer.ErrInvalid, codes.InvalidArgument),
	is(bpe.ErrInvalid, codes.InvalidArgument),
	is(quant.ErrUnsupported, codes.InvalidArgument),
	is(quant.ErrLength, codes.InvalidArgument),
	// A chat template (a model's file) that cannot render a request's
	// messages, or breaks its limits on them.
	is(bpe.ErrNoTemplate, codes.InvalidArgument),
	is(bpe.ErrTemplate, codes.InvalidArgument),
	is(bpe.ErrTemplateLimit, codes.InvalidArgument),
	is(ollama.ErrTemplate, codes.InvalidArgument),
	is(ollama.ErrTemplateLimit, codes.InvalidArgument),
	is(tokenizer.ErrTooLong, codes.InvalidArgument),
	is(grammar.ErrStackLimit, codes.InvalidArgument),
	// The device cannot do it on this host (bf16 without the
	// instructions, a matmul that is not exact): a retry gets the same
	// answer.
	is(runtime.ErrUnsupported, codes.FailedPrecondition),
	is(hashenc.ErrInexactDevice, codes.FailedPrecondition),
	// A replica or engine closed under a request (an unload or a shutdown
	// racing it): another try finds the model's next state.
	is(models.ErrClosed, codes.Unavailable),
	is(hashenc.ErrClosed, codes.Unavailable),
	is(llm.ErrClosed, codes.Unavailable),
}

// internalOnPurpose names the sentinels that stay INTERNAL, with why a
// client meeting one is meeting a bug (or a package's error that only
// reaches the edge wrapped in another's).
var internalOnPurpose = map[string]string{
	"runtime.ErrInvalidGraph":                          "brokerd's models build their graphs from requests the edge has checked",
	"runtime/models/llm.ErrInvalidStep":                "the scheduler builds the steps within the engine's own bounds",
	"runtime/hashenc.ErrBadInput":                      "the server builds the encoder's inputs",
	"runtime/models/llm/grammar.ErrTokenRejected":      "the sampler only picks tokens the grammar's mask allows",
	"runtime/models/llm/grammar.ErrTerminated":         "a sequence ends at the token that terminates its grammar",
	"runtime/models/tokenizer/internal/jinja.ErrLimit": "bpe wraps it in ErrTemplateLimit",
	"runtime/onednn.ErrClosed":                         "devices close after the listeners have stopped",
	"runtime/pjrt.ErrClosed":                           "devices close after the listeners have stopped",
	"runtime/pjrt.ErrNoPlugin":                         "plugins are opened at startup, before any request",
	"runtime/pjrt.ErrIncompleteAPI":                    "plugins are opened at startup, before any request",
	"runtime/pjrt.ErrNoDevices":                        "plugins are opened at startup, before any request",
	"runtime/pjrt.ErrNotFound":                         "plugins are opened at startup, before any request",
	"runtime/pjrt.ErrDlopen":                           "plugins are opened at startup, before any request",
	"runtime/pjrt.ErrNotPlugin":                        "plugins are opened at startup, before any request",
	"runtime/pjrt.ErrNullAPI":                          "plugins are opened at startup, before any request",
	"runtime/pjrt.ErrBadAPI":                           "plugins are opened at startup, before any request",
	"runtime/pjrt.ErrBadPluginSpec":                    "plugin settings are checked at startup, before any request",
}

// Code is the gRPC code err reaches a client with: that of the first row
// of the table it matches, INTERNAL (a bug) when it matches none.
func Code(err error) codes.Code {
	for _, r := range table {
		if r.err != nil && errors.Is(err, r.err) || r.as != nil && r.as(err) {
			return r.code
		}
	}
	return codes.Internal
}

// httpStatus is the HTTP status of each gRPC code on the HTTP APIs; a code
// not in it is 500.
var httpStatus = map[codes.Code]int{
	codes.OK:                 http.StatusOK,
	codes.InvalidArgument:    http.StatusBadRequest,
	codes.FailedPrecondition: http.StatusBadRequest,
	codes.OutOfRange:         http.StatusBadRequest,
	codes.Unauthenticated:    http.StatusUnauthorized,
	codes.PermissionDenied:   http.StatusForbidden,
	codes.NotFound:           http.StatusNotFound,
	codes.ResourceExhausted:  http.StatusTooManyRequests,
	codes.Unavailable:        http.StatusServiceUnavailable,
	codes.DeadlineExceeded:   http.StatusGatewayTimeout,
	codes.Canceled:           499, // the client closed the request
	codes.Unimplemented:      http.StatusNotImplemented,
}

// HTTPStatus is the HTTP status the HTTP APIs answer a gRPC code with.
func HTTPStatus(c codes.Code) int {
	if s, ok := httpStatus[c]; ok {
		return s
	}
	return http.StatusInternalServerError
}
