package bpe

import (
	"strings"
	"testing"
)

// benchText is a chat prompt as the council sends one: a system and a
// user turn between Qwen's control tokens, prose with numbers, code and
// some non-ASCII text, about 16 KiB.
func benchText() string {
	para := "The advisor weighs 3 options against the memory's 1,024 records: " +
		"\"keep\", \"merge\" or \"drop\" — each with a confidence (0.0–1.0) and a reason. " +
		"func score(r Record) float64 { return r.Weight * math.Log1p(float64(r.Hits)) }\n" +
		"Les données sont réparties sur 2 cœurs; 数据在两个核心上。\n\n"
	var b strings.Builder
	b.WriteString("<|im_start|>system\nYou are one advisor of a council.<|im_end|>\n<|im_start|>user\n")
	for b.Len() < 16<<10 {
		b.WriteString(para)
	}
	b.WriteString("<|im_end|>\n<|im_start|>assistant\n")
	return b.String()
}

// BenchmarkEncode: tokens of a 16 KiB chat prompt with Qwen3's and
// Llama 3's tokenizers (added tokens found by the Aho-Corasick scan,
// then byte-level BPE).
func BenchmarkEncode(b *testing.B) {
	text := benchText()
	for _, f := range []*fixture{qwen3, llama3} {
		b.Run(f.name, func(b *testing.B) {
			tok := f.get(b)
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				if len(tok.Encode(text, false)) == 0 {
					b.Fatal("no tokens")
				}
			}
		})
	}
}
