package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/scheduler"
)

// encodeModel serves Encode with a bert encoder of the repository, with
// TEI's semantics: each item is tokenised (truncated to the model's length
// unless truncate=false, which refuses a longer item), batches pad to their
// longest item and mask the padding, and the pooled vector is normalised
// unless normalize=false.
func (s *BrokerService) encodeModel(ctx context.Context, req *brokerv1.EncodeRequest, name string, start time.Time) (*brokerv1.EncodeResponse, error) {
	sv, err := s.models.Acquire(name, 0)
	if err != nil {
		return nil, toStatus(s.log, "Encode", err)
	}
	defer s.models.Release(sv)
	tm, ok := sv.Model().(textModel)
	if sv.Info.Kind != models.KindBERT || !ok {
		return nil, invalid("model %s is a %s model: Encode serves encoders (bert); use Infer", name, sv.Info.Kind)
	}
	if err := s.validateEncode(req); err != nil {
		return nil, err
	}
	release, err := s.holdOutputs("Encode", int64(len(req.GetItems()))*(encodeItemHeld+int64(sv.Info.MaxSeqLen)*tokenHeld))
	if err != nil {
		return nil, err
	}
	defer release()
	priority, err := priorityFromProto(req.GetPriority())
	if err != nil {
		return nil, err
	}
	pinType, err := s.pinType(req.GetDeviceType())
	if err != nil {
		return nil, err
	}
	if err := s.pinnedDevice("Encode", req.GetDeviceId()); err != nil {
		return nil, err
	}
	fid := req.GetFidelity()
	semantic := fid == brokerv1.Fidelity_FIDELITY_UNSPECIFIED || fid == brokerv1.Fidelity_FIDELITY_SEMANTIC || fid == brokerv1.Fidelity_FIDELITY_BOTH
	lossless := fid == brokerv1.Fidelity_FIDELITY_LOSSLESS || fid == brokerv1.Fidelity_FIDELITY_BOTH
	normalize := req.Normalize == nil || req.GetNormalize()
	truncate := req.Truncate == nil || req.GetTruncate()

	items := req.GetItems()
	resp := &brokerv1.EncodeResponse{Model: name, ModelVersion: sv.Info.Version, Results: make([]*brokerv1.EncodeResult, len(items))}
	var inputs []any
	if semantic {
		// Tokenising is host work; it runs in this handler, before queueing.
		inputs = make([]any, len(items))
		for i, it := range items {
			// A caller that gave up stops the host work too.
			if err := ctx.Err(); err != nil {
				return nil, toStatus(s.log, "Encode", fmt.Errorf("tokenising item %d: %w", i, err))
			}
			in, err := tm.Tokenize(ctx, string(itemBytes(it)), "", truncate, normalize)
			if cerr := ctx.Err(); cerr != nil { // gone while tokenising: not the text's fault
				return nil, toStatus(s.log, "Encode", fmt.Errorf("tokenising item %d: %w", i, cerr))
			}
			if err != nil {
				return nil, invalid("items[%d]: %v", i, tokenizeError(err, truncate, sv.Info.MaxSeqLen))
			}
			inputs[i] = in
		}
	}
	for i, it := range items {
		sum := sha256.Sum256(itemBytes(it))
		resp.Results[i] = &brokerv1.EncodeResult{Id: it.GetId(), Signature: "sha256:" + hex.EncodeToString(sum[:])}
		if semantic {
			// Said per item: a cut text's vector describes its beginning.
			in := inputs[i].(models.TextInput)
			resp.Results[i].Truncated = in.Truncated
			resp.Results[i].Tokens = int32(len(in.IDs))
		}
		if lossless {
			// Compression is host work too: stopped for a caller that left.
			if err := ctx.Err(); err != nil {
				return nil, toStatus(s.log, "Encode", fmt.Errorf("compressing item %d: %w", i, err))
			}
			resp.Results[i].Code = s.zstd.EncodeAll(itemBytes(it), nil)
			resp.Results[i].Codec = codecZstd
		}
	}
	info := &brokerv1.ExecutionInfo{}
	if semantic {
		out, err := s.sched.Submit(ctx, scheduler.Request{
			Model: sv.Key, Client: clientID(ctx), Priority: priority,
			DeviceID: req.GetDeviceId(), DeviceType: pinType, Inputs: inputs, Costs: sv.Costs(inputs),
		})
		if err != nil {
			return nil, s.schedulerStatus("Encode", err)
		}
		for i, o := range out.Outputs {
			v, err := outputValues(o)
			if err != nil {
				return nil, toStatus(s.log, "Encode", fmt.Errorf("model %s item %d: %w", sv.Key, i, err))
			}
			resp.Results[i].Vector = v
			resp.Results[i].DeviceId = out.Devices[i]
		}
		info = execInfoToProto(out.Info)
	} else {
		info = &brokerv1.ExecutionInfo{DeviceId: "cpu:0", DeviceType: brokerv1.DeviceType_DEVICE_TYPE_CPU, ComputeNs: time.Since(start).Nanoseconds()}
		for _, r := range resp.Results {
			r.DeviceId = "cpu:0"
		}
	}
	info.TotalNs = time.Since(start).Nanoseconds()
	resp.Execution = info
	return resp, nil
}
