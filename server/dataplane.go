package server

import (
	"context"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/scheduler"
)

// GetStats returns per model and device queue and latency statistics: one
// row per model (device_id empty) and one per replica.
func (s *BrokerService) GetStats(ctx context.Context, req *brokerv1.GetStatsRequest) (*brokerv1.GetStatsResponse, error) {
	if s.sched == nil {
		return &brokerv1.GetStatsResponse{}, nil
	}
	key := req.GetModel()
	if key != "" && s.models != nil {
		// Repository models queue under keys of their own: a name answers
		// with its serving version's rows, and so does that version's own
		// name (NAME@VERSION), which the rows carry.
		sv := s.models.Lookup(key)
		if sv == nil {
			sv = s.models.LookupLabel(key)
		}
		if sv == nil {
			return nil, toStatus(s.log, "GetStats", s.models.Missing(key))
		}
		key = sv.Key
	}
	resp := &brokerv1.GetStatsResponse{}
	for _, st := range s.sched.Stats(key) {
		resp.Stats = append(resp.Stats, statsToProto(st))
	}
	return resp, nil
}

func statsToProto(st scheduler.QueueStats) *brokerv1.QueueStats {
	out := &brokerv1.QueueStats{
		Model:                st.Model,
		DeviceId:             st.DeviceID,
		Queued:               st.Queued,
		Running:              st.Running,
		Completed:            st.Completed,
		Failed:               map[string]int64{},
		MeanBatchSize:        st.MeanBatchSize,
		ItemsPerSecond:       st.ItemsPerSecond,
		RecentItemsPerSecond: st.RecentItemsPerSecond,
		Latency:              latencyToProto(st.Latency),
		MaxBatch:             int32(st.MaxBatch),
		Healthy:              st.Healthy,
		ConsecutiveFailures:  int32(st.ConsecutiveFailures),
		LastError:            st.LastError,
	}
	for k, v := range st.Failed {
		out.Failed[k] = v
	}
	if g := st.Gen; g != nil {
		out.Generation = &brokerv1.GenerationStats{
			PromptTokensPerSecond: g.PromptTokensPerSecond,
			OutputTokensPerSecond: g.OutputTokensPerSecond,
			TimeToFirstToken:      latencyToProto(g.TimeToFirstToken),
			InterTokenLatency:     latencyToProto(g.InterToken),
			KvCacheBlocksUsed:     int64(g.KV.UsedBlocks),
			KvCacheBlocksTotal:    int64(g.KV.TotalBlocks),
			Preemptions:           g.Preemptions,
			PromptTokens:          g.PromptTokens,
			GeneratedTokens:       g.GeneratedTokens,
			KvCacheDtype:          g.KV.DType,
			SpecDraftTokens:       g.DraftTokens,
			SpecAcceptedTokens:    g.AcceptedTokens,
			PrefixCacheHitTokens:  g.KV.PrefixHitTokens,
			DeferredSamples:       g.DeferredSamples,
		}
	}
	return out
}

func latencyToProto(l scheduler.LatencySummary) *brokerv1.LatencySummary {
	return &brokerv1.LatencySummary{
		MeanSeconds: l.Mean.Seconds(),
		P50Seconds:  l.P50.Seconds(),
		P95Seconds:  l.P95.Seconds(),
		P99Seconds:  l.P99.Seconds(),
	}
}

// Drain stops accepting work, completes everything accepted, and answers
// when done; with exit set, brokerd then stops.
func (s *BrokerService) Drain(ctx context.Context, req *brokerv1.DrainRequest) (*brokerv1.DrainResponse, error) {
	if s.sched == nil {
		return nil, status.Error(codes.FailedPrecondition, "no data plane to drain")
	}
	before := s.completed()
	if s.draining != nil {
		s.draining()
	}
	s.log.Info("draining", zap.Bool("exit", req.GetExit()))
	if err := s.sched.Drain(ctx); err != nil {
		return nil, toStatus(s.log, "Drain", err)
	}
	done := s.completed() - before
	s.log.Info("drained", zap.Int64("completed_while_draining", done))
	if req.GetExit() && s.onDrained != nil {
		s.onDrained()
	}
	return &brokerv1.DrainResponse{Completed: done}, nil
}

func (s *BrokerService) completed() int64 {
	var n int64
	for _, st := range s.sched.Stats("") {
		if st.DeviceID == "" {
			n += st.Completed
		}
	}
	return n
}
