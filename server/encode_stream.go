package server

import (
	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// Part sizes of EncodeStream: well under gRPC clients' default 4 MiB
// receive limit, large enough that the per-message cost stays small.
const (
	defaultPartBytes = 1 << 20
	minPartBytes     = 64 << 10
)

// EncodeStream answers an Encode request in parts: the same validation,
// limits, scheduling and results as Encode, sent in order, each part at
// most max_part_bytes (a single larger result goes alone).
func (s *BrokerService) EncodeStream(req *brokerv1.EncodeStreamRequest, stream brokerv1.BrokerService_EncodeStreamServer) error {
	limit := int(req.GetMaxPartBytes())
	switch {
	case limit < 0:
		return invalid("max_part_bytes %d is invalid: 0 (1 MiB) or at least %d", limit, minPartBytes)
	case limit == 0:
		limit = defaultPartBytes
	case limit < minPartBytes:
		limit = minPartBytes
	}
	resp, err := s.Encode(stream.Context(), req.GetRequest())
	if err != nil {
		return err
	}
	return sendParts(resp, limit, stream.Send)
}

// sendParts splits resp's results into parts of at most limit bytes.
func sendParts(resp *brokerv1.EncodeResponse, limit int, send func(*brokerv1.EncodeStreamResponse) error) error {
	results := resp.GetResults()
	total := int32(len(results))
	part := &brokerv1.EncodeStreamResponse{Total: total}
	size := 0
	for i, r := range results {
		// A repeated message field costs its size plus a tag and a length
		// prefix of at most 5 bytes.
		n := proto.Size(r) + 6
		if len(part.Results) > 0 && size+n > limit {
			if err := send(part); err != nil {
				return err
			}
			part = &brokerv1.EncodeStreamResponse{Offset: int32(i), Total: total}
			size = 0
		}
		part.Results = append(part.Results, r)
		size += n
	}
	part.Model, part.ModelVersion, part.Execution = resp.GetModel(), resp.GetModelVersion(), resp.GetExecution()
	return send(part)
}
