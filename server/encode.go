package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/brokerd/brokerd/detect"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/scheduler"
)

// Limits bound what one request may ask for.
type Limits struct {
	MaxItemsPerRequest int
	MaxItemBytes       int
}

// codecZstd is the codec of LOSSLESS codes.
const codecZstd = "zstd"

// Encode validates the request, sends SEMANTIC work through the scheduler,
// compresses LOSSLESS work here (it needs no accelerator), and answers per
// item in request order with one ExecutionInfo.
func (s *BrokerService) Encode(ctx context.Context, req *brokerv1.EncodeRequest) (*brokerv1.EncodeResponse, error) {
	start := time.Now()
	if s.models == nil {
		return nil, status.Error(codes.Unavailable, "no model is being served")
	}
	name := req.GetModel()
	if name == "" {
		name = s.models.DefaultModel()
	}
	m, ok := s.models.Builtin(name)
	if !ok {
		// Repository encoders (bert), or why name is not served.
		return s.encodeModel(ctx, req, name, start)
	}
	if err := s.validateEncode(req); err != nil {
		return nil, err
	}
	release, err := s.holdOutputs("Encode", int64(len(req.GetItems()))*encodeItemHeld)
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
	if id := req.GetDeviceId(); id != "" {
		e, err := s.inv.Device(id)
		if err != nil {
			return nil, toStatus(s.log, "Encode", err)
		}
		if e.Cordoned {
			return nil, status.Errorf(codes.FailedPrecondition, "device %s is cordoned (%s); pin another device or uncordon it", id, e.CordonReason)
		}
	}

	fid := req.GetFidelity()
	semantic := fid == brokerv1.Fidelity_FIDELITY_UNSPECIFIED || fid == brokerv1.Fidelity_FIDELITY_SEMANTIC || fid == brokerv1.Fidelity_FIDELITY_BOTH
	lossless := fid == brokerv1.Fidelity_FIDELITY_LOSSLESS || fid == brokerv1.Fidelity_FIDELITY_BOTH
	normalize := true
	if req.Normalize != nil {
		normalize = req.GetNormalize()
	}

	items := req.GetItems()
	resp := &brokerv1.EncodeResponse{Model: m.Name(), ModelVersion: m.Version(), Results: make([]*brokerv1.EncodeResult, len(items))}
	// The bytes of each item, converted once (a text item's conversion
	// copies it); a lone item's slice stays on the stack.
	var one [1][]byte
	datas := one[:0]
	if len(items) > 1 {
		datas = make([][]byte, 0, len(items))
	}
	for i, it := range items {
		data := itemBytes(it)
		datas = append(datas, data)
		resp.Results[i] = &brokerv1.EncodeResult{Id: it.GetId(), Signature: signature(data)}
	}

	// Compression runs on its own goroutine while the device works. It
	// stops between items when the caller has gone (every way out of
	// Encode waits for it), and says so in codeErr.
	var codesDone chan struct{}
	var codeTime *time.Duration
	var codeErr error
	if lossless {
		codesDone, codeTime = make(chan struct{}), new(time.Duration)
		go func() {
			defer close(codesDone)
			t := time.Now()
			for i, it := range items {
				if err := ctx.Err(); err != nil {
					codeErr = fmt.Errorf("compressing item %d: %w", i, err)
					return
				}
				resp.Results[i].Code = s.zstd.EncodeAll(itemBytes(it), nil)
				resp.Results[i].Codec = codecZstd
			}
			*codeTime = time.Since(t)
		}()
	}
	waitCodes := func() {
		if codesDone != nil {
			<-codesDone
		}
	}

	var info *brokerv1.ExecutionInfo
	if semantic {
		inputs := make([]any, len(items))
		for i, data := range datas {
			if i%64 == 0 && ctx.Err() != nil { // the caller gave up: stop the host work
				waitCodes()
				return nil, toStatus(s.log, "Encode", fmt.Errorf("featurising item %d: %w", i, ctx.Err()))
			}
			inputs[i] = m.Input(data, normalize)
		}
		out, err := s.sched.Submit(ctx, scheduler.Request{
			Model: m.Name(), Client: clientID(ctx), Priority: priority,
			DeviceID: req.GetDeviceId(), DeviceType: string(pinType), Inputs: inputs,
		})
		if err != nil {
			waitCodes()
			return nil, s.schedulerStatus("Encode", err)
		}
		for i, o := range out.Outputs {
			vec, err := m.Vector(o)
			if err != nil {
				waitCodes()
				return nil, toStatus(s.log, "Encode", fmt.Errorf("item %d: %w", i, err))
			}
			resp.Results[i].Vector = vec
			resp.Results[i].DeviceId = out.Devices[i]
		}
		info = execInfoToProto(out.Info)
	}
	waitCodes()
	if codeErr != nil {
		return nil, toStatus(s.log, "Encode", codeErr)
	}
	if !semantic {
		// Compression alone runs on the host CPU, in this call.
		info = &brokerv1.ExecutionInfo{DeviceId: "cpu:0", DeviceType: brokerv1.DeviceType_DEVICE_TYPE_CPU, ComputeNs: codeTime.Nanoseconds()}
		for _, r := range resp.Results {
			r.DeviceId = "cpu:0"
		}
		if e, err := s.inv.Device("cpu:0"); err == nil {
			info.CostUsd = e.CostPerHour / 3600 * codeTime.Seconds()
		}
	}
	info.TotalNs = time.Since(start).Nanoseconds()
	resp.Execution = info
	return resp, nil
}

