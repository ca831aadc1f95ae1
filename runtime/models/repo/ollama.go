package repo

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/runtime/gguf"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/ollama"
)

// Models of Ollama's store (runtime/models/ollama) are served beside the
// repository's own, read-only, under Ollama's names with ":latest" left
// out as brokerd's HTTP APIs leave it out (qwen2.5:0.5b, qwen2.5,
// myuser/mymodel:q8). Each is one version (1): its GGUF blob, verified
// against its digest before first use, read as a .gguf version directory
// is; its params become the model's default sampling and its num_ctx caps
// the context. A repository directory of the same name wins.
//
// Its params' stop strings are the default stop strings and its system
// layer the system prompt of a conversation without one; its template
// layer renders chats when the GGUF has no Jinja chat template, and its
// messages layer goes before every chat's messages (ollama_chat.go).

// WithOllamaStore serves the models of an Ollama store too.
func WithOllamaStore(s *ollama.Store) Option { return func(r *Repo) { r.ollama = s } }

// ollamaName is the name a store model is served under.
func ollamaName(m ollama.Model) string { return strings.TrimSuffix(m.Name, ":latest") }

// ollamaModel finds name in the store when it is no model directory of the
// repository.
func (r *Repo) ollamaModel(name string) (ollama.Model, bool) {
	if r.ollama == nil || (validName(name) && r.modelDir(name) == nil) {
		return ollama.Model{}, false
	}
	m, err := r.ollama.Lookup(name)
	if err != nil {
		return ollama.Model{}, false
	}
	return m, true
}

// Canonical is the name a model is served under: a repository model's
// name as it is, a store model's in any form Ollama accepts (qwen2.5,
// qwen2.5:latest, library/qwen2.5:latest) as the one it is listed under.
func (r *Repo) Canonical(name string) string {
	if m, ok := r.ollamaModel(name); ok {
		return ollamaName(m)
	}
	return name
}

// ollamaEntries lists the store's models that no repository model shadows.
func (r *Repo) ollamaEntries(taken map[string]bool) []Entry {
	if r.ollama == nil {
		return nil
	}
	var out []Entry
	for _, m := range r.ollama.List() {
		name := ollamaName(m)
		if taken[name] {
			continue
		}
		e := Entry{Name: name, Kind: "llm", Versions: []int64{1}, Details: Details{
			Format: m.Details.Format, Family: m.Details.Family, ParameterSize: m.Details.ParameterSize,
			Quantization: m.Details.QuantizationLevel, FileBytes: m.Size, ModTime: m.ModTime, Digest: m.ManifestDigest,
			ChatTemplate: r.ollamaTemplate(m), System: m.System, Params: ollamaParams(m.Params),
		}}
		if m.Params.NumCtx != nil {
			e.Details.ContextLength = *m.Params.NumCtx
		}
		if m.Digest != "" {
			e.Details.File = "blobs/" + strings.Replace(m.Digest, ":", "-", 1)
		}
		if m.Err != nil {
			e.Errs = map[int64]error{1: m.Err}
		}
		out = append(out, e)
	}
	return out
}

// ollamaTemplate is the chat template store model m renders (see
// ollamaChatTemplate): its GGUF's Jinja tokenizer.chat_template, else its
// template layer, else Ollama's default. The GGUF's is read from the
// blob's header once per blob as it is (a header holds the vocabulary:
// megabytes); a blob that cannot be read shows its template layer, and
// its load says why.
func (r *Repo) ollamaTemplate(m ollama.Model) string {
	tmpl := m.Template
	if tmpl == "" {
		tmpl = ollama.DefaultTemplate
	}
	if m.Err != nil || m.Path == "" {
		return tmpl
	}
	st, err := os.Stat(m.Path)
	if err != nil {
		return tmpl
	}
	key := m.Path + "\x00" + strconv.FormatInt(st.Size(), 10) + "\x00" + st.ModTime().String()
	r.ggufTemplatesMu.Lock()
	jinja, ok := r.ggufTemplates[key]
	r.ggufTemplatesMu.Unlock()
	if !ok {
		jinja = ggufChatTemplate(m.Path)
		r.ggufTemplatesMu.Lock()
		if r.ggufTemplates == nil {
			r.ggufTemplates = map[string]string{}
		}
		// A blob replaced leaves its old key behind: the store's blobs
		// bound the map only while they stay, so start over past them.
		if len(r.ggufTemplates) >= maxGGUFTemplates {
			clear(r.ggufTemplates)
		}
		r.ggufTemplates[key] = jinja
		r.ggufTemplatesMu.Unlock()
	}
	if jinja != "" {
		return jinja
	}
	return tmpl
}

