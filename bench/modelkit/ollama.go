package modelkit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// OllamaModel is what WriteOllamaModel puts beside a GGUF in an Ollama
// store; an empty field leaves its layer (or config field) out.
type OllamaModel struct {
	Params   string // the params layer: a JSON object of Ollama options
	System   string // the system prompt layer
	Template string // the template layer: Ollama's Go text/template
	Messages string // the messages layer: a JSON array of {"role", "content"}
	Family   string // the config blob's model_family
	FileType string // the config blob's file_type (Q8_0, Q4_K_M, ...)
}

// WriteOllamaModel lays out a model in an Ollama store as `ollama pull`
// leaves it: the GGUF file gguf and m's layers as blobs/sha256-<hex>, and
// the manifest naming them under
// manifests/registry.ollama.ai/library/<model>/<tag>.
func WriteOllamaModel(store, model, tag, gguf string, m OllamaModel) error {
	if err := os.MkdirAll(filepath.Join(store, "blobs"), 0o755); err != nil {
		return err
	}
	layer := func(media string, b []byte) (map[string]any, error) {
		sum := sha256.Sum256(b)
		hx := hex.EncodeToString(sum[:])
		if err := os.WriteFile(filepath.Join(store, "blobs", "sha256-"+hx), b, 0o644); err != nil {
			return nil, err
		}
		return map[string]any{"mediaType": media, "digest": "sha256:" + hx, "size": len(b)}, nil
	}
	raw, err := os.ReadFile(gguf)
	if err != nil {
		return err
	}
	cfgJSON, err := json.Marshal(map[string]string{"model_format": "gguf", "model_family": m.Family, "file_type": m.FileType})
	if err != nil {
		return err
	}
	cfg, err := layer("application/vnd.docker.container.image.v1+json", cfgJSON)
	if err != nil {
		return err
	}
	var layers []any
	for _, l := range []struct{ media, data string }{
		{"application/vnd.ollama.image.model", string(raw)},
		{"application/vnd.ollama.image.params", m.Params},
		{"application/vnd.ollama.image.system", m.System},
		{"application/vnd.ollama.image.template", m.Template},
		{"application/vnd.ollama.image.messages", m.Messages},
	} {
		if l.data == "" {
			continue
		}
		ly, err := layer(l.media, []byte(l.data))
		if err != nil {
			return err
		}
		layers = append(layers, ly)
	}
	mf, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
		"config": cfg, "layers": layers})
	if err != nil {
		return err
	}
	dir := filepath.Join(store, "manifests", "registry.ollama.ai", "library", model)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("ollama store: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, tag), mf, 0o644)
}
