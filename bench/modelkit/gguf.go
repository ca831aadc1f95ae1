package modelkit

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/brokerd/brokerd/runtime/safetensors"
)

// GGUF (llama.cpp's model file, version 3) pieces this writer uses; the
// format is described in ggml's docs/gguf.md.
const (
	ggufAlignment = 32

	ggufUint32  = 4
	ggufInt32   = 5
	ggufFloat32 = 6
	ggufBool    = 7
	ggufString  = 8
	ggufArray   = 9

	ggmlF32  = 0
	ggmlF16  = 1
	ggmlQ4_0 = 2
	ggmlQ4_1 = 3
	ggmlQ5_0 = 6
	ggmlQ5_1 = 7
	ggmlQ8_0 = 8
	ggmlQ4_K = 12
	ggmlQ5_K = 13
	ggmlQ6_K = 14
	ggmlBF16 = 30

	// A Q8_0 block: an f16 scale and 32 int8 quants.
	q80Elems = 32
	q80Bytes = 34

	// llama.cpp token types.
	tokenNormal      = 1
	tokenControl     = 3
	tokenUserDefined = 4
	tokenUnused      = 5
)

// ggufArch is what llama.cpp calls each Hugging Face architecture, and the
// name of the pre-tokenizer llama.cpp applies to its tokenizer.
var ggufArch = map[string]struct{ name, pre string }{
	"LlamaForCausalLM": {"llama", "llama-bpe"},
	"Qwen2ForCausalLM": {"qwen2", "qwen2"},
	"Qwen3ForCausalLM": {"qwen3", "qwen2"},
}

// WriteGGUF writes the checkpoint WriteLLM wrote in dir as a GGUF file at
// path, with the matrices stored as dtype (f32, f16, bf16 or q8_0; norms
// and biases stay f32, as llama.cpp's converter leaves them), so llama.cpp
// runs the same weights brokerd does. The tensor names, metadata keys, the
// q/k row order of Llama (llama.cpp rotates interleaved pairs, Hugging Face
// rotates halves) and the byte-level BPE vocabulary follow llama.cpp's
// convert_hf_to_gguf.py. It returns the bytes written. q8_0 uses
// QuantizeQ8_0 (ggml's bytes); WriteGGUFQuantized writes every other
// quantized type through ggml's own quantizer.
func WriteGGUF(dir, path, dtype string) (int64, error) {
	switch dtype {
	case "f32", "f16", "bf16", "q8_0":
	default:
		return 0, fmt.Errorf("gguf dtype %q: want f32, f16, bf16 or q8_0", dtype)
	}
	return WriteGGUFQuantized(dir, path, dtype, nil)
}

// Quantizer quantizes rows × cols float32 weights to ggml type typ and
// returns the blocks: ggml's own ggml_quantize_chunk, e.g.
// runtime/quant/ggmlref's Lib.Quantize, so the files hold exactly what
// llama.cpp's quantizer writes.
type Quantizer func(typ uint32, x []float32, rows, cols int) ([]byte, error)

// FileTypes are the file types WriteGGUFQuantized writes, as llama.cpp's
// llama-quantize names them.
var FileTypes = []string{"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k"}

