// Package server is brokerd's edge: the gRPC services (broker.v1, KServe
// v2, health, reflection) and the HTTP APIs' wiring, interceptors, metrics
// of RPCs, and the translation of errors from the packages below into gRPC
// status codes. NewEdge builds its servers; package daemon serves them.
package server

import (
	"context"
	"fmt"
	"time"

	"github.com/klauspost/compress/zstd"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/lifecycle"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/scheduler"
)

// DefaultBaseBatch is the base batch used for the report's batch plans; each
// model has its own base batch.
const DefaultBaseBatch = 8

// Inventory is what the broker service needs of the device inventory.
type Inventory interface {
	Devices() []detect.Entry
	Device(id string) (detect.Entry, error)
	Cordon(id, reason string) (detect.Entry, error)
	Uncordon(id string) (detect.Entry, error)
	Notes() []string
	Select(p detect.Policy) detect.Selection
}

// Policy is the configuration the admin RPCs report and plan with.
type Policy struct {
	Select   detect.Policy
	Factors  detect.Factors
	Memory   detect.MemoryStrategy
	Costs    detect.CostTable
	Runtimes []runtime.Info
	Version  string
	Hostname string
}

// Scheduler is what the data plane needs of the scheduler.
type Scheduler interface {
	Submit(ctx context.Context, req scheduler.Request) (scheduler.Response, error)
	Generate(ctx context.Context, req scheduler.GenRequest) (*scheduler.GenStream, error)
	Cordon(deviceID string, on bool)
	Drain(ctx context.Context) error
	Stats(model string) []scheduler.QueueStats
	Health(deviceID string) scheduler.Health
}

// DataPlane is what the data-plane RPCs (Encode, Infer, Generate, Chat,
// the model RPCs, GetStats and Drain) run on; BrokerService embeds it. A
// zero DataPlane serves the admin RPCs only.
type DataPlane struct {
	sched  Scheduler
	models modelCatalog
	limits Limits
	// onDrained is called once a Drain RPC asking brokerd to exit has
	// drained everything (the daemon stops then).
	onDrained func()
	// draining is called when a drain starts, so health can go NOT_SERVING.
	draining func()
	// testGenerator replaces the decoder LLMs of the models (unit tests of
	// the edge generate with fakes); nil: each model's own.
	testGenerator func(*lifecycle.Served) generator
	// budget is the in-flight byte budget generation calls are charged
	// to for what their sequences hold (nil: not charged).
	budget *byteBudget
}

// modelCatalog is what the RPCs need of the model lifecycle
// (lifecycle.Set): what serves a name, holding it while a request runs,
// and the administration of loads.
type modelCatalog interface {
	Acquire(name string, version int64) (*lifecycle.Served, error)
	Release(sv *lifecycle.Served)
	Lookup(name string) *lifecycle.Served
	LookupLabel(label string) *lifecycle.Served
	Missing(name string) error
	Builtin(name string) (lifecycle.Encoder, bool)
	DefaultModel() string
	ComputeDType(deviceID string) (runtime.DType, bool)
	Load(ctx context.Context, name string, version int64) (*lifecycle.Served, lifecycle.Action, error)
	Unload(ctx context.Context, name string) (*lifecycle.Served, error)
	Catalog() (lifecycle.Catalog, error)
}

// BrokerService implements broker.v1.BrokerService over local interfaces.
// It embeds UnimplementedBrokerServiceServer, as gRPC asks, so that an RPC
// added to the proto before it is served here answers codes.Unimplemented.
type BrokerService struct {
	brokerv1.UnimplementedBrokerServiceServer
	inv    Inventory
	policy Policy
	log    *zap.Logger
	zstd   *zstd.Encoder
	DataPlane
}

// NewBrokerService returns the service over inv and the data plane.
func NewBrokerService(inv Inventory, p Policy, dp DataPlane, log *zap.Logger) *BrokerService {
	return &BrokerService{inv: inv, policy: p, log: log, zstd: newZstd(), DataPlane: dp}
}

// ListDevices lists every detected device, runnable or not.
func (s *BrokerService) ListDevices(ctx context.Context, _ *brokerv1.ListDevicesRequest) (*brokerv1.ListDevicesResponse, error) {
	entries := s.inv.Devices()
	out := make([]*brokerv1.Device, 0, len(entries))
	for i := range entries {
		out = append(out, s.device(&entries[i]))
	}
	return &brokerv1.ListDevicesResponse{Devices: out}, nil
}

// GetDevice returns one device by ID.
func (s *BrokerService) GetDevice(ctx context.Context, req *brokerv1.GetDeviceRequest) (*brokerv1.GetDeviceResponse, error) {
	if req.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "id is required (e.g. cpu:0, gpu:0, tpu:0)")
	}
	e, err := s.inv.Device(req.GetId())
	if err != nil {
		return nil, toStatus(s.log, "GetDevice", err)
	}
	return &brokerv1.GetDeviceResponse{Device: s.device(&e)}, nil
}

// CordonDevice stops new batches from going to a device.
func (s *BrokerService) CordonDevice(ctx context.Context, req *brokerv1.CordonDeviceRequest) (*brokerv1.CordonDeviceResponse, error) {
	if req.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "id is required")
	}
	reason := req.GetReason()
	if reason == "" {
		reason = "cordoned by an administrator"
	}
	e, err := s.inv.Cordon(req.GetId(), reason)
	if err != nil {
		return nil, toStatus(s.log, "CordonDevice", err)
	}
	if s.sched != nil {
		s.sched.Cordon(e.ID, true)
	}
	return &brokerv1.CordonDeviceResponse{Device: s.device(&e)}, nil
}

