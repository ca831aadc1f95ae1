package daemon

import (
	"testing"

	"github.com/brokerd/brokerd/server"
)

func TestMemoryLimits(t *testing.T) {
	tests := []struct {
		goLimit, inflight int64
		mem               uint64
		maxMsg            int
		wantGo, wantIn    int64
	}{
		{0, 0, 8 << 30, 64 << 20, 6 << 30, 6 << 30 / 4},
		{0, 0, 256 << 20, 64 << 20, 192 << 20, 128<<20 + server.RequestOverhead}, // at least two messages
		{-1, 0, 8 << 30, 64 << 20, -1, 2 << 30},
		{1 << 30, 1 << 20, 8 << 30, 64 << 20, 1 << 30, 1 << 20},
	}
	for _, tc := range tests {
		g, in := memoryLimits(tc.goLimit, tc.inflight, tc.mem, tc.maxMsg)
		if g != tc.wantGo || in != tc.wantIn {
			t.Errorf("memoryLimits(%d, %d, %d, %d) = %d, %d; want %d, %d", tc.goLimit, tc.inflight, tc.mem, tc.maxMsg, g, in, tc.wantGo, tc.wantIn)
		}
	}
}
