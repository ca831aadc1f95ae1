package llm

// Speculative decoding by prompt lookup (vLLM's "ngram" method, llama.cpp's
// lookup decoding): the tokens that followed an earlier occurrence of the
// sequence's last few tokens are a guess at what comes next. A decode step
// runs the guess after the last token and samples every row; each drafted
// token that equals what the sequence samples at its row is kept, so one
// step, one read of the weights, may give several tokens. Sampling a row
// and comparing it with the draft draws exactly what decoding without the
// draft would (a draft is a point mass: keeping it when the draw equals it
// is speculative sampling's acceptance rule), from the same RNG draws, so
// greedy and seeded sequences give the same tokens either way, up to
// rounding: a sequence's several rows go through attention's row kernel,
// its one decode row through the group kernel, which sum in another order
// (doc.go: logprobs agree to 1e-5), so a near tie may go the other way.

// The n-gram lengths a draft is looked up by: the longest suffix of 3 to 5
// tokens that occurred before (vLLM's prompt_lookup_min and _max in its
// examples). Shorter matches (a JSON `":`) would guess wrong too often.
const (
	ngramMin = 3
	ngramMax = 5
)

// proposeNgram returns up to k tokens that followed the earliest of the
// longest earlier occurrences of hist's last ngramMin to ngramMax tokens
// (vLLM's NgramProposer: the earliest, which is in the prompt when the
// prompt has it, the text an answer quotes), or nil. One pass over hist.
func proposeNgram(hist []int32, k int) []int32 {
	n := len(hist)
	if k <= 0 || n <= ngramMin {
		return nil
	}
	best, at := 0, 0
	// An occurrence ending at e (exclusive) matches the suffix over its
	// last m tokens; e < n, so a token follows it.
	for e := ngramMin; e < n && best < ngramMax; e++ {
		m := 0
		for m < ngramMax && m < e && hist[e-1-m] == hist[n-1-m] {
			m++
		}
		if m > best {
			best, at = m, e
		}
	}
	if best < ngramMin {
		return nil
	}
	return append([]int32(nil), hist[at:min(at+k, n)]...)
}
