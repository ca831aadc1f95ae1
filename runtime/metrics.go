package runtime

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterCollector registers c with reg, or returns the collector already
// registered in its place: a second adapter on the same registry shares the
// first one's series instead of failing.
func RegisterCollector[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, err
	}
	return c, nil
}