// WriteGGUFQuantized is WriteGGUF for any of FileTypes: the matrices get
// the types llama.cpp's llama-quantize gives them for that file type
// (ggufMix), quantized by q (nil: only f32, f16, bf16 and q8_0, which
// need no quantizer).
func WriteGGUFQuantized(dir, path, ftype string, q Quantizer) (int64, error) {
	mix, ok := ggufFileTypes[ftype]
	if !ok {
		return 0, fmt.Errorf("gguf file type %q: want one of %v", ftype, FileTypes)
	}
	if q == nil && mix.def != ggmlF32 && mix.def != ggmlF16 && mix.def != ggmlBF16 && mix.def != ggmlQ8_0 {
		return 0, fmt.Errorf("gguf file type %s needs a quantizer (ggml's ggml_quantize_chunk)", ftype)
	}
	var cfg struct {
		Architectures []string `json:"architectures"`
		Vocab         int      `json:"vocab_size"`
		Hidden        int      `json:"hidden_size"`
		Layers        int      `json:"num_hidden_layers"`
		Heads         int      `json:"num_attention_heads"`
		KVHeads       int      `json:"num_key_value_heads"`
		HeadDim       int      `json:"head_dim"`
		Intermediate  int      `json:"intermediate_size"`
		MaxPositions  int      `json:"max_position_embeddings"`
		RMSEps        float64  `json:"rms_norm_eps"`
		RopeTheta     float64  `json:"rope_theta"`
		EOS           []int    `json:"eos_token_id"`
		BOS           *int     `json:"bos_token_id"`
		Tied          bool     `json:"tie_word_embeddings"`
	}
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return 0, err
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return 0, fmt.Errorf("config.json: %w", err)
	}
	if len(cfg.Architectures) != 1 {
		return 0, fmt.Errorf("config.json: architectures %v", cfg.Architectures)
	}
	hfArch := cfg.Architectures[0]
	a, ok := ggufArch[hfArch]
	if !ok {
		return 0, fmt.Errorf("architecture %s: no GGUF mapping", hfArch)
	}
	arch := a.name
	if cfg.HeadDim == 0 {
		cfg.HeadDim = cfg.Hidden / cfg.Heads
	}

	st, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		return 0, fmt.Errorf("gguf wants a single model.safetensors: %w", err)
	}
	defer st.Close()

	tok, err := ggufVocab(filepath.Join(dir, "tokenizer.json"), cfg.Vocab)
	if err != nil {
		return 0, err
	}

	g := &ggufFile{}
	g.kv("general.architecture", ggufString, arch)
	g.kv("general.name", ggufString, filepath.Base(filepath.Dir(dir)))
	g.kv("general.alignment", ggufUint32, uint32(ggufAlignment))
	g.kv("general.file_type", ggufUint32, mix.fileType)
	if mix.quantized {
		g.kv("general.quantization_version", ggufUint32, uint32(2)) // GGML_QNT_VERSION
	}
	g.kv(arch+".block_count", ggufUint32, uint32(cfg.Layers))
	g.kv(arch+".context_length", ggufUint32, uint32(cfg.MaxPositions))
	g.kv(arch+".embedding_length", ggufUint32, uint32(cfg.Hidden))
	g.kv(arch+".feed_forward_length", ggufUint32, uint32(cfg.Intermediate))
	g.kv(arch+".attention.head_count", ggufUint32, uint32(cfg.Heads))
	g.kv(arch+".attention.head_count_kv", ggufUint32, uint32(cfg.KVHeads))
	g.kv(arch+".attention.key_length", ggufUint32, uint32(cfg.HeadDim))
	g.kv(arch+".attention.value_length", ggufUint32, uint32(cfg.HeadDim))
	g.kv(arch+".rope.dimension_count", ggufUint32, uint32(cfg.HeadDim))
	g.kv(arch+".rope.freq_base", ggufFloat32, float32(cfg.RopeTheta))
	g.kv(arch+".attention.layer_norm_rms_epsilon", ggufFloat32, float32(cfg.RMSEps))
	g.kv(arch+".vocab_size", ggufUint32, uint32(cfg.Vocab))
	g.kv("tokenizer.ggml.model", ggufString, "gpt2")
	g.kv("tokenizer.ggml.pre", ggufString, a.pre)
	g.kv("tokenizer.ggml.tokens", ggufArray, tok.tokens)
	g.kv("tokenizer.ggml.token_type", ggufArray, tok.types)
	g.kv("tokenizer.ggml.merges", ggufArray, tok.merges)
	if len(cfg.EOS) > 0 {
		g.kv("tokenizer.ggml.eos_token_id", ggufUint32, uint32(cfg.EOS[0]))
	}
	// The chat template and the BOS id, as the converter takes them from
	// config.json and tokenizer_config.json: a template's bos_token (Llama
	// 3's <|begin_of_text|>) needs the id.
	var tc struct {
		ChatTemplate string          `json:"chat_template"`
		BOS          json.RawMessage `json:"bos_token"` // a string, or {"content": ...}
	}
	if raw, err := readMaybeZst(filepath.Join(dir, "tokenizer_config.json")); err == nil && json.Unmarshal(raw, &tc) == nil {
		var bos struct {
			Content string `json:"content"`
		}
		if cfg.BOS == nil && (json.Unmarshal(tc.BOS, &bos.Content) == nil || json.Unmarshal(tc.BOS, &bos) == nil) && bos.Content != "" {
			if id := slices.Index(tok.tokens, bos.Content); id >= 0 {
				cfg.BOS = &id
			}
		}
	}
	if cfg.BOS != nil && *cfg.BOS >= 0 && *cfg.BOS < cfg.Vocab {
		g.kv("tokenizer.ggml.bos_token_id", ggufUint32, uint32(*cfg.BOS))
	}
	g.kv("tokenizer.ggml.add_bos_token", ggufBool, false)
	if tc.ChatTemplate != "" {
		g.kv("tokenizer.chat_template", ggufString, tc.ChatTemplate)
	}

	// Hugging Face names → llama.cpp names, in llama.cpp's order.
	type tensor struct {
		hf, name string
		typ      uint32
		permute  int // heads whose q/k rows to reorder (Llama), 0: none
		rows     int
		cols     int
	}
	var ts []tensor
	for _, n := range ggufNames(arch, cfg.Layers, cfg.Heads, cfg.KVHeads, cfg.Tied) {
		info, ok := st.Info(n.hf)
		if !ok {
			continue
		}
		t := tensor{hf: n.hf, name: n.name, typ: ggmlF32, permute: n.permute, cols: info.Shape[len(info.Shape)-1]}
		t.rows = int(info.NumElements()) / max(t.cols, 1)
		if n.matrix {
			t.typ = mix.def
		}
		ts = append(ts, t)
	}
	if want := len(st.Names()); len(ts) != want {
		return 0, fmt.Errorf("gguf: mapped %d of the checkpoint's %d tensors", len(ts), want)
	}
	// llama-quantize's choice of type per tensor for the file type.
	mt := make([]ggufMixTensor, len(ts))
	for i, t := range ts {
		mt[i] = ggufMixTensor{Name: t.name, Cols: t.cols, Quantize: t.typ != ggmlF32}
	}
	for i, typ := range mix.types(mt) {
		ts[i].typ = typ
	}

	var offset uint64
	infos := make([]ggufTensorInfo, len(ts))
	for i, t := range ts {
		ti, _ := st.Info(t.hf)
		dims := make([]uint64, len(ti.Shape))
		for j, d := range ti.Shape { // GGUF lists dimensions innermost first
			dims[len(dims)-1-j] = uint64(d)
		}
		size, err := ggufTypeSize(t.typ, t.rows, t.cols)
		if err != nil {
			return 0, fmt.Errorf("gguf %s: %s: %w", ftype, t.hf, err)
		}
		infos[i] = ggufTensorInfo{name: t.name, dims: dims, typ: t.typ, offset: offset}
		offset = alignUp(offset+size, ggufAlignment)
	}

	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	cw := &countWriter{w: bufio.NewWriterSize(f, 1<<20)}
	fail := func(err error) (int64, error) {
		_ = f.Close()
		_ = os.Remove(path)
		return 0, err
	}
	if err := g.writeHeader(cw, infos); err != nil {
		return fail(err)
	}
	for _, t := range ts {
		if err := cw.pad(ggufAlignment); err != nil {
			return fail(err)
		}
		x, err := st.Float32(t.hf)
		if err != nil {
			return fail(err)
		}
		if t.permute > 0 {
			permuteRope(x.Data, t.permute, len(x.Data)/x.Shape[0], false)
		}
		if err := writeData(cw, x.Data, t.typ, t.rows, t.cols, q); err != nil {
			return fail(fmt.Errorf("%s: %w", t.name, err))
		}
	}
	if err := cw.w.(*bufio.Writer).Flush(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	return cw.n, nil
}

