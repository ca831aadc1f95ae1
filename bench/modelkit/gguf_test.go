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
