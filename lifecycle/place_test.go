package lifecycle

import (
	"slices"
	"testing"

	"github.com/brokerd/brokerd/detect"
)

func TestPlacementOrder(t *testing.T) {
	tests := []struct {
		policy detect.Policy
		want   []detect.Type
	}{
		{detect.Policy{Prefer: detect.PreferAuto, AllowTPU: true}, []detect.Type{detect.TypeTPU, detect.TypeGPU, detect.TypeCPU}},
		{detect.Policy{Prefer: detect.PreferAuto}, []detect.Type{detect.TypeGPU, detect.TypeCPU}},
		{detect.Policy{Prefer: detect.PreferCPU, AllowTPU: true}, []detect.Type{detect.TypeCPU, detect.TypeTPU, detect.TypeGPU}},
		{detect.Policy{Prefer: detect.PreferGPU, AllowTPU: true}, []detect.Type{detect.TypeGPU, detect.TypeCPU, detect.TypeTPU}},
		{detect.Policy{Prefer: detect.PreferTPU, AllowTPU: true}, []detect.Type{detect.TypeTPU, detect.TypeGPU, detect.TypeCPU}},
	}
	for _, tt := range tests {
		t.Run(string(tt.policy.Prefer), func(t *testing.T) {
			if got := placementOrder(tt.policy); !slices.Equal(got, tt.want) {
				t.Errorf("order = %v, want %v", got, tt.want)
			}
		})
	}
}
