package detect

import (
	"context"
	"reflect"
	"testing"
)

func TestCoralDetect(t *testing.T) {
	type edge struct {
		ID, PCI string
		Health  Health
		Paths   []string
	}
	tests := []struct {
		name  string
		host  string
		want  func(r Roots) []edge
		notes []string
	}{
		{
			name: "dual Edge TPU card", host: "coral",
			want: func(r Roots) []edge {
				return []edge{
					{"edgetpu:0", "0000:03:00.0", Healthy, []string{r.DevPath("apex_0")}},
					{"edgetpu:1", "0000:04:00.0", Healthy, []string{r.DevPath("apex_1")}},
				}
			},
		},
		{
			name: "missing device node", host: "broken",
			want:  func(Roots) []edge { return []edge{{"edgetpu:0", "0000:00:0a.0", Unhealthy, nil}} },
			notes: []string{"apex_0 not found", "0000:00:0a.0/class"},
		},
		{name: "TPU host", host: "tpu-v5e", want: func(Roots) []edge { return nil }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			roots := hwRoots(tc.host)
			res := NewCoralDetector(roots).Detect(context.Background())
			hwCheckNotes(t, res.Notes, tc.notes)
			var got []edge
			for i, d := range res.Devices {
				if d.Type != TypeEdgeTPU || d.Index != i || d.Vendor != "Google" || d.Name != "Coral Edge TPU" ||
					d.RuntimeReason != NoAdapterReason || d.NUMANode != -1 {
					t.Errorf("%s: malformed device %+v", d.ID, d)
				}
				got = append(got, edge{d.ID, d.PCIBusID, d.Health, d.DevicePaths})
			}
			if want := tc.want(roots); !reflect.DeepEqual(got, want) {
				t.Errorf("Edge TPUs:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}