func (s *BrokerService) validateEncode(req *brokerv1.EncodeRequest) error {
	items := req.GetItems()
	if len(items) == 0 {
		return status.Error(codes.InvalidArgument, "items: at least one item is required")
	}
	if len(items) > s.limits.MaxItemsPerRequest {
		return status.Errorf(codes.InvalidArgument, "items: %d items is more than --max-items-per-request %d; split the request",
			len(items), s.limits.MaxItemsPerRequest)
	}
	switch req.GetFidelity() {
	case brokerv1.Fidelity_FIDELITY_UNSPECIFIED, brokerv1.Fidelity_FIDELITY_SEMANTIC,
		brokerv1.Fidelity_FIDELITY_LOSSLESS, brokerv1.Fidelity_FIDELITY_BOTH:
	default:
		return status.Errorf(codes.InvalidArgument, "fidelity %d is invalid: want SEMANTIC, LOSSLESS or BOTH", req.GetFidelity())
	}
	for i, it := range items {
		var n int
		switch c := it.GetContent().(type) {
		case *brokerv1.EncodeItem_Text:
			n = len(c.Text)
		case *brokerv1.EncodeItem_Data:
			n = len(c.Data)
		default:
			return status.Errorf(codes.InvalidArgument, "items[%d]: no content: set text or data", i)
		}
		if n == 0 {
			return status.Errorf(codes.InvalidArgument, "items[%d]: empty item", i)
		}
		if n > s.limits.MaxItemBytes {
			return status.Errorf(codes.InvalidArgument, "items[%d]: %d bytes is more than --max-item-bytes %d", i, n, s.limits.MaxItemBytes)
		}
	}
	return nil
}

// signature is "sha256:" and data's SHA-256 in hex, built in one allocation.
func signature(data []byte) string {
	const prefix = "sha256:"
	sum := sha256.Sum256(data)
	var b strings.Builder
	b.Grow(len(prefix) + hex.EncodedLen(len(sum)))
	b.WriteString(prefix)
	var hx [2 * sha256.Size]byte
	hex.Encode(hx[:], sum[:])
	b.Write(hx[:])
	return b.String()
}

func itemBytes(it *brokerv1.EncodeItem) []byte {
	if t, ok := it.GetContent().(*brokerv1.EncodeItem_Text); ok {
		return []byte(t.Text)
	}
	return it.GetData()
}

func priorityFromProto(p brokerv1.Priority) (int, error) {
	switch p {
	case brokerv1.Priority_PRIORITY_LOW:
		return 1, nil
	case brokerv1.Priority_PRIORITY_UNSPECIFIED, brokerv1.Priority_PRIORITY_NORMAL:
		return 2, nil
	case brokerv1.Priority_PRIORITY_HIGH:
		return 3, nil
	}
	return 0, status.Errorf(codes.InvalidArgument, "priority %d is invalid: want LOW, NORMAL or HIGH", p)
}

func (s *BrokerService) pinType(t brokerv1.DeviceType) (string, error) {
	if t == brokerv1.DeviceType_DEVICE_TYPE_UNSPECIFIED {
		return "", nil
	}
	dt, ok := typeFromProto(t)
	if !ok {
		return "", status.Errorf(codes.InvalidArgument, "device_type %d is invalid", t)
	}
	return string(dt), nil
}

func execInfoToProto(in scheduler.ExecInfo) *brokerv1.ExecutionInfo {
	out := &brokerv1.ExecutionInfo{
		DeviceId:  in.DeviceID,
		BatchSize: int32(in.BatchSize),
		QueueNs:   in.Queue.Nanoseconds(),
		ComputeNs: in.Compute.Nanoseconds(),
		TotalNs:   in.Total.Nanoseconds(),
		CostUsd:   in.CostUSD,
		DeviceIds: in.DeviceIDs,
	}
	if t, err := detect.ParseType(in.DeviceType); err == nil {
		out.DeviceType = typeToProto[t]
	}
	if len(in.BatchSizes) > 0 {
		out.BatchSizes = make([]int32, len(in.BatchSizes))
		for i, b := range in.BatchSizes {
			out.BatchSizes[i] = int32(b)
		}
	}
	return out
}

// newZstd is the shared LOSSLESS encoder; EncodeAll is safe for concurrent use.
func newZstd() *zstd.Encoder {
	// Single-segment frames always carry the content size; without it
	// (the default for inputs under 256 bytes) python-zstandard's
	// ZstdDecompressor().decompress(code), the usual client call, fails.
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1), zstd.WithSingleSegment(true))
	if err != nil {
		// Only invalid options fail, and these are constants.
		panic(fmt.Sprintf("zstd encoder: %v", err))
	}
	return enc
}