// ggufName is one checkpoint tensor's llama.cpp name.
type ggufName struct {
	hf, name string
	matrix   bool // quantized with the file type (norms and biases stay f32)
	permute  int  // heads whose q/k rows llama.cpp orders differently (Llama), 0: none
}

// ggufNames maps the Hugging Face names a checkpoint of arch (llama.cpp's
// name) may have to llama.cpp's, in llama.cpp's order; a checkpoint has a
// subset (biases only in Qwen2, q/k norms only in Qwen3).
func ggufNames(arch string, layers, heads, kvHeads int, tied bool) []ggufName {
	permQ, permK := 0, 0
	if arch == "llama" {
		permQ, permK = heads, kvHeads
	}
	ns := []ggufName{{"model.embed_tokens.weight", "token_embd.weight", true, 0}}
	for l := range layers {
		hp, gp := fmt.Sprintf("model.layers.%d.", l), fmt.Sprintf("blk.%d.", l)
		ns = append(ns,
			ggufName{hp + "input_layernorm.weight", gp + "attn_norm.weight", false, 0},
			ggufName{hp + "self_attn.q_proj.weight", gp + "attn_q.weight", true, permQ},
			ggufName{hp + "self_attn.q_proj.bias", gp + "attn_q.bias", false, permQ},
			ggufName{hp + "self_attn.k_proj.weight", gp + "attn_k.weight", true, permK},
			ggufName{hp + "self_attn.k_proj.bias", gp + "attn_k.bias", false, permK},
			ggufName{hp + "self_attn.v_proj.weight", gp + "attn_v.weight", true, 0},
			ggufName{hp + "self_attn.v_proj.bias", gp + "attn_v.bias", false, 0},
			ggufName{hp + "self_attn.q_norm.weight", gp + "attn_q_norm.weight", false, 0},
			ggufName{hp + "self_attn.k_norm.weight", gp + "attn_k_norm.weight", false, 0},
			ggufName{hp + "self_attn.o_proj.weight", gp + "attn_output.weight", true, 0},
			ggufName{hp + "post_attention_layernorm.weight", gp + "ffn_norm.weight", false, 0},
			ggufName{hp + "mlp.gate_proj.weight", gp + "ffn_gate.weight", true, 0},
			ggufName{hp + "mlp.up_proj.weight", gp + "ffn_up.weight", true, 0},
			ggufName{hp + "mlp.down_proj.weight", gp + "ffn_down.weight", true, 0},
		)
	}
	ns = append(ns, ggufName{"model.norm.weight", "output_norm.weight", false, 0})
	if !tied {
		ns = append(ns, ggufName{"lm_head.weight", "output.weight", true, 0})
	}
	return ns
}