// UncordonDevice lets a cordoned device take batches again.
func (s *BrokerService) UncordonDevice(ctx context.Context, req *brokerv1.UncordonDeviceRequest) (*brokerv1.UncordonDeviceResponse, error) {
	if req.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "id is required")
	}
	e, err := s.inv.Uncordon(req.GetId())
	if err != nil {
		return nil, toStatus(s.log, "UncordonDevice", err)
	}
	if s.sched != nil {
		s.sched.Cordon(e.ID, false)
	}
	return &brokerv1.UncordonDeviceResponse{Device: s.device(&e)}, nil
}

// GetBatchPlan plans batches for a device type (present or not) or a device.
func (s *BrokerService) GetBatchPlan(ctx context.Context, req *brokerv1.GetBatchPlanRequest) (*brokerv1.GetBatchPlanResponse, error) {
	var (
		t        detect.Type
		deviceID string
	)
	switch target := req.GetTarget().(type) {
	case *brokerv1.GetBatchPlanRequest_DeviceType:
		var ok bool
		if t, ok = typeFromProto(target.DeviceType); !ok {
			return nil, status.Errorf(codes.InvalidArgument, "device_type %s is invalid: want DEVICE_TYPE_CPU, DEVICE_TYPE_GPU or DEVICE_TYPE_TPU", target.DeviceType)
		}
	case *brokerv1.GetBatchPlanRequest_DeviceId:
		e, err := s.inv.Device(target.DeviceId)
		if err != nil {
			return nil, toStatus(s.log, "GetBatchPlan", err)
		}
		t, deviceID = e.Type, e.ID
	default:
		return nil, status.Error(codes.InvalidArgument, "set device_type or device_id")
	}
	plan, err := detect.PlanBatch(int(req.GetBaseBatch()), t, s.policy.Factors)
	if err != nil {
		return nil, toStatus(s.log, "GetBatchPlan", err)
	}
	plan.DeviceID = deviceID
	return &brokerv1.GetBatchPlanResponse{Plan: planToProto(plan)}, nil
}

// GetReport returns the routing report.
func (s *BrokerService) GetReport(ctx context.Context, req *brokerv1.GetReportRequest) (*brokerv1.GetReportResponse, error) {
	entries := s.inv.Devices()
	sel := s.inv.Select(s.policy.Select)
	resp := &brokerv1.GetReportResponse{
		Configuration:   s.configuration(),
		RoutingMode:     brokerv1.RoutingMode_ROUTING_MODE_AUTO,
		SelectionReason: sel.Reason,
		Notes:           s.inv.Notes(),
		Version:         s.policy.Version,
		Hostname:        s.policy.Hostname,
		Recommendations: detect.Recommendations(entries, sel, s.policy.Select, s.policy.Memory, RuntimeStatuses(s.policy.Runtimes)),
	}
	if sel.Mode == "manual" {
		resp.RoutingMode = brokerv1.RoutingMode_ROUTING_MODE_MANUAL
	}
	for _, t := range sel.Chain {
		resp.FallbackChain = append(resp.FallbackChain, string(t))
	}
	for i := range entries {
		d := s.device(&entries[i])
		resp.AllDevices = append(resp.AllDevices, d)
		if sel.Device != nil && entries[i].ID == sel.Device.ID {
			resp.CurrentDevice = d
		}
	}
	for _, rt := range s.policy.Runtimes {
		resp.Runtimes = append(resp.Runtimes, runtimeToProto(rt))
	}
	if req.GetVerbose() {
		for _, t := range []detect.Type{detect.TypeTPU, detect.TypeGPU, detect.TypeCPU} {
			plan, err := detect.PlanBatch(DefaultBaseBatch, t, s.policy.Factors)
			if err != nil {
				return nil, toStatus(s.log, "GetReport", fmt.Errorf("batch plan for %s: %w", t, err))
			}
			resp.BatchPlans = append(resp.BatchPlans, planToProto(plan))
		}
	}
	return resp, nil
}

func (s *BrokerService) configuration() *brokerv1.Configuration {
	c := &brokerv1.Configuration{
		Prefer:         string(s.policy.Select.Prefer),
		AllowTpu:       s.policy.Select.AllowTPU,
		TpuBatchFactor: int32(s.policy.Factors.TPU),
		GpuBatchFactor: int32(s.policy.Factors.GPU),
		CpuBatchFactor: int32(s.policy.Factors.CPU),
		MemoryStrategy: s.policy.Memory.String(),
		MemoryFraction: s.policy.Memory.Fraction,
		CostPerHourUsd: map[string]float64{},
	}
	for t, v := range s.policy.Costs.PerType {
		c.CostPerHourUsd[string(t)] = v
	}
	for name, v := range s.policy.Costs.PerName {
		c.CostPerHourUsd[name] = v
	}
	return c
}

// device converts an entry, overlaying what the scheduler learned at run
// time: a device whose batches keep failing is unhealthy even though
// detection found nothing wrong with it.
func (s *BrokerService) device(e *detect.Entry) *brokerv1.Device {
	d := deviceToProto(e)
	if s.models != nil {
		if dt, ok := s.models.ComputeDType(e.ID); ok {
			if d.Attributes == nil {
				d.Attributes = map[string]string{}
			}
			d.Attributes["compute_dtype"] = dt.String()
		}
	}
	if s.sched == nil {
		return d
	}
	if h := s.sched.Health(e.ID); h.Known && !h.Healthy && d.GetHealth() != brokerv1.DeviceHealth_DEVICE_HEALTH_UNHEALTHY {
		d.Health = brokerv1.DeviceHealth_DEVICE_HEALTH_UNHEALTHY
		d.HealthReason = fmt.Sprintf("%d batches failed in a row (last: %s); probed again at %s",
			h.ConsecutiveFailures, h.LastError, h.ProbeAt.UTC().Format(time.RFC3339))
	}
	return d
}
