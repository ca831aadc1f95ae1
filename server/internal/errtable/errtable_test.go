package errtable

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/lifecycle"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/gguf"
	"github.com/brokerd/brokerd/runtime/hashenc"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/llm/grammar"
	"github.com/brokerd/brokerd/runtime/models/ollama"
	"github.com/brokerd/brokerd/runtime/models/repo"
	"github.com/brokerd/brokerd/runtime/models/tokenizer"
	"github.com/brokerd/brokerd/runtime/models/tokenizer/bpe"
	"github.com/brokerd/brokerd/runtime/quant"
	"github.com/brokerd/brokerd/runtime/safetensors"
	"github.com/brokerd/brokerd/scheduler"
)

// below are the directories, from the module's root, of the packages whose
// errors reach the edge.
var below = []string{"detect", "lifecycle", "runtime", "scheduler"}

// sentinels holds the value of every sentinel the edge can import, by the
// name parseSentinels gives it. Sentinels of packages that need cgo (the
// devices) or are internal are named in internalOnPurpose instead.
var sentinels = map[string]error{
	"detect.ErrDeviceNotFound":    detect.ErrDeviceNotFound,
	"detect.ErrDeviceUnavailable": detect.ErrDeviceUnavailable,
	"detect.ErrDeviceCordoned":    detect.ErrDeviceCordoned,
	"detect.ErrInvalidArgument":   detect.ErrInvalidArgument,

	"lifecycle.ErrModelNotFound":  lifecycle.ErrModelNotFound,
	"lifecycle.ErrModelNotLoaded": lifecycle.ErrModelNotLoaded,
	"lifecycle.ErrBuiltinModel":   lifecycle.ErrBuiltinModel,

	"runtime.ErrOutOfMemory":  runtime.ErrOutOfMemory,
	"runtime.ErrInvalidGraph": runtime.ErrInvalidGraph,
	"runtime.ErrUnsupported":  runtime.ErrUnsupported,

	"runtime/gguf.ErrInvalid":         gguf.ErrInvalid,
	"runtime/gguf.ErrUnsupportedType": gguf.ErrUnsupportedType,

	"runtime/hashenc.ErrBadInput":      hashenc.ErrBadInput,
	"runtime/hashenc.ErrClosed":        hashenc.ErrClosed,
	"runtime/hashenc.ErrInexactDevice": hashenc.ErrInexactDevice,

	"runtime/models.ErrInvalidInput":            models.ErrInvalidInput,
	"runtime/models.ErrClosed":                  models.ErrClosed,
	"runtime/models.ErrInvalidModel":            models.ErrInvalidModel,
	"runtime/models.ErrInvalidConfig":           models.ErrInvalidConfig,
	"runtime/models.ErrInvalidGenerationConfig": models.ErrInvalidGenerationConfig,
	"runtime/models.ErrInvalidTokenizer":        models.ErrInvalidTokenizer,
	"runtime/models.ErrInvalidWeights":          models.ErrInvalidWeights,

	"runtime/models/llm.ErrInvalidStep":     llm.ErrInvalidStep,
	"runtime/models/llm.ErrClosed":          llm.ErrClosed,
	"runtime/models/llm.ErrInvalidSampling": llm.ErrInvalidSampling,

	"runtime/models/llm/grammar.ErrInvalidGrammar":    grammar.ErrInvalidGrammar,
	"runtime/models/llm/grammar.ErrUnsupportedSchema": grammar.ErrUnsupportedSchema,
	"runtime/models/llm/grammar.ErrGrammarTooLarge":   grammar.ErrGrammarTooLarge,
	"runtime/models/llm/grammar.ErrTokenRejected":     grammar.ErrTokenRejected,
	"runtime/models/llm/grammar.ErrTerminated":        grammar.ErrTerminated,
	"runtime/models/llm/grammar.ErrStackLimit":        grammar.ErrStackLimit,

	"runtime/models/ollama.ErrNotFound":      ollama.ErrNotFound,
	"runtime/models/ollama.ErrInvalid":       ollama.ErrInvalid,
	"runtime/models/ollama.ErrUnsupported":   ollama.ErrUnsupported,
	"runtime/models/ollama.ErrCorrupt":       ollama.ErrCorrupt,
	"runtime/models/ollama.ErrTemplate":      ollama.ErrTemplate,
	"runtime/models/ollama.ErrTemplateLimit": ollama.ErrTemplateLimit,

	"runtime/models/repo.ErrNotFound": repo.ErrNotFound,
	"runtime/models/repo.ErrInvalid":  repo.ErrInvalid,

	"runtime/models/tokenizer.ErrTooLong": tokenizer.ErrTooLong,
	"runtime/models/tokenizer.ErrInvalid": tokenizer.ErrInvalid,

	"runtime/models/tokenizer/bpe.ErrInvalid":       bpe.ErrInvalid,
	"runtime/models/tokenizer/bpe.ErrNoTemplate":    bpe.ErrNoTemplate,
	"runtime/models/tokenizer/bpe.ErrTemplate":      bpe.ErrTemplate,
	"runtime/models/tokenizer/bpe.ErrTemplateLimit": bpe.ErrTemplateLimit,

	"runtime/quant.ErrUnsupported": quant.ErrUnsupported,
	"runtime/quant.ErrLength":      quant.ErrLength,

	"runtime/safetensors.ErrInvalid": safetensors.ErrInvalid,

	"scheduler.ErrWrongKind":         scheduler.ErrWrongKind,
	"scheduler.ErrQueueFull":         scheduler.ErrQueueFull,
	"scheduler.ErrDraining":          scheduler.ErrDraining,
	"scheduler.ErrUnknownModel":      scheduler.ErrUnknownModel,
	"scheduler.ErrNoDevice":          scheduler.ErrNoDevice,
	"scheduler.ErrNoMatchingReplica": scheduler.ErrNoMatchingReplica,
	"scheduler.ErrDeviceNotFound":    scheduler.ErrDeviceNotFound,
	"scheduler.ErrBackend":           scheduler.ErrBackend,
	"scheduler.ErrInvalidArgument":   scheduler.ErrInvalidArgument,
	"scheduler.ErrBatchTimeout":      scheduler.ErrBatchTimeout,
}