// permuteRope reorders the rows of a q or k projection (rows × cols, or a
// bias with cols 1) from Hugging Face's rotate-half order to the
// interleaved pairs llama.cpp's Llama rope expects: within each head, row
// half*D/2+j moves to 2j+half (convert_hf_to_gguf.py's permute). With
// undo, the other way.
func permuteRope(x []float32, heads, cols int, undo bool) {
	rows := len(x) / cols
	d := rows / heads
	src := slices.Clone(x)
	for h := range heads {
		for half := range 2 {
			for j := range d / 2 {
				hf, gg := (h*d+half*d/2+j)*cols, (h*d+2*j+half)*cols
				if undo {
					hf, gg = gg, hf
				}
				copy(x[gg:gg+cols], src[hf:hf+cols])
			}
		}
	}
}

func writeData(w io.Writer, x []float32, typ uint32, rows, cols int, q Quantizer) error {
	if typ != ggmlF32 && typ != ggmlF16 && typ != ggmlBF16 {
		var b []byte
		var err error
		if q != nil {
			b, err = q(typ, x, rows, cols)
		} else if typ == ggmlQ8_0 {
			b = QuantizeQ8_0(x)
		} else {
			err = fmt.Errorf("type %d needs a quantizer", typ)
		}
		if err != nil {
			return err
		}
		if want, _ := ggufTypeSize(typ, rows, cols); uint64(len(b)) != want {
			return fmt.Errorf("the quantizer wrote %d bytes of type %d, want %d", len(b), typ, want)
		}
		_, err = w.Write(b)
		return err
	}
	const chunk = 1 << 16
	var buf []byte
	for i := 0; i < len(x); i += chunk {
		part := x[i:min(i+chunk, len(x))]
		buf = buf[:0]
		for _, v := range part {
			switch typ {
			case ggmlF32:
				buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
			case ggmlF16:
				buf = binary.LittleEndian.AppendUint16(buf, safetensors.Float32ToF16(v))
			case ggmlBF16:
				buf = binary.LittleEndian.AppendUint16(buf, safetensors.Float32ToBF16(v))
			}
		}
		if _, err := w.Write(buf); err != nil {
			return err
		}
	}
	return nil
}

type ggufVocabulary struct {
	tokens, merges []string
	types          []int32
}

