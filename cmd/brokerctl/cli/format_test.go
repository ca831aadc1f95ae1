package cli

import (
	"errors"
	"flag"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

func TestHumanBytes(t *testing.T) {
	tests := []struct {
		in   uint64
		want string
	}{
		{0, "-"},
		{1, "1 B"},
		{1023, "1023 B"},
		{1024, "1.0 KiB"},
		{1536, "1.5 KiB"},
		{600 << 20, "600.0 MiB"},
		{16 << 30, "16.0 GiB"},
		{85520809984, "79.6 GiB"},
		{192 << 30, "192.0 GiB"},
		{3 << 40, "3.0 TiB"},
		{^uint64(0), "16.0 EiB"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := humanBytes(tt.in); got != tt.want {
				t.Errorf("humanBytes(%d) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseInterspersed(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantPos  []string
		wantJSON bool
		wantWhy  string
		wantErr  bool
	}{
		{name: "flag after positional", args: []string{"gpu:0", "--json"}, wantPos: []string{"gpu:0"}, wantJSON: true},
		{name: "flag before positional", args: []string{"--json", "gpu:0"}, wantPos: []string{"gpu:0"}, wantJSON: true},
		{name: "value flag between positionals", args: []string{"a", "--reason", "two words", "b"}, wantPos: []string{"a", "b"}, wantWhy: "two words"},
		{name: "double dash ends flags", args: []string{"--", "--json", "x"}, wantPos: []string{"--json", "x"}},
		{name: "no args", args: nil, wantPos: nil},
		{name: "unknown flag", args: []string{"a", "--nope"}, wantErr: true},
		{name: "missing value", args: []string{"a", "--reason"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newFlagSet("test")
			asJSON := fs.Bool("json", false, "")
			why := fs.String("reason", "", "")
			pos, err := parseInterspersed(fs, tt.args)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if !slices.Equal(pos, tt.wantPos) || *asJSON != tt.wantJSON || *why != tt.wantWhy {
				t.Errorf("got pos %q json %v reason %q, want %q %v %q", pos, *asJSON, *why, tt.wantPos, tt.wantJSON, tt.wantWhy)
			}
		})
	}
}

func TestEnumNames(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"gpu", typeName(brokerv1.DeviceType_DEVICE_TYPE_GPU), "gpu"},
		{"amd gpu", typeName(brokerv1.DeviceType_DEVICE_TYPE_AMD_GPU), "amdgpu"},
		{"edge tpu", typeName(brokerv1.DeviceType_DEVICE_TYPE_EDGE_TPU), "edgetpu"},
		{"unspecified type", typeName(brokerv1.DeviceType_DEVICE_TYPE_UNSPECIFIED), "unknown"},
		{"health", enumName(brokerv1.DeviceHealth(0).Descriptor(), brokerv1.DeviceHealth_DEVICE_HEALTH_UNHEALTHY.Number()), "unhealthy"},
		{"routing", enumName(brokerv1.RoutingMode(0).Descriptor(), brokerv1.RoutingMode_ROUTING_MODE_MANUAL.Number()), "manual"},
		{"type through enumName", enumName(brokerv1.DeviceType(0).Descriptor(), brokerv1.DeviceType_DEVICE_TYPE_TPU.Number()), "tpu"},
		{"unknown number", enumName(brokerv1.DeviceHealth(0).Descriptor(), 42), "42"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

// TestParseDeviceTypeCoversEnum keeps --type in step with the API: every
// device type but UNSPECIFIED has a name that parses back to it.
func TestParseDeviceTypeCoversEnum(t *testing.T) {
	values := brokerv1.DeviceType(0).Descriptor().Values()
	for i := range values.Len() {
		want := brokerv1.DeviceType(values.Get(i).Number())
		if want == brokerv1.DeviceType_DEVICE_TYPE_UNSPECIFIED {
			continue
		}
		t.Run(want.String(), func(t *testing.T) {
			got, ok := parseDeviceType(typeName(want))
			if !ok || got != want {
				t.Errorf("parseDeviceType(%q) = %v, %v; want %v", typeName(want), got, ok, want)
			}
		})
	}
}

func TestGRPCStatus(t *testing.T) {
	notFound := status.Error(codes.NotFound, `device "gpu:9" not found`)
	tests := []struct {
		name     string
		err      error
		wantOK   bool
		wantCode codes.Code
		wantMsg  string
	}{
		{name: "status", err: notFound, wantOK: true, wantCode: codes.NotFound, wantMsg: `device "gpu:9" not found`},
		{name: "wrapped status keeps server message", err: errors.Join(errors.New("ctx"), notFound), wantOK: true, wantCode: codes.NotFound, wantMsg: `device "gpu:9" not found`},
		{name: "plain error", err: errors.New("boom"), wantOK: false},
		{name: "flag error", err: flag.ErrHelp, wantOK: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, ok := grpcStatus(tt.err)
			if ok != tt.wantOK {
				t.Fatalf("ok = %v, want %v", ok, tt.wantOK)
			}
			if ok && (st.Code() != tt.wantCode || st.Message() != tt.wantMsg) {
				t.Errorf("got %v %q, want %v %q", st.Code(), st.Message(), tt.wantCode, tt.wantMsg)
			}
		})
	}
}

func TestCodeName(t *testing.T) {
	tests := []struct {
		code codes.Code
		want string
	}{
		{codes.NotFound, "NOT_FOUND"},
		{codes.InvalidArgument, "INVALID_ARGUMENT"},
		{codes.ResourceExhausted, "RESOURCE_EXHAUSTED"},
		{codes.FailedPrecondition, "FAILED_PRECONDITION"},
		{codes.Unavailable, "UNAVAILABLE"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := codeName(tt.code); got != tt.want {
				t.Errorf("codeName(%v) = %q, want %q", tt.code, got, tt.want)
			}
		})
	}
}

func TestTelemetryCells(t *testing.T) {
	tests := []struct {
		name string
		in   *brokerv1.Telemetry
		want []string // TEMP, POWER, UTIL
	}{
		{name: "none", in: nil, want: []string{"-", "-", "-"}},
		{name: "no sensors", in: &brokerv1.Telemetry{UtilizationPercent: 3.4}, want: []string{"-", "-", "3%"}},
		{name: "power without limit", in: &brokerv1.Telemetry{TemperatureCelsius: 61.6, PowerWatts: 300}, want: []string{"62 C", "300 W", "0%"}},
		{name: "power with limit", in: &brokerv1.Telemetry{TemperatureCelsius: 40, PowerWatts: 120.4, PowerLimitWatts: 700, UtilizationPercent: 99.6}, want: []string{"40 C", "120/700 W", "100%"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := telemetryCells(tt.in); !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
