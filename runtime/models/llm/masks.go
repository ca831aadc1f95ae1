package llm

import (
	goruntime "runtime"
	"time"
)

// Grammar masks beside the forward.
//
// A constrained sequence's mask depends on the tokens it accepted, not on
// the logits, so a step computes its sequences' masks in the background
// while its forward runs, and samples each once its mask is there. An
// ambiguous grammar's mask can take far longer than a forward (up to
// grammar.Limits.MaxMaskWork parse-stack nodes each); with
// EngineOptions.DeferSampling a step does not hold every other sequence
// for it: past a grace (as long again as the forward took) the sequences
// whose masks are not done are answered SeqResult.Pending instead of a
// token, their masks go on in the background, and the caller runs their
// last token again once Pending closes. A grammar then slows its own
// sequences, not the others'.

// minMaskGrace is the least a step waits for its masks before it defers
// them: tiny models forward in well under a millisecond, and a deferral
// costs its sequence a token of compute and a step.
const minMaskGrace = time.Millisecond

// maskRunner computes masks in the background, on at most half the
// threads: a mask of an ambiguous grammar builds tens of megabytes of
// parse state before its matcher compacts it, so a request of many
// constrained choices must not build them all at once; and the forwards
// of the sequences masks no longer hold back need the other threads. (On
// 2 cores, masks on both made a plain chat beside 128 ambiguous choices
// 2-3 times slower than on one; so did letting them take both while no
// forward ran, since a mask, once started, runs for milliseconds into the
// next forward: bench/RESULTS.md.)
type maskRunner struct {
	slots chan struct{}
	// ended has a value when a mask ended since a waiter last looked.
	ended chan struct{}
}

func newMaskRunner() *maskRunner {
	return &maskRunner{slots: make(chan struct{}, max(1, goruntime.GOMAXPROCS(0)/2)), ended: make(chan struct{}, 1)}
}

// start begins computing c's mask unless it is computed or being
// computed, and returns the channel closed when it is done: nil when
// there is nothing to wait for. The goroutine touches only c, which
// settles before any other use.
func (r *maskRunner) start(c *constraintState) <-chan struct{} {
	if c.pending != nil {
		return c.pending
	}
	if !c.needsMask() {
		return nil
	}
	done := make(chan struct{})
	c.pending = done
	go func() {
		r.slots <- struct{}{}
		c.compute()
		<-r.slots
		close(done)
		select {
		case r.ended <- struct{}{}:
		default:
		}
	}()
	return done
}

// startMasks starts the masks of items' constrained sampling sequences;
// masks[i] is item i's to wait for (nil: none).
func (e *Engine) startMasks(items []SeqStep) (masks []<-chan struct{}) {
	for i, it := range items {
		if !it.Sample {
			continue
		}
		if s, ok := it.State.(*Sequence); ok && s.con != nil && !s.stopped {
			if ch := e.masks.start(s.con); ch != nil {
				if masks == nil {
					masks = make([]<-chan struct{}, len(items))
				}
				masks[i] = ch
			}
		}
	}
	return masks
}

// done says whether ch, a mask's channel, is closed (nil is).
func done(ch <-chan struct{}) bool {
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// waitMasks waits for masks (startMasks'), all of them unless the engine
// defers sampling. With DeferSampling it waits until grace after now at
// most, and past it as soon as one item of the step has its answer (an
// item without a mask, or whose mask is done): the others' channels are
// returned (late[i] non-nil: item i is deferred), nil when none is late.
func (e *Engine) waitMasks(masks []<-chan struct{}, grace time.Duration) (late []<-chan struct{}) {
	if masks == nil {
		return nil
	}
	if !e.opts.DeferSampling {
		for _, ch := range masks {
			if ch != nil {
				<-ch
			}
		}
		return nil
	}
	deadline := time.Now().Add(max(grace, minMaskGrace))
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		ready, waiting := 0, 0
		for _, ch := range masks {
			if done(ch) {
				ready++
			} else {
				waiting++
			}
		}
		if waiting == 0 {
			return nil
		}
		var expire <-chan time.Time
		if ready > 0 {
			left := time.Until(deadline)
			if left <= 0 {
				late = make([]<-chan struct{}, len(masks))
				for i, ch := range masks {
					if !done(ch) {
						late[i] = ch
					}
				}
				return late
			}
			if timer == nil {
				timer = time.NewTimer(left)
			} else {
				timer.Reset(left)
			}
			expire = timer.C
		}
		select {
		case <-e.masks.ended:
		case <-expire:
		}
	}
}

// waitMask waits for ch until grace after now at most and says whether
// it is done: nil is.
func waitMask(ch <-chan struct{}, grace time.Duration) bool {
	if done(ch) {
		return true
	}
	t := time.NewTimer(max(grace, minMaskGrace))
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}
