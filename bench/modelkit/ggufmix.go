package modelkit

import (
	"fmt"
	"strings"
)

// The type of each tensor in a quantized GGUF, as llama.cpp's
// llama-quantize chooses it: llama_tensor_get_type in src/llama-quant.cpp
// (read at ggml-org/llama.cpp 007dbbf; the rules for these file types are
// the same in the llama.cpp node-llama-cpp 3.21.1 bundles), for the dense
// llama, qwen2 and qwen3 models modelkit writes, without an importance
// matrix and without --pure or per-tensor overrides. What is left out,
// because it cannot apply to these models: the Falcon, MoE (n_expert 8),
// 70B and IQ/Q2/Q3 file-type rules, fused attn_qkv tensors.

// ggufMix is one file type: its llama_ftype number and default type.
type ggufMix struct {
	fileType  uint32 // general.file_type (enum llama_ftype)
	def       uint32 // the matrices' type before the per-tensor rules
	quantized bool
	kMix      bool // the Q4_K_M / Q5_K_M rule for attn_v and ffn_down
}

var ggufFileTypes = map[string]ggufMix{
	"f32":    {fileType: 0, def: ggmlF32},
	"f16":    {fileType: 1, def: ggmlF16},
	"bf16":   {fileType: 32, def: ggmlBF16},
	"q4_0":   {fileType: 2, def: ggmlQ4_0, quantized: true},
	"q8_0":   {fileType: 7, def: ggmlQ8_0, quantized: true},
	"q4_k_m": {fileType: 15, def: ggmlQ4_K, quantized: true, kMix: true},
	"q5_k_m": {fileType: 17, def: ggmlQ5_K, quantized: true, kMix: true},
	"q6_k":   {fileType: 18, def: ggmlQ6_K, quantized: true},
}

// ggufMixTensor is what the rules look at: the GGUF name, the row length
// (ne[0]) and whether llama-quantize quantizes it at all (2-D weights
// other than norms; modelkit writes norms and biases as f32 vectors).
type ggufMixTensor struct {
	Name     string
	Cols     int
	Quantize bool
}

// ggufBlock is each type's block: elements and bytes.
var ggufBlock = map[uint32][2]int{
	ggmlF32: {1, 4}, ggmlF16: {1, 2}, ggmlBF16: {1, 2},
	ggmlQ4_0: {32, 18}, ggmlQ4_1: {32, 20}, ggmlQ5_0: {32, 22}, ggmlQ5_1: {32, 24}, ggmlQ8_0: {32, 34},
	ggmlQ4_K: {256, 144}, ggmlQ5_K: {256, 176}, ggmlQ6_K: {256, 210},
}

// ggufTypeSize is the bytes of rows × cols values of typ.
func ggufTypeSize(typ uint32, rows, cols int) (uint64, error) {
	b, ok := ggufBlock[typ]
	if !ok {
		return 0, fmt.Errorf("ggml type %d", typ)
	}
	if cols%b[0] != 0 {
		return 0, fmt.Errorf("rows of %d are not whole blocks of %d (type %d)", cols, b[0], typ)
	}
	return uint64(rows) * uint64(cols/b[0]) * uint64(b[1]), nil
}

// types returns llama-quantize's type for each tensor, given in file
// order (the counters of attn_v and ffn_down advance in that order, as
// llama.cpp's do).
func (m ggufMix) types(ts []ggufMixTensor) []uint32 {
	out := make([]uint32, len(ts))
	// llama.cpp counts attn_v and ffn_down tensors first, and treats the
	// embeddings as tied until it sees output.weight.
	nV, nDown, tied := 0, 0, true
	for _, t := range ts {
		switch {
		case t.Name == "output.weight":
			tied = false
		case strings.Contains(t.Name, "attn_v.weight"):
			nV++
		case strings.Contains(t.Name, "ffn_down"):
			nDown++
		}
	}
	// use_more_bits: the first and last eighth of the layers and every
	// third one between.
	moreBits := func(i, n int) bool { return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2 }
	iV, iDown := 0, 0
	for k, t := range ts {
		if !t.Quantize {
			out[k] = ggmlF32
			continue
		}
		typ := m.def
		if !m.quantized {
			out[k] = typ
			continue
		}
		switch {
		case t.Name == "output.weight" || tied && t.Name == "token_embd.weight":
			// The output matrix (or the tied embeddings): Q8_0 where the
			// rows are not whole blocks of the default type, else Q6_K
			// unless the file is Q8_0.
			if t.Cols%ggufBlock[typ][0] != 0 {
				typ = ggmlQ8_0
			} else if typ != ggmlQ8_0 {
				typ = ggmlQ6_K
			}
		case t.Name == "token_embd.weight":
			// untied embeddings: the default type for these file types.
		case strings.Contains(t.Name, "attn_v.weight"):
			if m.kMix && moreBits(iV, nV) {
				typ = ggmlQ6_K
			}
			iV++
		case strings.Contains(t.Name, "ffn_down"):
			if m.kMix && moreBits(iDown, nDown) {
				typ = ggmlQ6_K
			}
			iDown++
		}
		// tensor_type_fallback: rows that are not whole blocks of a K type
		// (Qwen2.5-0.5B's 896) take a 32-element type of about as many
		// bits, or F16 (other types have no fallback: ggufTypeSize
		// refuses them).
		if fb, ok := map[uint32]uint32{ggmlQ4_K: ggmlQ5_0, ggmlQ5_K: ggmlQ5_1, ggmlQ6_K: ggmlQ8_0}[typ]; ok && t.Cols%ggufBlock[typ][0] != 0 {
			typ = fb
			if t.Cols%ggufBlock[typ][0] != 0 {
				typ = ggmlF16
			}
		}
		out[k] = typ
	}
	return out
}
