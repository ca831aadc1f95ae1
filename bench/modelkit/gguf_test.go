package modelkit

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/brokerd/brokerd/runtime/safetensors"
)

// TestWriteGGUF reads the GGUF files back with a reader written from the
// format's description and checks the metadata llama.cpp needs, that
// every tensor lies aligned inside the file, that its values are the
// checkpoint's (through the llama q/k row order where the arch asks for
// it), and the vocabulary's layout. That llama.cpp itself loads these
// files and gives PyTorch's greedy tokens is bench/peers/llamacpp's check.
func TestWriteGGUF(t *testing.T) {
	tok := filepath.Join("..", "..", "runtime", "models", "tokenizer", "bpe", "testdata")
	cases := []struct {
		arch, tok, dtype string
		tied             bool
	}{
		{"llama", "llama3", "f32", false},
		{"qwen2", "qwen3", "bf16", true},
		{"qwen3", "qwen3", "f16", false},
	}
	for _, c := range cases {
		t.Run(c.arch+"-"+c.dtype, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "m", "1")
			s := LLM{Arch: c.arch, Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, Intermediate: 96, DType: "bf16", Tied: c.tied, TokenizerDir: filepath.Join(tok, c.tok)}
			if c.arch == "qwen3" {
				s.HeadDim = 32
			}
			if _, err := WriteLLM(dir, s); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "m.gguf")
			n, err := WriteGGUF(dir, path, c.dtype)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if int64(len(raw)) != n {
				t.Fatalf("WriteGGUF said %d bytes, file has %d", n, len(raw))
			}
			g := readGGUF(t, raw)
			wantArch := map[string]string{"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}[c.arch]
			if g.kv["general.architecture"] != wantArch {
				t.Fatalf("architecture %v", g.kv["general.architecture"])
			}
			for key, want := range map[string]any{".block_count": uint32(2), ".embedding_length": uint32(64), ".attention.head_count": uint32(4), ".attention.head_count_kv": uint32(2), ".feed_forward_length": uint32(96)} {
				if got := g.kv[wantArch+key]; got != want {
					t.Errorf("%s = %v, want %v", key, got, want)
				}
			}

			st, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if len(g.tensors) != len(st.Names()) {
				t.Fatalf("%d tensors, checkpoint has %d", len(g.tensors), len(st.Names()))
			}
			tokens := g.kv["tokenizer.ggml.tokens"].([]string)
			vocab, _ := st.Info("model.embed_tokens.weight")
			if len(tokens) != vocab.Shape[0] || len(g.kv["tokenizer.ggml.token_type"].([]int32)) != len(tokens) {
				t.Fatalf("%d tokens for a vocabulary of %d", len(tokens), vocab.Shape[0])
			}
			if len(g.kv["tokenizer.ggml.merges"].([]string)) == 0 {
				t.Fatal("no merges")
			}
			// Llama 3's template writes bos_token: the file names its id.
			if id, ok := g.kv["tokenizer.ggml.bos_token_id"].(uint32); c.tok == "llama3" && (!ok || tokens[id] != "<|begin_of_text|>") {
				t.Errorf("tokenizer.ggml.bos_token_id %v, want <|begin_of_text|>'s", g.kv["tokenizer.ggml.bos_token_id"])
			}

			check := func(hf, name string, permute int) {
				t.Helper()
				info, ok := g.tensors[name]
				if !ok {
					t.Fatalf("no %s", name)
				}
				want, err := st.Float32(hf)
				if err != nil {
					t.Fatal(err)
				}
				dims := slices.Clone(want.Shape)
				slices.Reverse(dims)
				if fmt.Sprint(info.dims) != fmt.Sprint(dims) {
					t.Fatalf("%s: dims %v, want %v", name, info.dims, dims)
				}
				if info.offset%32 != 0 {
					t.Fatalf("%s: offset %d not aligned", name, info.offset)
				}
				got := g.values(t, info, len(want.Data))
				cols := len(want.Data) / want.Shape[0]
				d := want.Shape[0] / max(permute, 1)
				for i, w := range want.Data {
					r, col := i/cols, i%cols
					if permute > 0 { // row h*d + half*d/2 + j is stored at h*d + 2j + half
						h, half, j := r/d, (r%d)/(d/2), r%(d/2)
						r = h*d + 2*j + half
					}
					g := got[r*cols+col]
					tol := 0.0
					if info.typ == ggmlF16 {
						tol = 1e-3 * math.Abs(float64(w))
					}
					if math.Abs(float64(g-w)) > tol && !(math.Abs(float64(w)) < 1e-4 && math.Abs(float64(g-w)) < 1e-7) {
						t.Fatalf("%s[%d]: %v, want %v", name, i, g, w)
					}
				}
			}
			perm := map[bool]int{true: 1}[c.arch == "llama"]
			check("model.embed_tokens.weight", "token_embd.weight", 0)
			check("model.layers.1.self_attn.q_proj.weight", "blk.1.attn_q.weight", perm*4)
			check("model.layers.1.self_attn.k_proj.weight", "blk.1.attn_k.weight", perm*2)
			check("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight", 0)
			check("model.norm.weight", "output_norm.weight", 0)
			if c.arch == "qwen2" {
				check("model.layers.0.self_attn.k_proj.bias", "blk.0.attn_k.bias", 0)
			}
			if c.arch == "qwen3" {
				check("model.layers.0.self_attn.q_norm.weight", "blk.0.attn_q_norm.weight", 0)
			}
			if _, ok := g.tensors["output.weight"]; ok == c.tied {
				t.Fatalf("output.weight present %v with tied %v", ok, c.tied)
			}
			if g.tensors["output_norm.weight"].typ != ggmlF32 {
				t.Fatal("norms must stay f32")
			}
		})
	}
}