// maxGGUFTemplates bounds the store blobs whose chat template is
// remembered.
const maxGGUFTemplates = 1024

// ggufChatTemplate is a GGUF file's tokenizer.chat_template ("" when it
// has none or cannot be read).
func ggufChatTemplate(path string) (tmpl string) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	var err error
	defer faultAsError(path, &err)
	f, err := gguf.Open(path, gguf.Limits{})
	if err != nil {
		return ""
	}
	defer f.Close()
	tmpl, _ = f.String("tokenizer.chat_template")
	return tmpl
}

// ollamaParams lists a params layer's options by name, each value as
// JSON, a stop string per entry: what /api/show's parameters and a
// Modelfile's PARAMETER lines print. Options Ollama ignores are left out.
func ollamaParams(p ollama.Params) []Param {
	var out []Param
	for _, s := range p.Stop {
		out = append(out, param("stop", s))
	}
	out = optParam(out, "temperature", p.Temperature)
	out = optParam(out, "top_k", p.TopK)
	out = optParam(out, "top_p", p.TopP)
	out = optParam(out, "min_p", p.MinP)
	out = optParam(out, "typical_p", p.TypicalP)
	out = optParam(out, "repeat_penalty", p.RepeatPenalty)
	out = optParam(out, "repeat_last_n", p.RepeatLastN)
	out = optParam(out, "presence_penalty", p.PresencePenalty)
	out = optParam(out, "frequency_penalty", p.FrequencyPenalty)
	out = optParam(out, "seed", p.Seed)
	out = optParam(out, "num_predict", p.NumPredict)
	out = optParam(out, "num_keep", p.NumKeep)
	out = optParam(out, "num_ctx", p.NumCtx)
	out = optParam(out, "num_batch", p.NumBatch)
	out = optParam(out, "num_gpu", p.NumGPU)
	out = optParam(out, "main_gpu", p.MainGPU)
	out = optParam(out, "num_thread", p.NumThread)
	out = optParam(out, "use_mmap", p.UseMMap)
	return optParam(out, "draft_num_predict", p.DraftNumPredict)
}

// optParam appends a set option.
func optParam[T any](out []Param, name string, v *T) []Param {
	if v == nil {
		return out
	}
	return append(out, param(name, *v))
}

// param writes a value as JSON, with <, > and & as they are (stop strings
// are full of them).
func param(name string, v any) Param {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // strings, finite numbers and booleans always encode
	return Param{Name: name, Value: strings.TrimSuffix(b.String(), "\n")}
}

// ollamaFingerprint identifies a store model as it is now: its manifest
// (whose digest names every layer) and its blob's size and time.
func (r *Repo) ollamaFingerprint(m ollama.Model, version int64) (string, error) {
	if version != 1 {
		return "", fmt.Errorf("%w: %s is one version (1) of Ollama's store, not %d", ErrNotFound, ollamaName(m), version)
	}
	st, err := os.Stat(m.Path)
	if err != nil {
		return "", fmt.Errorf("%w: %s: its model blob: %w", ErrInvalid, ollamaName(m), err)
	}
	h := sha256.Sum256([]byte(m.ManifestDigest + "\x00" + m.Path + "\x00" + strconv.FormatInt(st.Size(), 10) + "\x00" + st.ModTime().String()))
	return hex.EncodeToString(h[:]), nil
}

