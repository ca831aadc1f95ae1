package repo

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/brokerd/brokerd/runtime/models"
)

// What is wrong with a model's files, as the first words of the error:
// models.ErrInvalidConfig ("invalid model config"), ErrInvalidGenerationConfig,
// ErrInvalidTokenizer, ErrInvalidWeights, safetensors.ErrInvalid ("invalid
// safetensors file"), errInvalidShardIndex, and ErrInvalid ("invalid model")
// for the layout (a file missing, not regular, too large, a link out of the
// repository or in a loop). All of them match ErrInvalid.

// errInvalidShardIndex: model.safetensors.index.json is malformed or names
// shards that are not plain files of the version directory.
const errInvalidShardIndex = models.InvalidModelKind("invalid safetensors index")

// kindOf is the kind of a problem in the JSON file named file.
func kindOf(file string) models.InvalidModelKind {
	switch filepath.Base(file) {
	case fileShardsIndex:
		return errInvalidShardIndex
	case FileGenerationConfig:
		return models.ErrInvalidGenerationConfig
	case FileTokenizer, FileTokenizerConfig:
		return models.ErrInvalidTokenizer
	}
	return models.ErrInvalidConfig
}

// kindError is an error of a kind whose words lead its message once.
type kindError struct {
	kind error
	err  error
	msg  string
}

func (e *kindError) Error() string   { return e.msg }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// invalid returns err as an error of kind (zero: the kind err already
// carries; none: ErrInvalid), with the kind's words first and not repeated
// inside: a tokenizer's own "invalid tokenizer: ..." under the model's
// directory reads "invalid tokenizer: DIR: ...". errors.Is still matches
// err's chain.
func invalid(kind models.InvalidModelKind, err error) error {
	if kind == "" {
		errors.As(err, &kind)
	}
	var k error = kind
	if kind == "" {
		k = ErrInvalid
	}
	words := k.Error()
	msg := err.Error()
	if i := strings.Index(msg, words+": "); i >= 0 {
		msg = msg[:i] + msg[i+len(words)+2:]
	}
	return &kindError{kind: k, err: err, msg: words + ": " + msg}
}

// relError is a repository error with the repository's directory left out
// of its message: model errors reach data-plane clients (ListModels,
// Triton's RepositoryIndex), which have no business knowing where the
// repository lives; paths read relative to it (NAME/VERSION/FILE).
type relError struct {
	err error
	msg string
}

func (e *relError) Error() string { return e.msg }
func (e *relError) Unwrap() error { return e.err }

// relative returns err with the repository's directory (as given and with
// its links resolved) cut from its message.
func (r *Repo) relative(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, d := range []string{r.root, filepath.Clean(r.dir)} {
		if d == "" || d == "." || d == string(filepath.Separator) {
			continue
		}
		msg = strings.ReplaceAll(msg, d+string(filepath.Separator), "")
		msg = strings.ReplaceAll(msg, d, "the repository")
	}
	if msg == err.Error() {
		return err
	}
	return &relError{err: err, msg: msg}
}

// isNotExist reports whether err says a path does not exist.
func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
