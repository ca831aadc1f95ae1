package lifecycle

import (
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
)

// placed is one Replica of a Served version.
type placed struct {
	deviceID string
	r        instance
	bytes    int64 // reserved against the device's budget
	maxBatch int
}

// Served is one loaded model version: the built-in encoder or a model of
// the repository, with its replicas.
//
// Its fields are set before it is published and never change after, so the
// request path and ListModels read them without a lock.
type Served struct {
	Info models.Info
	Key  string // the scheduler's queue name
	// Label is the model version's name, as Stats rows and the metrics'
	// model label show it: NAME@VERSION for a repository model (a hot
	// reload's instance too: its queue key differs, its label does not),
	// the name alone for a built-in.
	Label string

	kind        servable // what it is: Builtin, Model or LLM says which
	fingerprint string   // of the repository files it was read from
	replicas    []placed
	gate        *gate
}

// ServedModel is a repository batch model's Served outside any Set (no
// replicas, no gate), for tests of what reads a Served.
func ServedModel(info models.Info, m models.Model) *Served {
	return &Served{Info: info, kind: batchServable{m: m}}
}

// Builtin is the built-in encoder it is; nil for repository models.
func (s *Served) Builtin() Encoder {
	if b, ok := s.kind.(builtinServable); ok {
		return b.e
	}
	return nil
}

// Model is the repository batch model it is (served through Infer, and
// Encode for encoders); nil for built-ins and generators.
func (s *Served) Model() models.Model {
	if b, ok := s.kind.(batchServable); ok {
		return b.m
	}
	return nil
}

// LLM is the decoder LLM it is (served through Generate and Chat); nil
// for other models.
func (s *Served) LLM() *llm.Model {
	if g, ok := s.kind.(llmServable); ok {
		return g.m
	}
	return nil
}

// Costs are the items' shares of a batch's token budget (nil: 1 each).
func (s *Served) Costs(payloads []any) []int {
	m := s.Model()
	if m == nil || s.Info.MaxSeqLen <= 0 {
		return nil
	}
	c := make([]int, len(payloads))
	for i, p := range payloads {
		c[i] = m.Cost(p)
	}
	return c
}

// DeviceIDs are the devices its replicas run on.
func (s *Served) DeviceIDs() []string {
	ids := make([]string, len(s.replicas))
	for i, p := range s.replicas {
		ids[i] = p.deviceID
	}
	return ids
}

// Replicas is how many replicas serve it.
func (s *Served) Replicas() int { return len(s.replicas) }

// ReplicaInfo describes one replica of a served version.
type ReplicaInfo struct {
	DeviceID string
	// MaxBatch is its batch limit in items, or its running set of
	// sequences for a generator.
	MaxBatch int
}

// ReplicaInfos describes its replicas.
func (s *Served) ReplicaInfos() []ReplicaInfo {
	out := make([]ReplicaInfo, len(s.replicas))
	for i, p := range s.replicas {
		out[i] = ReplicaInfo{DeviceID: p.deviceID, MaxBatch: p.maxBatch}
	}
	return out
}

// MemoryBytes is the device memory its replicas reserve.
func (s *Served) MemoryBytes() int64 {
	var n int64
	for _, p := range s.replicas {
		n += p.bytes
	}
	return n
}