func TestWriteGGUFRefuses(t *testing.T) {
	if _, err := WriteGGUF(t.TempDir(), filepath.Join(t.TempDir(), "x.gguf"), "q4_0"); err == nil {
		t.Fatal("q4_0 accepted")
	}
	if _, err := WriteGGUF(t.TempDir(), filepath.Join(t.TempDir(), "x.gguf"), "f32"); err == nil {
		t.Fatal("a directory without a checkpoint accepted")
	}
}

type ggufTensorRead struct {
	dims   []uint64
	typ    uint32
	offset uint64
}

type ggufRead struct {
	kv      map[string]any
	tensors map[string]ggufTensorRead
	data    []byte
}

func (g ggufRead) values(t *testing.T, ti ggufTensorRead, n int) []float32 {
	size := map[uint32]int{ggmlF32: 4, ggmlF16: 2, ggmlBF16: 2}[ti.typ]
	if int(ti.offset)+n*size > len(g.data) {
		t.Fatalf("tensor at %d runs past the file", ti.offset)
	}
	b := g.data[ti.offset:]
	out := make([]float32, n)
	for i := range out {
		switch ti.typ {
		case ggmlF32:
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		case ggmlF16:
			out[i] = safetensors.F16ToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
		case ggmlBF16:
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
		}
	}
	return out
}

