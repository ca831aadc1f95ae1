package server

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/brokerd/brokerd/detect"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime"
)

var typeToProto = map[detect.Type]brokerv1.DeviceType{
	detect.TypeCPU:     brokerv1.DeviceType_DEVICE_TYPE_CPU,
	detect.TypeGPU:     brokerv1.DeviceType_DEVICE_TYPE_GPU,
	detect.TypeTPU:     brokerv1.DeviceType_DEVICE_TYPE_TPU,
	detect.TypeAMDGPU:  brokerv1.DeviceType_DEVICE_TYPE_AMD_GPU,
	detect.TypeEdgeTPU: brokerv1.DeviceType_DEVICE_TYPE_EDGE_TPU,
}

func typeFromProto(t brokerv1.DeviceType) (detect.Type, bool) {
	for k, v := range typeToProto {
		if v == t {
			return k, true
		}
	}
	return "", false
}

func deviceToProto(e *detect.Entry) *brokerv1.Device {
	d := &e.Device
	out := &brokerv1.Device{
		Id:                d.ID,
		Type:              typeToProto[d.Type],
		Vendor:            d.Vendor,
		Name:              d.Name,
		Uuid:              d.UUID,
		PciBusId:          d.PCIBusID,
		NumaNode:          int32(d.NUMANode),
		MemoryTotalBytes:  d.MemoryTotal,
		MemoryFreeBytes:   d.MemoryFree,
		MemoryBudgetBytes: e.Budget,
		ComputeCapability: d.ComputeCapability,
		DriverVersion:     d.DriverVersion,
		CudaDriverVersion: d.CUDAVersion,
		Architecture:      d.Architecture,
		SupportsBf16:      d.BF16,
		SupportsFp16:      d.FP16,
		MultiDevice:       d.MultiDevice,
		Runtime:           d.Runtime,
		Runnable:          d.Runnable(),
		RuntimeReason:     d.RuntimeReason,
		Health:            brokerv1.DeviceHealth_DEVICE_HEALTH_HEALTHY,
		HealthReason:      d.HealthReason,
		Cordoned:          e.Cordoned,
		CordonReason:      e.CordonReason,
		DevicePaths:       append([]string(nil), d.DevicePaths...),
		CostPerHourUsd:    e.CostPerHour,
		Telemetry:         telemetryToProto(d.Telemetry),
	}
	if d.Health == detect.Unhealthy {
		out.Health = brokerv1.DeviceHealth_DEVICE_HEALTH_UNHEALTHY
	}
	if len(d.Attributes) > 0 {
		out.Attributes = make(map[string]string, len(d.Attributes))
		for k, v := range d.Attributes {
			out.Attributes[k] = v
		}
	}
	if c := d.CPU; c != nil {
		out.Cpu = &brokerv1.CpuInfo{
			ModelName:            c.ModelName,
			LogicalCores:         int32(c.LogicalCores),
			EffectiveCores:       c.EffectiveCores,
			Flags:                append([]string(nil), c.Flags...),
			NumaNodes:            int32(c.NUMANodes),
			LimitSource:          c.LimitSource,
			MemoryAvailableBytes: c.MemoryAvailable,
		}
	}
	if g := d.GPU; g != nil {
		out.Gpu = &brokerv1.GpuInfo{
			NvmlIndex:            int32(d.Index),
			MigEnabled:           g.MIGEnabled,
			CudaVersion:          d.CUDAVersion,
			EccUncorrectedErrors: g.ECCUncorrectedErrors,
			LastXid:              g.LastXID,
		}
	}
	if t := d.TPU; t != nil {
		out.Tpu = &brokerv1.TpuInfo{
			ChipIndex:          int32(t.ChipIndex),
			Generation:         t.Generation,
			AcceleratorType:    t.AcceleratorType,
			Topology:           t.Topology,
			WorkerId:           int32(t.WorkerID),
			ChipsPerHostBounds: t.ChipsPerHostBounds,
			TpuName:            t.TPUName,
			VisibleChips:       t.VisibleChips,
		}
	}
	return out
}

