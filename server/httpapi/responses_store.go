package httpapi

import (
	"container/list"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// responseStore keeps the Responses API's stored responses in memory, the
// least recently used dropped first to stay within max bytes: each one's
// object, its input items, and its whole conversation (what a
// continuation by previous_response_id starts from). A caller sees only
// its own (its API key's, or without keys its address's). Nothing
// survives a restart, as in vLLM's store.
type responseStore struct {
	max int64 // 0: nothing is stored

	mu    sync.Mutex
	used  int64
	order *list.List // of *storedResponse, most recently used first
	byKey map[string]*list.Element

	count, bytes prometheus.GaugeFunc
	evicted      prometheus.Counter
}

type storedResponse struct {
	key     string
	object  json.RawMessage
	input   []json.RawMessage
	history []*brokerv1.ChatMessage
	size    int64
}

// storedOverhead is what an entry costs besides its bytes.
const storedOverhead = 512

func newResponseStore(max int64) *responseStore {
	s := &responseStore{max: max, order: list.New(), byKey: map[string]*list.Element{}}
	s.count = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "brokerd", Subsystem: "http", Name: "stored_responses",
		Help: "Responses API responses kept for previous_response_id and GET /v1/responses/{id}."}, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return float64(s.order.Len())
	})
	s.bytes = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "brokerd", Subsystem: "http", Name: "stored_response_bytes",
		Help: "Bytes the stored responses hold (at most --responses-store-bytes)."}, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return float64(s.used)
	})
	s.evicted = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "brokerd", Subsystem: "http", Name: "stored_responses_evicted_total",
		Help: "Stored responses dropped, least recently used first, to make room for newer ones."})
	return s
}

func (s *responseStore) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.count, s.bytes, s.evicted}
}

func storeKey(client, id string) string { return client + "\x00" + id }

// put stores a response; one larger than the whole store is not kept.
func (s *responseStore) put(client, id string, object map[string]any, input []json.RawMessage, history []*brokerv1.ChatMessage) {
	if s.max <= 0 {
		return
	}
	e := &storedResponse{key: storeKey(client, id), object: mustJSON(object), input: input, history: history}
	e.size = storedOverhead + int64(len(e.object)+len(e.key))
	for _, in := range input {
		e.size += int64(len(in)) + 24
	}
	for _, m := range history {
		e.size += int64(proto.Size(m)) + 64
	}
	if e.size > s.max {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeLocked(e.key)
	for s.used+e.size > s.max {
		s.removeLocked(s.order.Back().Value.(*storedResponse).key)
		s.evicted.Inc()
	}
	s.byKey[e.key] = s.order.PushFront(e)
	s.used += e.size
}

func (s *responseStore) get(client, id string) (*storedResponse, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.byKey[storeKey(client, id)]
	if !ok {
		return nil, false
	}
	s.order.MoveToFront(el)
	return el.Value.(*storedResponse), true
}

func (s *responseStore) delete(client, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.removeLocked(storeKey(client, id))
}

func (s *responseStore) removeLocked(key string) bool {
	el, ok := s.byKey[key]
	if !ok {
		return false
	}
	s.order.Remove(el)
	delete(s.byKey, key)
	s.used -= el.Value.(*storedResponse).size
	return true
}

// notStored is the 404 of a response id the caller has none of.
func (h *Handler) notStored(id string) error {
	return &httpError{code: http.StatusNotFound, err: status.Errorf(codes.NotFound,
		"Response with id '%s' not found: brokerd keeps responses stored with store true, the most recently used first, in %d bytes (--responses-store-bytes)", id, h.store.max)}
}

func (h *Handler) getResponse(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("stream") == "true" {
		h.fail(w, r, paramError("stream", "invalid_value", "streaming a stored response again is not supported: get it whole"))
		return
	}
	e, ok := h.store.get(clientOf(r), r.PathValue("id"))
	if !ok {
		h.fail(w, r, h.notStored(r.PathValue("id")))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(e.object, '\n'))
}

func (h *Handler) deleteResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !h.store.delete(clientOf(r), id) {
		h.fail(w, r, h.notStored(id))
		return
	}
	writeJSON(w, map[string]any{"id": id, "object": "response", "deleted": true})
}

func (h *Handler) cancelResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, ok := h.store.get(clientOf(r), id); !ok {
		h.fail(w, r, h.notStored(id))
		return
	}
	h.fail(w, r, paramError("response_id", "invalid_value", "Only background responses can be cancelled: response '%s' has completed", id))
}

// responseInputItems lists a stored response's input items, as OpenAI
// pages them: limit (1 to 100, 20), order (desc, the newest first, or
// asc), after (an item id).
func (h *Handler) responseInputItems(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	e, ok := h.store.get(clientOf(r), id)
	if !ok {
		h.fail(w, r, h.notStored(id))
		return
	}
	q := r.URL.Query()
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			h.fail(w, r, paramError("limit", "invalid_value", "Invalid 'limit': %q; expected 1 to 100.", v))
			return
		}
		limit = n
	}
	items := slices.Clone(e.input)
	switch q.Get("order") {
	case "", "desc":
		slices.Reverse(items)
	case "asc":
	default:
		h.fail(w, r, paramError("order", "invalid_value", "Invalid 'order': %q; expected asc or desc.", q.Get("order")))
		return
	}
	ids := make([]string, len(items))
	for i, it := range items {
		var v struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(it, &v)
		ids[i] = v.ID
	}
	if after := q.Get("after"); after != "" {
		i := slices.Index(ids, after)
		if i < 0 {
			h.fail(w, r, paramError("after", "invalid_value", "Invalid 'after': no input item %q in response %s.", after, id))
			return
		}
		items, ids = items[i+1:], ids[i+1:]
	}
	more := len(items) > limit
	if more {
		items, ids = items[:limit], ids[:limit]
	}
	var first, last any
	if len(ids) > 0 {
		first, last = ids[0], ids[len(ids)-1]
	}
	writeJSON(w, map[string]any{"object": "list", "data": items, "first_id": first, "last_id": last, "has_more": more})
}