// errorTypes holds a value of every exported error type below the edge
// (a type with an Error method), by the name parseSentinels gives it.
var errorTypes = map[string]error{
	"lifecycle.AdmissionError":        &lifecycle.AdmissionError{Model: "m"},
	"runtime/models.InvalidModelKind": models.InvalidModelKind("invalid model thing"),
	"scheduler.QueueFullError":        &scheduler.QueueFullError{RetryAfter: time.Second},
}

// parseSentinels reads the non-test Go files under below and returns every
// exported package-level variable whose name starts with Err, as
// "dir.ErrName" (dir relative to the module root, slash-separated), and
// every exported type with an Error method, as "dir.Type".
func parseSentinels(t *testing.T) (sentinels, types []string) {
	t.Helper()
	root := filepath.Join("..", "..", "..")
	fset := token.NewFileSet()
	for _, top := range below {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if d.Name() == "testdata" {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			dir, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				if fn, ok := decl.(*ast.FuncDecl); ok && fn.Name.Name == "Error" && fn.Recv != nil && len(fn.Recv.List) == 1 {
					recv := fn.Recv.List[0].Type
					if star, ok := recv.(*ast.StarExpr); ok {
						recv = star.X
					}
					if id, ok := recv.(*ast.Ident); ok && id.IsExported() {
						types = append(types, filepath.ToSlash(dir)+"."+id.Name)
					}
					continue
				}
				g, ok := decl.(*ast.GenDecl)
				if !ok || g.Tok != token.VAR {
					continue
				}
				for _, spec := range g.Specs {
					for _, n := range spec.(*ast.ValueSpec).Names {
						if n.IsExported() && strings.HasPrefix(n.Name, "Err") {
							sentinels = append(sentinels, filepath.ToSlash(dir)+"."+n.Name)
						}
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(sentinels)
	slices.Sort(types)
	return sentinels, types
}

// TestEverySentinelMapped walks the sentinels and error types of the
// packages below the edge: each must reach a client with a code other than
// INTERNAL, or be named in internalOnPurpose, so that a new one cannot
// surface as INTERNAL unnoticed.
func TestEverySentinelMapped(t *testing.T) {
	parsed, types := parseSentinels(t)
	if len(parsed) < len(sentinels) {
		t.Fatalf("parsed %d sentinels, fewer than the %d known: is the walk reading the packages?", len(parsed), len(sentinels))
	}
	for _, name := range parsed {
		err, known := sentinels[name]
		why, internal := internalOnPurpose[name]
		switch {
		case !known && !internal:
			t.Errorf("%s: a sentinel neither in sentinels (this test) nor in internalOnPurpose: give it a row of the table (or a reason to stay INTERNAL) and list it here", name)
		case !known:
			// A device's or an internal package's: not importable here,
			// stays INTERNAL for the reason given.
			if why == "" {
				t.Errorf("%s: internalOnPurpose without a reason", name)
			}
		default:
			wrapped := fmt.Errorf("op: %w", err)
			got := Code(wrapped)
			switch {
			case internal && got != codes.Internal:
				t.Errorf("%s: code %v, but internalOnPurpose says it is a bug (%s)", name, got, why)
			case !internal && got == codes.Internal:
				t.Errorf("%s surfaces as INTERNAL: give it a row of the table", name)
			case !internal && HTTPStatus(got) == http.StatusInternalServerError:
				t.Errorf("%s: code %v is HTTP 500", name, got)
			}
		}
	}
	for name := range sentinels {
		if !slices.Contains(parsed, name) {
			t.Errorf("%s: in sentinels but not found in the source: renamed or removed?", name)
		}
	}
	for name := range internalOnPurpose {
		if !slices.Contains(parsed, name) {
			t.Errorf("%s: in internalOnPurpose but not found in the source: renamed or removed?", name)
		}
	}
	// The exported error types, which errors.As matches.
	for _, name := range types {
		err, known := errorTypes[name]
		switch {
		case !known:
			t.Errorf("%s: an error type not in errorTypes (this test): give it a row of the table and list it here", name)
		case Code(fmt.Errorf("op: %w", err)) == codes.Internal:
			t.Errorf("%s surfaces as INTERNAL: give it a row of the table", name)
		}
	}
	for name := range errorTypes {
		if !slices.Contains(types, name) {
			t.Errorf("%s: in errorTypes but not found in the source: renamed or removed?", name)
		}
	}
}

// TestTableRowsReached checks that no row is shadowed by an earlier one:
// an error wrapping only a row's sentinel gets that row's code.
func TestTableRowsReached(t *testing.T) {
	for i, r := range table {
		if r.err == nil {
			continue
		}
		if got := Code(fmt.Errorf("op: %w", r.err)); got != r.code {
			t.Errorf("row %d (%v): code %v, want %v (shadowed by an earlier row)", i, r.err, got, r.code)
		}
	}
}

// TestCodeOrder pins the codes of errors that wrap two sentinels, and of
// the error types.
func TestCodeOrder(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"queue full", &scheduler.QueueFullError{RetryAfter: time.Second}, codes.ResourceExhausted},
		{"admission", fmt.Errorf("load: %w", &lifecycle.AdmissionError{Model: "m"}), codes.ResourceExhausted},
		{"device fault", fmt.Errorf("x: %w: %w", scheduler.ErrBackend, errors.New("boom")), codes.Unavailable},
		{"device fault on a request's input", fmt.Errorf("x: %w: %w", scheduler.ErrBackend, models.ErrInvalidInput), codes.Unavailable},
		{"batch timeout", fmt.Errorf("x: %w: %w", scheduler.ErrBackend, scheduler.ErrBatchTimeout), codes.Unavailable},
		{"out of device memory", fmt.Errorf("x: %w: %w", scheduler.ErrBackend, runtime.ErrOutOfMemory), codes.ResourceExhausted},
		{"pinned to no replica", fmt.Errorf("x: %w", scheduler.ErrNoMatchingReplica), codes.FailedPrecondition},
		{"cordoned", fmt.Errorf("x: %w", detect.ErrDeviceCordoned), codes.FailedPrecondition},
		{"chat template limit", fmt.Errorf("x: %w", bpe.ErrTemplateLimit), codes.InvalidArgument},
		{"stopping", fmt.Errorf("x: %w", scheduler.ErrDraining), codes.Unavailable},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{"unknown", errors.New("boom"), codes.Internal},
	}
	for _, tc := range tests {
		if got := Code(tc.err); got != tc.want {
			t.Errorf("%s: code %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestHTTPStatus(t *testing.T) {
	for c, want := range map[codes.Code]int{
		codes.OK: 200, codes.InvalidArgument: 400, codes.FailedPrecondition: 400, codes.NotFound: 404,
		codes.ResourceExhausted: 429, codes.Unavailable: 503, codes.DeadlineExceeded: 504,
		codes.Canceled: 499, codes.Internal: 500, codes.Unknown: 500,
	} {
		if got := HTTPStatus(c); got != want {
			t.Errorf("HTTPStatus(%v) = %d, want %d", c, got, want)
		}
	}
}