func readGGUF(t *testing.T, raw []byte) ggufRead {
	t.Helper()
	r := bytes.NewReader(raw)
	u32 := func() uint32 { var v uint32; must(t, binary.Read(r, binary.LittleEndian, &v)); return v }
	u64 := func() uint64 { var v uint64; must(t, binary.Read(r, binary.LittleEndian, &v)); return v }
	str := func() string {
		b := make([]byte, u64())
		_, err := r.Read(b)
		must(t, err)
		return string(b)
	}
	var value func(typ uint32) any
	value = func(typ uint32) any {
		switch typ {
		case ggufUint32:
			return u32()
		case ggufInt32:
			return int32(u32())
		case ggufFloat32:
			return math.Float32frombits(u32())
		case ggufBool:
			b, err := r.ReadByte()
			must(t, err)
			return b != 0
		case ggufString:
			return str()
		case ggufArray:
			et, n := u32(), u64()
			switch et {
			case ggufString:
				s := make([]string, n)
				for i := range s {
					s[i] = str()
				}
				return s
			case ggufInt32:
				s := make([]int32, n)
				for i := range s {
					s[i] = int32(u32())
				}
				return s
			}
		}
		t.Fatalf("gguf value type %d", typ)
		return nil
	}
	if str := string(raw[:4]); str != "GGUF" {
		t.Fatalf("magic %q", str)
	}
	_, _ = r.Seek(4, 0)
	if v := u32(); v != 3 {
		t.Fatalf("version %d", v)
	}
	nt, nkv := u64(), u64()
	g := ggufRead{kv: map[string]any{}, tensors: map[string]ggufTensorRead{}}
	for range nkv {
		k := str()
		g.kv[k] = value(u32())
	}
	for range nt {
		name := str()
		dims := make([]uint64, u32())
		for i := range dims {
			dims[i] = u64()
		}
		g.tensors[name] = ggufTensorRead{dims: dims, typ: u32(), offset: u64()}
	}
	pos := int64(len(raw)) - int64(r.Len())
	pos = (pos + 31) / 32 * 32
	g.data = raw[pos:]
	return g
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestGGUFMix: the per-tensor types of llama-quantize's mixes
// (llama_tensor_get_type), on Qwen2.5-0.5B's layout (tied, rows of 896:
// K types fall back) and on a 256-divisible one (untied, 8 layers).
func TestGGUFMix(t *testing.T) {
	layout := func(layers, hidden, inter int, tied bool) []ggufMixTensor {
		ts := []ggufMixTensor{{"token_embd.weight", hidden, true}}
		for l := range layers {
			p := fmt.Sprintf("blk.%d.", l)
			ts = append(ts, ggufMixTensor{p + "attn_norm.weight", hidden, false},
				ggufMixTensor{p + "attn_q.weight", hidden, true}, ggufMixTensor{p + "attn_q.bias", 1, false},
				ggufMixTensor{p + "attn_k.weight", hidden, true}, ggufMixTensor{p + "attn_v.weight", hidden, true},
				ggufMixTensor{p + "attn_output.weight", hidden, true}, ggufMixTensor{p + "ffn_norm.weight", hidden, false},
				ggufMixTensor{p + "ffn_gate.weight", hidden, true}, ggufMixTensor{p + "ffn_up.weight", hidden, true},
				ggufMixTensor{p + "ffn_down.weight", inter, true})
		}
		ts = append(ts, ggufMixTensor{"output_norm.weight", hidden, false})
		if !tied {
			ts = append(ts, ggufMixTensor{"output.weight", hidden, true})
		}
		return ts
	}
	typeOf := func(ts []ggufMixTensor, got []uint32, name string) uint32 {
		for i, x := range ts {
			if x.Name == name {
				return got[i]
			}
		}
		t.Fatalf("no %s", name)
		return 0
	}
	// use_more_bits for 24 layers: 0-2, 21-23 and 5, 8, 11, 14, 17, 20.
	more24 := map[int]bool{0: true, 1: true, 2: true, 5: true, 8: true, 11: true, 14: true, 17: true, 20: true, 21: true, 22: true, 23: true}
	qwen := layout(24, 896, 4864, true)
	for _, c := range []struct {
		ftype                             string
		embd, q, v, vMore, down, downMore uint32
	}{
		// Qwen2.5-0.5B-Instruct-Q4_K_M.gguf as llama.cpp writes it: Q8_0
		// embeddings, Q5_0 for the 896-row matrices, Q8_0 for half of
		// attn_v, Q4_K/Q6_K for ffn_down (rows of 4864 = 19 × 256).
		{"q4_k_m", ggmlQ8_0, ggmlQ5_0, ggmlQ5_0, ggmlQ8_0, ggmlQ4_K, ggmlQ6_K},
		{"q5_k_m", ggmlQ8_0, ggmlQ5_1, ggmlQ5_1, ggmlQ8_0, ggmlQ5_K, ggmlQ6_K},
		{"q6_k", ggmlQ8_0, ggmlQ8_0, ggmlQ8_0, ggmlQ8_0, ggmlQ6_K, ggmlQ6_K},
		{"q8_0", ggmlQ8_0, ggmlQ8_0, ggmlQ8_0, ggmlQ8_0, ggmlQ8_0, ggmlQ8_0},
		{"q4_0", ggmlQ8_0, ggmlQ4_0, ggmlQ4_0, ggmlQ4_0, ggmlQ4_0, ggmlQ4_0},
		{"bf16", ggmlBF16, ggmlBF16, ggmlBF16, ggmlBF16, ggmlBF16, ggmlBF16},
	} {
		got := ggufFileTypes[c.ftype].types(qwen)
		if e := typeOf(qwen, got, "token_embd.weight"); e != c.embd {
			t.Errorf("%s: token_embd %d, want %d", c.ftype, e, c.embd)
		}
		for l := range 24 {
			p := fmt.Sprintf("blk.%d.", l)
			wantV, wantDown := c.v, c.down
			if more24[l] {
				wantV, wantDown = c.vMore, c.downMore
			}
			for name, want := range map[string]uint32{"attn_q.weight": c.q, "attn_k.weight": c.q, "attn_output.weight": c.q,
				"ffn_gate.weight": c.q, "ffn_up.weight": c.q, "attn_v.weight": wantV, "ffn_down.weight": wantDown,
				"attn_norm.weight": ggmlF32, "attn_q.bias": ggmlF32} {
				if g := typeOf(qwen, got, p+name); g != want {
					t.Errorf("%s: %s%s %d, want %d", c.ftype, p, name, g, want)
				}
			}
		}
	}

	// Rows of 256: no fallback; untied, so token_embd keeps the default
	// type and output.weight gets Q6_K (Q8_0 in a Q8_0 file).
	llama := layout(8, 512, 1536, false)
	more8 := map[int]bool{0: true, 3: true, 6: true, 7: true}
	for _, c := range []struct {
		ftype             string
		embd, out, q, big uint32 // big: attn_v / ffn_down of the use_more_bits layers
	}{
		{"q4_k_m", ggmlQ4_K, ggmlQ6_K, ggmlQ4_K, ggmlQ6_K},
		{"q5_k_m", ggmlQ5_K, ggmlQ6_K, ggmlQ5_K, ggmlQ6_K},
		{"q6_k", ggmlQ6_K, ggmlQ6_K, ggmlQ6_K, ggmlQ6_K},
		{"q8_0", ggmlQ8_0, ggmlQ8_0, ggmlQ8_0, ggmlQ8_0},
		{"q4_0", ggmlQ4_0, ggmlQ6_K, ggmlQ4_0, ggmlQ4_0},
	} {
		got := ggufFileTypes[c.ftype].types(llama)
		if e, o := typeOf(llama, got, "token_embd.weight"), typeOf(llama, got, "output.weight"); e != c.embd || o != c.out {
			t.Errorf("%s: token_embd %d, output %d; want %d, %d", c.ftype, e, o, c.embd, c.out)
		}
		for l := range 8 {
			p := fmt.Sprintf("blk.%d.", l)
			want := c.q
			if more8[l] {
				want = c.big
			}
			if v, d := typeOf(llama, got, p+"attn_v.weight"), typeOf(llama, got, p+"ffn_down.weight"); v != want || d != want {
				t.Errorf("%s: layer %d attn_v %d ffn_down %d, want %d", c.ftype, l, v, d, want)
			}
			if g := typeOf(llama, got, p+"ffn_up.weight"); g != c.q {
				t.Errorf("%s: layer %d ffn_up %d, want %d", c.ftype, l, g, c.q)
			}
		}
	}
}

// TestWriteGGUFQuantized: the writer hands each matrix to the quantizer
// with its type and shape (rows as the checkpoint has them, Llama's q/k
// reordered), lays out exactly the bytes it returns, and records the
// types and the file type; vectors stay f32.
func TestWriteGGUFQuantized(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m", "1")
	tok := t.TempDir()
	if err := WriteByteTokenizer(tok, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteLLM(dir, LLM{Arch: "llama", Layers: 8, Hidden: 256, Heads: 4, KVHeads: 2, Intermediate: 512, Vocab: 300, DType: "f32", TokenizerDir: tok}); err != nil {
		t.Fatal(err)
	}
	type call struct {
		typ        uint32
		rows, cols int
	}
	var calls []call
	// A fake quantizer: every block's bytes are its type and a counter,
	// so the test can find each tensor's bytes in the file.
	q := func(typ uint32, x []float32, rows, cols int) ([]byte, error) {
		calls = append(calls, call{typ, rows, cols})
		n, err := ggufTypeSize(typ, rows, cols)
		if err != nil {
			return nil, err
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(len(calls))
		}
		return b, nil
	}
	path := filepath.Join(t.TempDir(), "m.gguf")
	if _, err := WriteGGUFQuantized(dir, path, "q4_k_m", q); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	g := readGGUF(t, raw)
	if g.kv["general.file_type"] != uint32(15) || g.kv["general.quantization_version"] != uint32(2) {
		t.Fatalf("file_type %v, quantization_version %v", g.kv["general.file_type"], g.kv["general.quantization_version"])
	}
	if len(calls) != 2+8*7 {
		t.Fatalf("%d quantizer calls, want %d", len(calls), 2+8*7)
	}
	if c := calls[0]; c != (call{ggmlQ4_K, 300, 256}) {
		t.Fatalf("token_embd quantized as %+v", c)
	}
	if c := calls[len(calls)-1]; c != (call{ggmlQ6_K, 300, 256}) {
		t.Fatalf("output quantized as %+v", c)
	}
	for name, want := range map[string]uint32{"blk.0.attn_v.weight": ggmlQ6_K, "blk.1.attn_v.weight": ggmlQ4_K,
		"blk.1.ffn_down.weight": ggmlQ4_K, "blk.7.ffn_down.weight": ggmlQ6_K, "blk.2.attn_norm.weight": ggmlF32} {
		if ti := g.tensors[name]; ti.typ != want {
			t.Errorf("%s: type %d, want %d", name, ti.typ, want)
		}
	}
	// Every quantized tensor's bytes are those its call returned.
	seen := 0
	for name, ti := range g.tensors {
		if ti.typ == ggmlF32 {
			continue
		}
		rows, cols := int(ti.dims[1]), int(ti.dims[0])
		n, _ := ggufTypeSize(ti.typ, rows, cols)
		b := g.data[ti.offset : ti.offset+n]
		k := int(b[0]) - 1
		if k < 0 || k >= len(calls) || calls[k] != (call{ti.typ, rows, cols}) || !bytes.Equal(b, bytes.Repeat(b[:1], int(n))) {
			t.Fatalf("%s: its bytes are not the quantizer's answer for it", name)
		}
		seen++
	}
	if seen != len(calls) {
		t.Fatalf("%d quantized tensors in the file, %d calls", seen, len(calls))
	}
	if _, err := WriteGGUFQuantized(dir, path, "q4_k_m", nil); err == nil {
		t.Fatal("q4_k_m without a quantizer accepted")
	}
	if _, err := WriteGGUFQuantized(dir, path, "q3_k_s", q); err == nil {
		t.Fatal("q3_k_s accepted")
	}
}
