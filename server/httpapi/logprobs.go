package httpapi

import (
	"math"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// Logprobs in the APIs' shapes, from the gRPC deltas' LogprobEntry (each
// token's text and bytes come from the server, which detokenises them).

// maxTopLogprobs is the most alternatives a token may ask for (OpenAI's
// chat limit; vLLM's default max_logprobs).
const maxTopLogprobs = 20

// tokenLogprob is a token in OpenAI's chat shape, which Ollama's API
// shares: its text, log-probability and UTF-8 bytes.
type tokenLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// logprobEntry is a chosen token and the most likely alternatives at its
// position.
type logprobEntry struct {
	tokenLogprob
	TopLogprobs []tokenLogprob `json:"top_logprobs"`
}

// unlikely is what OpenAI writes for a log-probability too small to say
// (JSON has no -Inf).
const unlikely = -9999.0

func toTokenLogprob(t *brokerv1.TokenLogprob) tokenLogprob {
	lp := float64(t.GetLogprob())
	if math.IsNaN(lp) || lp < unlikely {
		lp = unlikely
	}
	b := t.GetBytes()
	ints := make([]int, len(b))
	for i, c := range b {
		ints[i] = int(c)
	}
	return tokenLogprob{Token: t.GetText(), Logprob: lp, Bytes: ints}
}

// logprobEntries converts a delta's logprobs (nil for none).
func logprobEntries(es []*brokerv1.LogprobEntry) []logprobEntry {
	if len(es) == 0 {
		return nil
	}
	out := make([]logprobEntry, len(es))
	for i, e := range es {
		out[i] = logprobEntry{tokenLogprob: toTokenLogprob(e.GetChosen()), TopLogprobs: make([]tokenLogprob, len(e.GetTop()))}
		for j, t := range e.GetTop() {
			out[i].TopLogprobs[j] = toTokenLogprob(t)
		}
	}
	return out
}

// legacyLogprobs is /v1/completions' logprobs object: parallel lists, and
// each token's offset in the choice's text (in characters, as Python's
// str counts them, which is what vLLM and OpenAI give).
type legacyLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// add appends a delta's entries; offset is the choice's text length so
// far in characters, advanced by each token's text.
func (l *legacyLogprobs) add(es []*brokerv1.LogprobEntry, offset *int) {
	for _, e := range es {
		c := toTokenLogprob(e.GetChosen())
		l.Tokens = append(l.Tokens, c.Token)
		l.TokenLogprobs = append(l.TokenLogprobs, c.Logprob)
		top := make(map[string]float64, len(e.GetTop()))
		for _, t := range e.GetTop() {
			a := toTokenLogprob(t)
			if _, dup := top[a.Token]; !dup { // two ids of one text: the likelier
				top[a.Token] = a.Logprob
			}
		}
		l.TopLogprobs = append(l.TopLogprobs, top)
		l.TextOffset = append(l.TextOffset, *offset)
		*offset += utf8.RuneCountInString(c.Token)
	}
}

// newLegacyLogprobs returns empty lists (not nulls) for a choice.
func newLegacyLogprobs() *legacyLogprobs {
	return &legacyLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
}

// checkTopLogprobs validates an alternatives count.
func checkTopLogprobs(param string, n int) error {
	if n < 0 || n > maxTopLogprobs {
		return paramError(param, "invalid_value", "Invalid '%s': %d; expected 0 to %d.", param, n, maxTopLogprobs)
	}
	return nil
}

// ollamaLogprobs checks Ollama's logprobs and top_logprobs and sets them
// on sp.
func ollamaLogprobs(sp *brokerv1.SamplingParams, logprobs bool, top int) error {
	if top < 0 || top > maxTopLogprobs {
		return status.Errorf(codes.InvalidArgument, "top_logprobs %d is invalid: 0 to %d", top, maxTopLogprobs)
	}
	// As in Ollama, top_logprobs applies only when logprobs is true: no
	// logprobs are computed or sent otherwise.
	sp.Logprobs = logprobs
	if logprobs {
		sp.TopLogprobs = int32(top)
	}
	return nil
}