func telemetryToProto(t detect.Telemetry) *brokerv1.Telemetry {
	out := &brokerv1.Telemetry{
		MemoryUsedBytes:          t.MemoryUsed,
		MemoryTotalBytes:         t.MemoryTotal,
		UtilizationPercent:       t.UtilizationPercent,
		MemoryUtilizationPercent: t.MemoryUtilizationPercent,
		TemperatureCelsius:       t.TemperatureC,
		PowerWatts:               t.PowerW,
		PowerLimitWatts:          t.PowerLimitW,
		SmClockMhz:               t.SMClockMHz,
		MemoryClockMhz:           t.MemClockMHz,
	}
	if !t.UpdatedAt.IsZero() {
		out.UpdatedAt = timestamppb.New(t.UpdatedAt)
	}
	return out
}

func planToProto(p detect.BatchPlan) *brokerv1.BatchPlan {
	out := &brokerv1.BatchPlan{
		DeviceType: typeToProto[p.Type],
		DeviceId:   p.DeviceID,
		BaseBatch:  int32(p.Base),
		Factor:     int32(p.Factor),
		MinBatch:   int32(p.Min),
		MaxBatch:   int32(p.Max),
	}
	for _, b := range p.Buckets {
		out.Buckets = append(out.Buckets, int32(b))
	}
	return out
}

func runtimeToProto(rt runtime.Info) *brokerv1.Runtime {
	out := &brokerv1.Runtime{
		Name:      rt.Name,
		Available: rt.Available,
		Version:   rt.Version,
		Reason:    rt.Reason,
	}
	for _, t := range rt.DeviceTypes {
		out.DeviceTypes = append(out.DeviceTypes, typeToProto[detect.Type(t)])
	}
	for _, p := range rt.Plugins {
		out.Plugins = append(out.Plugins, &brokerv1.PjrtPlugin{
			Name: p.Name, Path: p.Path, Platform: p.Platform,
			ApiVersion: p.APIVersion, Loaded: p.Loaded, Error: p.Error,
		})
	}
	return out
}

// RuntimeStatuses turns the probe's findings into what the inventory needs:
// for each device type, the adapter that would drive it and whether it can.
// PJRT covers GPUs and TPUs only through a loaded plugin for that platform,
// so a TPU with only a CUDA plugin loaded gets a reason of its own.
func RuntimeStatuses(infos []runtime.Info) []detect.RuntimeStatus {
	var out []detect.RuntimeStatus
	for _, rt := range infos {
		var types []detect.Type
		for _, t := range rt.DeviceTypes {
			types = append(types, detect.Type(t))
		}
		switch rt.Name {
		case "pjrt":
			if rt.Available {
				out = append(out, detect.RuntimeStatus{Name: rt.Name, Types: types, Available: true, Version: pluginVersions(rt)})
			}
			for _, t := range []detect.Type{detect.TypeTPU, detect.TypeGPU} {
				if !containsType(types, t) {
					reason := rt.Reason
					if reason == "" {
						reason = "no PJRT plugin for " + string(t) + " loaded"
					}
					out = append(out, detect.RuntimeStatus{Name: rt.Name, Types: []detect.Type{t}, Reason: reason})
				}
			}
		default:
			if len(types) == 0 && rt.Name == "onednn" {
				types = []detect.Type{detect.TypeCPU}
			}
			out = append(out, detect.RuntimeStatus{Name: rt.Name, Types: types, Available: rt.Available, Version: rt.Version, Reason: rt.Reason})
		}
	}
	return out
}

func pluginVersions(rt runtime.Info) string {
	v := ""
	for _, p := range rt.Plugins {
		if p.Loaded {
			if v != "" {
				v += ", "
			}
			v += p.Name + " " + p.APIVersion
		}
	}
	return v
}

func containsType(ts []detect.Type, t detect.Type) bool {
	for _, x := range ts {
		if x == t {
			return true
		}
	}
	return false
}
