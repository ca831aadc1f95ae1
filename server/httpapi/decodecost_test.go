package httpapi

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	goruntime "runtime"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// repeated is pre, then n copies of el separated by commas, then post.
func repeated(pre, el, post string, n int) []byte {
	var b bytes.Buffer
	b.WriteString(pre)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(el)
	}
	b.WriteString(post)
	return b.Bytes()
}

func TestDecodedCostCounts(t *testing.T) {
	for _, tc := range []struct {
		body string
		want int64
	}{
		{``, 0},
		{`"a,{[b"`, 0},
		{`"a\",{[" , 1`, jsonValueCost},
		{`{}`, jsonCompositeCost + jsonValueCost},
		{`{"a":[1,2,3]}`, 2*jsonCompositeCost + 4*jsonValueCost},
		{`{"a":"\\",[1]}`, 2*jsonCompositeCost + 3*jsonValueCost},
	} {
		if got := decodedCost([]byte(tc.body)); got != tc.want {
			t.Errorf("decodedCost(%s) = %d, want %d", tc.body, got, tc.want)
		}
	}
}

// TestDecodedCostCoversDecoding: a body of many small elements, in each
// array a request type has, holds once decoded no more than it is charged
// (twice its bytes as it is read, and decodedCost), and decoding it
// allocates at most twice that (the garbage of slices grown by appends).
// The figures are allocations, not times.
func TestDecodedCostCoversDecoding(t *testing.T) {
	const n = 50_000
	for _, tc := range []struct {
		name string
		new  func() any
		body []byte
	}{
		{"openai messages", func() any { return &openaiChatRequest{} }, repeated(`{"messages":[`, `{}`, `]}`, n)},
		{"openai content parts", func() any { return &openaiChatRequest{} }, repeated(`{"messages":[{"content":[`, `{}`, `]}]}`, n)},
		{"openai tools", func() any { return &openaiChatRequest{} }, repeated(`{"tools":[`, `{}`, `]}`, n)},
		{"openai stop", func() any { return &openaiChatRequest{} }, repeated(`{"stop":[`, `""`, `]}`, n)},
		{"openai logit_bias", func() any { return &openaiChatRequest{} }, repeated(`{"logit_bias":{`, `"1":1`, `}}`, n)},
		{"ollama messages", func() any { return &ollamaChatRequest{} }, repeated(`{"messages":[`, `{}`, `]}`, n)},
		{"ollama images", func() any { return &ollamaChatRequest{} }, repeated(`{"messages":[{"images":[`, `""`, `]}]}`, n)},
		{"ollama tools", func() any { return &ollamaChatRequest{} }, repeated(`{"tools":[`, `{}`, `]}`, n)},
		{"ollama generate images", func() any { return &ollamaGenerateRequest{} }, repeated(`{"images":[`, `""`, `]}`, n)},
		{"ollama options", func() any { return &ollamaChatRequest{} }, repeated(`{"options":{"stop":[`, `""`, `]}}`, n)},
		{"prompts", func() any { return &openaiCompletionRequest{} }, repeated(`{"prompt":[`, `""`, `]}`, n)},
		{"embed input", func() any { return &ollamaEmbedRequest{} }, repeated(`{"input":[`, `""`, `]}`, n)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := tc.new()
			charged := 2*int64(len(tc.body)) + decodedCost(tc.body)
			var before, decoded, kept goruntime.MemStats
			goruntime.GC()
			goruntime.ReadMemStats(&before)
			err := decode(httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(tc.body)), v)
			goruntime.ReadMemStats(&decoded)
			goruntime.GC()
			goruntime.ReadMemStats(&kept)
			if err != nil {
				t.Fatal(err)
			}
			// The body read whole, once, is in both figures.
			if alloc := int64(decoded.TotalAlloc - before.TotalAlloc); alloc > 2*charged {
				t.Errorf("decoding %d bytes allocated %d, more than twice the %d charged", len(tc.body), alloc, charged)
			}
			if live := int64(kept.HeapAlloc) - int64(before.HeapAlloc); live > charged {
				t.Errorf("the decoded request holds %d bytes, more than the %d charged", live, charged)
			}
			goruntime.KeepAlive(v)
		})
	}
}

// TestDecodingChargedFirst: a small body that would decode into more than
// the in-flight budget is refused before it is decoded.
func TestDecodingChargedFirst(t *testing.T) {
	const budget = 64 << 20
	h := New(&fakeBackend{}, Options{MaxBodyBytes: 64 << 20, Admit: func(route string, n int64) (func(), error) {
		if n > budget {
			return nil, status.Errorf(codes.InvalidArgument, "%s: the request needs %d bytes in flight, more than the whole budget of %d", route, n, budget)
		}
		return func() {}, nil
	}})
	body := repeated(`{"model":"qwen","messages":[`, `{}`, `]}`, 1<<20) // 3 MiB
	need := decodedCost(body)
	if need <= budget {
		t.Fatalf("the body would decode into %d bytes, within the budget", need)
	}
	for _, path := range []string{"/api/chat", "/v1/chat/completions"} {
		var before, after goruntime.MemStats
		goruntime.GC()
		goruntime.ReadMemStats(&before)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
		goruntime.ReadMemStats(&after)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "whole budget") {
			t.Errorf("%s: %d %s", path, w.Code, w.Body)
		}
		// The body read whole, never its structs.
		if alloc := int64(after.TotalAlloc - before.TotalAlloc); alloc > need/8 {
			t.Errorf("%s: refusing it allocated %d bytes; decoding it would have been %d", path, alloc, need)
		}
	}
}
