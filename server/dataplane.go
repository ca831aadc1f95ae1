package server

import (
	"context"
	"fmt"
	"strings"

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
		// Repository models queue under NAME@VERSION: the serving version's
		// rows answer for the name.
		sv := s.models.Lookup(key)
		if sv == nil {
			// The rows name NAME@VERSION: that spelling answers too.
			if name, _, ok := strings.Cut(key, "@"); ok {
				if byName := s.models.Lookup(name); byName != nil && fmt.Sprintf("%s@%d", name, byName.Info.Version) == key {
					sv = byName
				}
			}
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
		Latency: &brokerv1.LatencySummary{
			MeanSeconds: st.Latency.Mean.Seconds(),
			P50Seconds:  st.Latency.P50.Seconds(),
			P95Seconds:  st.Latency.P95.Seconds(),
			P99Seconds:  st.Latency.P99.Seconds(),
		},
	}
	for k, v := range st.Failed {
		out.Failed[k] = v
	}
	return out
}

// Drain stops accepting work, completes everything accepted, and answers
// when done; with exit set, brokerd then stops.
func (s *BrokerService) Drain(ctx context.Context, req *brokerv1.DrainRequest) (*brokerv1.DrainResponse, error) {
	if s.sched == nil {
		return nil, status.Error(codes.FailedPrecondition, "no data plane to drain")
	}
	before := s.completed()
	if s.dp.Draining != nil {
		s.dp.Draining()
	}
	s.log.Info("draining", zap.Bool("exit", req.GetExit()))
	if err := s.sched.Drain(ctx); err != nil {
		return nil, toStatus(s.log, "Drain", err)
	}
	done := s.completed() - before
	s.log.Info("drained", zap.Int64("completed_while_draining", done))
	if req.GetExit() && s.dp.OnDrained != nil {
		s.dp.OnDrained()
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
