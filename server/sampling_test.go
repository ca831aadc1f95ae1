package server

import (
	"testing"

	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/models/llm"
)

// TestSamplingFromProto: a request's fields override the model's defaults;
// a top_p of 0 the request sets keeps only the most likely token (the
// engine's 0 is "off"), one it leaves out keeps the default.
func TestSamplingFromProto(t *testing.T) {
	d := llm.Sampling{Temperature: 0.7, TopP: 0.9, TopK: 40}
	for _, tc := range []struct {
		name string
		p    *brokerv1.SamplingParams
		ok   func(s llm.Sampling) bool
	}{
		{"defaults", nil, func(s llm.Sampling) bool { return s.TopP == 0.9 && s.Temperature == 0.7 && s.TopK == 40 }},
		{"top_p set", &brokerv1.SamplingParams{TopP: proto.Float32(0.5)}, func(s llm.Sampling) bool { return s.TopP == 0.5 }},
		{"top_p 0: the best token", &brokerv1.SamplingParams{TopP: proto.Float32(0)}, func(s llm.Sampling) bool { return s.TopP > 0 && s.TopP < 1e-30 }},
		{"top_p 1: off", &brokerv1.SamplingParams{TopP: proto.Float32(1)}, func(s llm.Sampling) bool { return s.TopP == 1 }},
		{"temperature 0", &brokerv1.SamplingParams{Temperature: proto.Float32(0)}, func(s llm.Sampling) bool { return s.Temperature == 0 && s.TopP == 0.9 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := samplingFromProto(tc.p, d)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.ok(s) {
				t.Errorf("%+v", s)
			}
		})
	}
}
