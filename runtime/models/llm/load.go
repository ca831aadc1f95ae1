package llm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// Files of a Hugging Face model directory.
const (
	FileConfig           = "config.json"
	FileGenerationConfig = "generation_config.json"
	FileWeights          = "model.safetensors"
	FileWeightsIndex     = "model.safetensors.index.json"
)

// maxJSONBytes bounds the JSON files read from a model directory.
const maxJSONBytes = 16 << 20

// LoadDir reads a model directory as downloaded from Hugging Face:
// config.json, model.safetensors or the shards model.safetensors.index.json
// names, and generation_config.json when present. opts.Tokenizer and
// opts.Chat are the caller's (built from tokenizer.json and
// tokenizer_config.json); opts.GenerationConfig, when nil, is read from the
// directory. Weights of any float dtype are converted to float32. Shard
// names must stay inside dir. Errors wrap models.ErrInvalidInput when the
// files are wrong.
func LoadDir(dir string, opts ModelOptions) (*Model, error) {
	config, err := readSmall(dir, FileConfig)
	if err != nil {
		return nil, err
	}
	if opts.GenerationConfig == nil {
		g, err := readSmall(dir, FileGenerationConfig)
		switch {
		case err == nil:
			opts.GenerationConfig = g
		case !errors.Is(err, fs.ErrNotExist):
			return nil, err
		}
	}
	files, err := weightFiles(dir)
	if err != nil {
		return nil, err
	}
	weights := map[string]models.Tensor{}
	for _, path := range files {
		if err := readWeights(path, weights); err != nil {
			return nil, err
		}
	}
	return NewModel(config, weights, opts)
}

// readSmall reads a JSON file of dir, bounded.
func readSmall(dir, name string) ([]byte, error) {
	path := filepath.Join(dir, name)
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("llm: %w", err)
	}
	if st.Size() > maxJSONBytes {
		return nil, fmt.Errorf("%w: %s is %d bytes, at most %d", models.ErrInvalidInput, path, st.Size(), maxJSONBytes)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("llm: %w", err)
	}
	return b, nil
}

// weightFiles lists the safetensors files of dir: model.safetensors, or
// the shards of the index, each once, in name order.
func weightFiles(dir string) ([]string, error) {
	if _, err := os.Stat(filepath.Join(dir, FileWeights)); err == nil {
		return []string{filepath.Join(dir, FileWeights)}, nil
	}
	raw, err := readSmall(dir, FileWeightsIndex)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s has neither %s nor %s", models.ErrInvalidInput, dir, FileWeights, FileWeightsIndex)
	}
	if err != nil {
		return nil, err
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(raw, &idx); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", models.ErrInvalidInput, FileWeightsIndex, err)
	}
	var files []string
	for tensor, f := range idx.WeightMap {
		// A shard is a plain file name in dir: nothing outside it is followed.
		if f == "" || f != filepath.Base(f) || strings.HasPrefix(f, ".") || !strings.HasSuffix(f, ".safetensors") {
			return nil, fmt.Errorf("%w: %s: tensor %q in shard %q: want a .safetensors file in the model directory", models.ErrInvalidInput, FileWeightsIndex, tensor, f)
		}
		files = append(files, filepath.Join(dir, f))
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: %s names no tensors", models.ErrInvalidInput, FileWeightsIndex)
	}
	slices.Sort(files)
	return slices.Compact(files), nil
}

// readWeights adds the float tensors of one safetensors file to weights;
// a name in two files is an error.
func readWeights(path string, weights map[string]models.Tensor) error {
	f, err := safetensors.Open(path)
	if err != nil {
		return fmt.Errorf("%w: %w", models.ErrInvalidInput, err)
	}
	defer f.Close()
	for _, name := range f.Names() {
		if _, dup := weights[name]; dup {
			return fmt.Errorf("%w: %s: tensor %q is also in another shard", models.ErrInvalidInput, path, name)
		}
		t, err := f.Float32(name)
		if err != nil {
			return fmt.Errorf("%w: %w", models.ErrInvalidInput, err)
		}
		weights[name] = t
	}
	return nil
}
