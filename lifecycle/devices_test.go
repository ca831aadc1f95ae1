package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/onednn"
)

// dtypeAdapter opens fake devices, recording each spec, and refuses any
// compute type but f32 with refuse when set.
type dtypeAdapter struct {
	refuse error

	mu    sync.Mutex
	specs []runtime.DeviceSpec
}

func (a *dtypeAdapter) Name() string { return "fake" }

func (a *dtypeAdapter) Open(_ context.Context, spec runtime.DeviceSpec) (runtime.Device, error) {
	a.mu.Lock()
	a.specs = append(a.specs, spec)
	a.mu.Unlock()
	if spec.DType != runtime.F32 && a.refuse != nil {
		return nil, a.refuse
	}
	return idDevice{id: spec.ID}, nil
}

// idDevice is an opened device nothing runs on: openDevices only keeps it,
// and close closes it.
type idDevice struct {
	runtime.Device
	id string
}

func (d idDevice) ID() string   { return d.id }
func (d idDevice) Close() error { return nil }

func TestOpenDevicesComputeDType(t *testing.T) {
	gpu := detect.Entry{Device: detect.Device{ID: "gpu:0", Type: detect.TypeGPU, Runtime: "fake"}}
	tests := []struct {
		name      string
		dtypes    map[detect.Type]runtime.DType
		refuse    error
		wantSpecs []runtime.DType // the DType of each Open, in order
		wantOpen  bool
		wantDType runtime.DType
		wantWarn  string // a warning's message; "" for none
	}{
		{name: "bf16 accepted", dtypes: map[detect.Type]runtime.DType{detect.TypeGPU: runtime.BF16},
			wantSpecs: []runtime.DType{runtime.BF16}, wantOpen: true, wantDType: runtime.BF16},
		{name: "bf16 unsupported: f32 fallback", dtypes: map[detect.Type]runtime.DType{detect.TypeGPU: runtime.BF16},
			refuse:    fmt.Errorf("fake: no bf16 here: %w", runtime.ErrUnsupported),
			wantSpecs: []runtime.DType{runtime.BF16, runtime.F32}, wantOpen: true, wantDType: runtime.F32,
			wantWarn: "device cannot compute in the configured dtype: falling back to f32"},
		{name: "other failure: not opened, no retry", dtypes: map[detect.Type]runtime.DType{detect.TypeGPU: runtime.BF16},
			refuse: errors.New("fake: device lost"), wantSpecs: []runtime.DType{runtime.BF16},
			wantWarn: "device could not be opened"},
		{name: "type the setting does not name: f32", dtypes: map[detect.Type]runtime.DType{detect.TypeTPU: runtime.BF16},
			refuse: fmt.Errorf("fake: %w", runtime.ErrUnsupported), wantSpecs: []runtime.DType{runtime.F32}, wantOpen: true, wantDType: runtime.F32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ad := &dtypeAdapter{refuse: tt.refuse}
			core, logs := observer.New(zapcore.WarnLevel)
			ms := openDevices(t.Context(), []detect.Entry{gpu}, nil, nil,
				Options{Adapters: map[string]runtime.Adapter{"fake": ad}, DTypes: tt.dtypes}, zap.New(core))
			defer ms.Close()
			var got []runtime.DType
			for _, s := range ad.specs {
				got = append(got, s.DType)
			}
			if !slices.Equal(got, tt.wantSpecs) {
				t.Errorf("opened with %v, want %v", got, tt.wantSpecs)
			}
			dt, open := ms.ComputeDType("gpu:0")
			if open != tt.wantOpen || dt != tt.wantDType || len(ms.devices) != len(ms.dtypes) {
				t.Errorf("computeDType = %v, %v (%d devices); want %v, %v", dt, open, len(ms.devices), tt.wantDType, tt.wantOpen)
			}
			if open && ms.devices[0].dtype != tt.wantDType {
				t.Errorf("device dtype %v, want %v", ms.devices[0].dtype, tt.wantDType)
			}
			var warns []string
			for _, e := range logs.All() {
				warns = append(warns, e.Message)
			}
			if (tt.wantWarn == "") != (len(warns) == 0) || tt.wantWarn != "" && !slices.Contains(warns, tt.wantWarn) {
				t.Errorf("warnings %q, want %q", warns, tt.wantWarn)
			}
		})
	}
}

// TestOpenDevicesBF16OnThisCPU asks oneDNN for bf16: where the CPU cannot
// (no AVX-512) the device must still open, in f32, with a warning.
func TestOpenDevicesBF16OnThisCPU(t *testing.T) {
	cpu := detect.Entry{Device: detect.Device{ID: "cpu:0", Type: detect.TypeCPU, Runtime: onednn.Name}}
	core, logs := observer.New(zapcore.WarnLevel)
	ms := openDevices(t.Context(), []detect.Entry{cpu}, nil, nil, Options{
		Adapters: map[string]runtime.Adapter{onednn.Name: onednn.New(onednn.Options{})},
		DTypes:   map[detect.Type]runtime.DType{detect.TypeCPU: runtime.BF16},
	}, zap.New(core))
	defer ms.Close()
	want, wantWarns := runtime.BF16, 0
	if err := onednn.BF16Support(); err != nil {
		t.Logf("this CPU has no bf16: %v", err)
		want, wantWarns = runtime.F32, 1
	}
	if dt, ok := ms.ComputeDType("cpu:0"); !ok || dt != want {
		t.Fatalf("cpu:0 computes in %v (open %v), want %v", dt, ok, want)
	}
	if ct := ms.devices[0].dev.(*onednn.Device).ComputeType(); ct != want {
		t.Errorf("the device was opened for %v, want %v", ct, want)
	}
	if n := logs.FilterMessage("device cannot compute in the configured dtype: falling back to f32").Len(); n != wantWarns {
		t.Errorf("%d fallback warnings, want %d: %v", n, wantWarns, logs.All())
	}
}