// ggufVocab is tokenizer.json's byte-level BPE vocabulary as llama.cpp's
// converter lays it out: one token per id up to the model's vocabulary
// size (ids the tokenizer does not use become unused [PADn] tokens),
// special added tokens as control tokens, and the merges as "a b".
func ggufVocab(path string, vocab int) (ggufVocabulary, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return ggufVocabulary{}, err
	}
	var tj struct {
		Model struct {
			Type   string            `json:"type"`
			Vocab  map[string]int    `json:"vocab"`
			Merges []json.RawMessage `json:"merges"`
		} `json:"model"`
		AddedTokens []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
	}
	if err := json.Unmarshal(raw, &tj); err != nil {
		return ggufVocabulary{}, fmt.Errorf("tokenizer.json: %w", err)
	}
	if tj.Model.Type != "BPE" {
		return ggufVocabulary{}, fmt.Errorf("tokenizer.json: model type %q, want BPE", tj.Model.Type)
	}
	v := ggufVocabulary{tokens: make([]string, vocab), types: make([]int32, vocab)}
	for i := range v.tokens {
		v.tokens[i], v.types[i] = "[PAD"+strconv.Itoa(i)+"]", tokenUnused
	}
	set := func(id int, s string, typ int32) error {
		if id < 0 || id >= vocab {
			return fmt.Errorf("tokenizer.json: token id %d outside the model's vocabulary of %d", id, vocab)
		}
		v.tokens[id], v.types[id] = s, typ
		return nil
	}
	for s, id := range tj.Model.Vocab {
		if err := set(id, s, tokenNormal); err != nil {
			return v, err
		}
	}
	for _, at := range tj.AddedTokens {
		typ := int32(tokenUserDefined)
		if at.Special {
			typ = tokenControl
		}
		if err := set(at.ID, at.Content, typ); err != nil {
			return v, err
		}
	}
	for _, m := range tj.Model.Merges {
		var s string
		var pair []string
		switch {
		case json.Unmarshal(m, &s) == nil:
		case json.Unmarshal(m, &pair) == nil && len(pair) == 2:
			s = pair[0] + " " + pair[1]
		default:
			return v, fmt.Errorf("tokenizer.json: merge %s", m)
		}
		v.merges = append(v.merges, s)
	}
	return v, nil
}

type ggufKV struct {
	key string
	typ uint32
	val any
}

type ggufTensorInfo struct {
	name   string
	dims   []uint64
	typ    uint32
	offset uint64
}

type ggufFile struct{ kvs []ggufKV }

func (g *ggufFile) kv(key string, typ uint32, val any) { g.kvs = append(g.kvs, ggufKV{key, typ, val}) }

func (g *ggufFile) writeHeader(w io.Writer, tensors []ggufTensorInfo) error {
	var b []byte
	str := func(s string) {
		b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = append(b, "GGUF"...)
	b = binary.LittleEndian.AppendUint32(b, 3)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(tensors)))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(g.kvs)))
	for _, kv := range g.kvs {
		str(kv.key)
		b = binary.LittleEndian.AppendUint32(b, kv.typ)
		switch v := kv.val.(type) {
		case string:
			str(v)
		case uint32:
			b = binary.LittleEndian.AppendUint32(b, v)
		case float32:
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		case bool:
			if v {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		case []string:
			b = binary.LittleEndian.AppendUint32(b, ggufString)
			b = binary.LittleEndian.AppendUint64(b, uint64(len(v)))
			for _, s := range v {
				str(s)
			}
		case []int32:
			b = binary.LittleEndian.AppendUint32(b, ggufInt32)
			b = binary.LittleEndian.AppendUint64(b, uint64(len(v)))
			for _, x := range v {
				b = binary.LittleEndian.AppendUint32(b, uint32(x))
			}
		default:
			return fmt.Errorf("gguf: key %s: value of type %T", kv.key, v)
		}
	}
	for _, t := range tensors {
		str(t.name)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(t.dims)))
		for _, d := range t.dims {
			b = binary.LittleEndian.AppendUint64(b, d)
		}
		b = binary.LittleEndian.AppendUint32(b, t.typ)
		b = binary.LittleEndian.AppendUint64(b, t.offset)
	}
	_, err := w.Write(b)
	return err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func (c *countWriter) pad(align int64) error {
	if r := c.n % align; r != 0 {
		_, err := c.Write(make([]byte, align-r))
		return err
	}
	return nil
}

func alignUp(n, a uint64) uint64 { return (n + a - 1) / a * a }

// QuantizeQ8_0 quantizes x (a multiple of 32 values) to ggml's Q8_0 blocks
// as its reference quantize_row_q8_0_ref does: per block of 32, the scale
// d = max|x|/127 stored as f16, and the quants round(x/d).
func QuantizeQ8_0(x []float32) []byte {
	out := make([]byte, 0, len(x)/q80Elems*q80Bytes)
	for b := 0; b+q80Elems <= len(x); b += q80Elems {
		blk := x[b : b+q80Elems]
		amax := float32(0)
		for _, v := range blk {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d := amax / 127
		id := float32(0)
		if d != 0 {
			id = 1 / d
		}
		out = binary.LittleEndian.AppendUint16(out, safetensors.Float32ToF16(d))
		for _, v := range blk {
			out = append(out, byte(int8(math.Round(float64(v*id)))))
		}
	}
	return out
}