// loadOllama reads a store model: the blob verified (once: the store
// remembers it), then as a GGUF version.
func (r *Repo) loadOllama(ctx context.Context, m ollama.Model, version int64) (*Loaded, error) {
	name := ollamaName(m)
	if version != 0 && version != 1 {
		return nil, fmt.Errorf("%w: %s is one version (1) of Ollama's store, not %d", ErrNotFound, name, version)
	}
	if m.Err != nil {
		return nil, m.Err
	}
	fp, err := r.ollamaFingerprint(m, 1)
	if err != nil {
		return nil, err
	}
	if !r.ollama.Verified(m) {
		r.log.Info("verifying the Ollama model's blob", zap.String("model", name), zap.String("digest", m.Digest), zap.Int64("bytes", m.Size))
	}
	last := int64(-1)
	err = r.ollama.Verify(ctx, m, func(done, total int64) {
		if pct := done * 10 / max(total, 1); pct != last {
			last = pct
			r.log.Info("verifying the Ollama model's blob", zap.String("model", name), zap.Int64("done_bytes", done), zap.Int64("of", total))
		}
	})
	if err != nil {
		return nil, err
	}
	p := &plan{r: r, dir: filepath.Dir(m.Path), kind: "llm"}
	lp, err := p.inspectGGUFAt(m.Path, m.Path)
	if err != nil {
		return nil, err
	}
	p.llm = lp
	defer p.close()
	if lp.generation, err = ollamaGeneration(m.Params); err != nil {
		return nil, fmt.Errorf("%w: %s: params: %w", ollama.ErrInvalid, name, err)
	}
	lp.stop, lp.system = r.ollamaStops(name, m.Params.Stop), m.System
	lp.chat = func(ctx context.Context, gguf llm.ChatTemplate) (llm.ChatTemplate, error) {
		return ollamaChatTemplate(ctx, name, m, gguf)
	}
	l, err := r.loadLLMWith(ctx, p, lp, name, 1, ollamaContext(m.Params, r.maxContext))
	if l != nil {
		l.Fingerprint = fp
	}
	return l, err
}

// maxDefaultStops is how many stop strings a request may carry, and so
// how many of a params layer's are kept.
const maxDefaultStops = 16

// ollamaStops keeps the params' stop strings a request could carry: at
// most 16, none empty (Ollama's own models have a handful).
func (r *Repo) ollamaStops(name string, stops []string) []string {
	var out []string
	for _, s := range stops {
		if s != "" && len(out) < maxDefaultStops {
			out = append(out, s)
		}
	}
	if len(out) < len(stops) {
		r.log.Warn("Ollama model's stop strings cut to what a request may carry", zap.String("model", name),
			zap.Int("stops", len(stops)), zap.Int("kept", len(out)))
	}
	return out
}

// ollamaContext is the context cap: the params' num_ctx under the
// repository's own cap.
func ollamaContext(p ollama.Params, repoCap int) int {
	if p.NumCtx == nil || *p.NumCtx <= 0 {
		return repoCap
	}
	if repoCap > 0 {
		return min(repoCap, *p.NumCtx)
	}
	return *p.NumCtx
}

// ollamaGeneration writes the params' sampling options as the
// generation_config.json the engine takes its defaults from. Ollama
// samples unless told otherwise: its defaults (api.DefaultOptions:
// temperature 0.8, top_k 40, top_p 0.9) fill what the params leave out. Its
// repeat_penalty applies to the last repeat_last_n tokens, which the
// engine's repetition penalty does not model: only an explicit one is
// taken.
func ollamaGeneration(p ollama.Params) ([]byte, error) {
	g := map[string]any{"do_sample": true, "temperature": float32(0.8), "top_k": 40, "top_p": float32(0.9)}
	if p.Temperature != nil {
		g["temperature"] = *p.Temperature
	}
	if p.TopP != nil {
		g["top_p"] = *p.TopP
	}
	if p.TopK != nil {
		g["top_k"] = *p.TopK
	}
	if p.MinP != nil {
		g["min_p"] = *p.MinP
	}
	if p.RepeatPenalty != nil {
		g["repetition_penalty"] = *p.RepeatPenalty
	}
	if p.NumPredict != nil && *p.NumPredict > 0 {
		g["max_new_tokens"] = *p.NumPredict
	}
	return json.Marshal(g)
}
