// Package probe asks every runtime adapter of this build whether it can run
// on this host. It lives apart from package runtime because the adapters
// import runtime (for its shared types, and later the Adapter interface), so
// runtime cannot import them back.
package probe

import (
	"context"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/onednn"
	"github.com/brokerd/brokerd/runtime/pjrt"
)

// Options configure the probes of the adapters that have settings.
type Options struct {
	PJRT pjrt.Options
}

// Probe returns one Info per adapter in a stable order: onednn, then pjrt.
// It never fails: an adapter that cannot run says why in its Info.
func Probe(ctx context.Context, opts Options) []runtime.Info {
	return []runtime.Info{
		onednn.Probe(),
		pjrt.Probe(ctx, opts.PJRT),
	}
}
