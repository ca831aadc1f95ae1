package daemon

import (
	"fmt"
	"runtime/debug"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/server"
)

// memoryLimits are the Go runtime's memory limit and the in-flight byte
// budget: the settings, or derived from the memory brokerd may use (the
// cgroup limit or the host's memory): the Go heap gets three quarters
// (the rest is oneDNN's and the devices'), requests a quarter of that,
// and at least two of the largest messages.
func memoryLimits(goLimit, inflight int64, memTotal uint64, maxMessage int) (int64, int64) {
	if goLimit == 0 && memTotal > 0 {
		goLimit = int64(memTotal / 4 * 3)
	}
	if inflight <= 0 {
		base := goLimit
		if base <= 0 {
			base = int64(memTotal)
		}
		inflight = max(base/4, 2*int64(maxMessage)+server.RequestOverhead)
	}
	return goLimit, inflight
}

// setGoMemoryLimit applies limit (bytes; ≤ 0 leaves the runtime's), unless
// GOMEMLIMIT is set in the environment, which wins.
func setGoMemoryLimit(limit int64, getenv func(string) string, log *zap.Logger) {
	if getenv("GOMEMLIMIT") != "" {
		log.Info("Go memory limit from GOMEMLIMIT", zap.String("GOMEMLIMIT", getenv("GOMEMLIMIT")))
		return
	}
	if limit <= 0 {
		return
	}
	debug.SetMemoryLimit(limit)
	log.Info("Go memory limit set", zap.String("limit", fmt.Sprintf("%d MiB", limit>>20)))
}
