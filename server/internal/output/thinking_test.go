package output

import (
	"math/rand/v2"
	"testing"
	"unicode/utf8"
)

// run feeds pieces through a parser and returns what came out of it, with
// every piece's output checked to be whole UTF-8 and free of tags.
func run(t *testing.T, inBlock bool, pieces []string) Split {
	t.Helper()
	p := NewThinking(Qwen3Tags, inBlock)
	var all Split
	add := func(s Split) {
		for _, x := range []string{s.Content, s.Reasoning} {
			if !utf8.ValidString(x) {
				t.Fatalf("pieces %q: output %q is not UTF-8", pieces, x)
			}
		}
		all.Content += s.Content
		all.Reasoning += s.Reasoning
	}
	for _, s := range pieces {
		add(p.Push(s))
	}
	add(p.Flush())
	return all
}

// splits are ways a detokeniser may cut text: whole, by character, every
// cut in two, and random runs of characters.
func splits(text string, rng *rand.Rand) [][]string {
	out := [][]string{{text}}
	var chars []string
	for _, r := range text {
		chars = append(chars, string(r))
	}
	out = append(out, chars)
	for i := range text {
		if utf8.RuneStart(text[i]) {
			out = append(out, []string{text[:i], text[i:]})
		}
	}
	for range 20 {
		var pieces []string
		for i := 0; i < len(chars); {
			n := 1 + rng.IntN(4)
			j := min(i+n, len(chars))
			s := ""
			for _, c := range chars[i:j] {
				s += c
			}
			pieces = append(pieces, s)
			i = j
		}
		out = append(out, pieces)
	}
	return out
}

func TestThinking(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name      string
		inBlock   bool
		text      string
		reasoning string
		content   string
	}{
		{name: "qwen3 thinking", text: "<think>\nThe user wants a color.\n</think>\n\nBlue.", reasoning: "The user wants a color.", content: "Blue."},
		{name: "no block", text: "Blue, surely.", content: "Blue, surely."},
		{name: "leading whitespace, no block", text: "\n\nBlue.", content: "\n\nBlue."},
		{name: "a tag later is content", text: "Use <think> and </think> tags.", content: "Use <think> and </think> tags."},
		{name: "an empty block (thinking off, the model wrote one anyway)", text: "<think>\n\n</think>\n\nHi", content: "Hi"},
		{name: "the prompt opened the block", inBlock: true, text: "\nhmm, red or blue\n</think>\n\nRed.", reasoning: "hmm, red or blue", content: "Red."},
		{name: "unfinished thinking (length)", text: "<think>\nstill going  \n", reasoning: "still going"},
		{name: "an unfinished close tag stays reasoning", text: "<think>abc </thi", reasoning: "abc </thi"},
		{name: "an unfinished open tag is content", text: "  <thin", content: "  <thin"},
		{name: "whitespace inside the reasoning stays", text: "<think>a \n b</think>c \n d", reasoning: "a \n b", content: "c \n d"},
		{name: "a close tag's look-alike", text: "<think>x </thinker> y</think>z", reasoning: "x </thinker> y", content: "z"},
		{name: "unicode on both sides", text: "<think>ünïcödé 🎨</think>\nćolor ✓", reasoning: "ünïcödé 🎨", content: "ćolor ✓"},
		{name: "whitespace then a close tag's part ends the reasoning", text: "<think>a \n </thi  \n", reasoning: "a \n </thi"},
		{name: "only whitespace in the block", inBlock: true, text: " \n \n ", reasoning: ""},
		{name: "nothing", text: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, pieces := range splits(tc.text, rng) {
				got := run(t, tc.inBlock, pieces)
				if got.Reasoning != tc.reasoning || got.Content != tc.content {
					t.Fatalf("pieces %q: reasoning %q content %q; want %q and %q", pieces, got.Reasoning, got.Content, tc.reasoning, tc.content)
				}
			}
		})
	}
}

// TestThinkingStreams: what is certain leaves at once; only what a tag
// could still claim waits.
func TestThinkingStreams(t *testing.T) {
	p := NewThinking(Qwen3Tags, false)
	steps := []struct {
		in   string
		want Split
	}{
		{"<thi", Split{}},
		{"nk>\nI", Split{Reasoning: "I"}},
		{" think", Split{Reasoning: " think"}},
		{" \n</", Split{}},
		{"think>\n", Split{}},
		{"\nSo", Split{Content: "So"}},
		{" <think>", Split{Content: " <think>"}},
	}
	for _, s := range steps {
		if got := p.Push(s.in); got != s.want {
			t.Errorf("Push(%q) = %+v, want %+v", s.in, got, s.want)
		}
	}
	if got := p.Flush(); got != (Split{}) {
		t.Errorf("Flush = %+v", got)
	}
}

func TestPromptOpensBlock(t *testing.T) {
	for prompt, want := range map[string][2]bool{ // opens, closes
		"<|im_start|>assistant\n":                        {false, false},
		"<|im_start|>assistant\n<think>\n":               {true, false},
		"<|im_start|>assistant\n<think>":                 {true, false},
		"<|im_start|>assistant\n<think>\n\n</think>\n\n": {false, true}, // Qwen3 with enable_thinking false
		"<|im_start|>user\nwhat is <think>?<|im_end|>\n": {false, false},
		"<|im_start|>user\n</think><|im_end|>\n":         {false, false},
	} {
		if got := PromptOpensBlock(Qwen3Tags, prompt); got != want[0] {
			t.Errorf("PromptOpensBlock(%q) = %v", prompt, got)
		}
		if got := PromptClosesBlock(Qwen3Tags, prompt); got != want[1] {
			t.Errorf("PromptClosesBlock(%q) = %v", prompt, got)
		}
	}
}

// TestPushTokensCountsThinking: the tokens that open, fill and close the
// block are the thinking's; whitespace before the answer and the answer
// are not, nor is anything of a model that does not open the block.
func TestPushTokensCountsThinking(t *testing.T) {
	for _, tc := range []struct {
		name    string
		inBlock bool
		tokens  []string
		want    []bool
	}{
		{"a block, then the answer", false, []string{"<think>", "\n", "hmm", " ok", "</think>", "\n\n", "Red", "."},
			[]bool{true, true, true, true, true, false, false, false}},
		// An open tag's first piece is not known to be the tag yet (where
		// the tag is a token of its own, as Qwen3's, it never is).
		{"the tag in pieces", false, []string{" ", "<th", "ink>", "x", "</", "think>", "A"},
			[]bool{false, false, true, true, true, true, false}},
		{"no block", false, []string{"Red", " <think>", "x"}, []bool{false, false, false}},
		{"the prompt opened it", true, []string{"hmm", "</think>", "A"}, []bool{true, true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewThinking(Qwen3Tags, tc.inBlock)
			for i, tok := range tc.tokens {
				if _, got := p.PushTokens(tok); got != tc.want[i] {
					t.Errorf("token %d %q: thinking %v, want %v", i, tok, got, tc.want[i])
				}
			}
		})
	}
}
