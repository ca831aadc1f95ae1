package jinja

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// This file is brokerd's addition to the fork: every render and compile
// runs under limits, because a chat template is code from a model file.
// Without them a recursive macro overflows the Go stack (fatal, not a
// panic), `'x' * 2000000000` or `range(10**10)` allocates until the
// process dies, and a nested loop keeps a core busy after its caller left.

// ErrLimit is wrapped by every error that a limit (as opposed to the
// template's own logic) produced.
var ErrLimit = errors.New("template limit")

// Limits bound one render. A zero field takes its DefaultLimits value.
type Limits struct {
	// MaxSteps bounds the nodes and expressions evaluated (loop
	// iterations included).
	MaxSteps int64
	// MaxCallDepth bounds nested macro and caller() calls.
	MaxCallDepth int
	// MaxOutputBytes bounds the rendered text.
	MaxOutputBytes int64
	// MaxAllocBytes bounds the bytes of strings and list slots the
	// render creates in all, garbage included, so it also bounds what
	// the render can hold at once.
	MaxAllocBytes int64
}

// DefaultLimits are generous for real chat templates (the largest known
// ones render a conversation in well under 10^5 steps and call macros a
// few levels deep) and small enough to render in about a second.
var DefaultLimits = Limits{
	MaxSteps:       5_000_000,
	MaxCallDepth:   64,
	MaxOutputBytes: 64 << 20,
	MaxAllocBytes:  256 << 20,
}

func (l Limits) withDefaults() Limits {
	if l.MaxSteps <= 0 {
		l.MaxSteps = DefaultLimits.MaxSteps
	}
	if l.MaxCallDepth <= 0 {
		l.MaxCallDepth = DefaultLimits.MaxCallDepth
	}
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = DefaultLimits.MaxOutputBytes
	}
	if l.MaxAllocBytes <= 0 {
		l.MaxAllocBytes = DefaultLimits.MaxAllocBytes
	}
	return l
}

// CompileLimits bound parsing. A zero field takes its default.
type CompileLimits struct {
	// MaxSourceBytes bounds the template's source.
	MaxSourceBytes int
	// MaxNesting bounds nested blocks ({% if %}, {% for %}, …) and
	// nested expressions (parentheses, brackets, unary operators).
	MaxNesting int
}

// DefaultCompileLimits: real chat templates are under 32 KiB and nest a
// handful of levels.
var DefaultCompileLimits = CompileLimits{MaxSourceBytes: 1 << 20, MaxNesting: 64}

func (l CompileLimits) withDefaults() CompileLimits {
	if l.MaxSourceBytes <= 0 {
		l.MaxSourceBytes = DefaultCompileLimits.MaxSourceBytes
	}
	if l.MaxNesting <= 0 {
		l.MaxNesting = DefaultCompileLimits.MaxNesting
	}
	return l
}

// Structural caps on walking one value (stringify, tojson, ==). Values
// a template builds can share children (a DAG doubles in size per
// level) or contain themselves (x.append(x)), so a walk is bounded in
// depth and in nodes visited, independent of the render's budget.
const (
	maxValueDepth = 128
	maxValueNodes = 1 << 20
)

// budget is one render's account. Every evaluator of the render (macro
// bodies, caller blocks, set blocks) shares it. err is sticky: helpers
// without an error return record an overrun there, and the next step
// fails the render with it.
type budget struct {
	ctx       context.Context
	done      <-chan struct{}
	lim       Limits
	steps     int64
	depth     int // macro and caller() calls
	exprDepth int // nested expression evaluation
	alloc     int64
	err       error
}

func newBudget(ctx context.Context, lim Limits) *budget {
	return &budget{ctx: ctx, done: ctx.Done(), lim: lim.withDefaults()}
}

func (b *budget) fail(err error) error {
	if b.err == nil {
		b.err = err
	}
	return b.err
}

func (b *budget) limitf(format string, args ...any) error {
	return b.fail(fmt.Errorf("%w: "+format, append([]any{ErrLimit}, args...)...))
}

// step counts one node or expression and notices cancellation.
func (b *budget) step() error {
	if b.err != nil {
		return b.err
	}
	b.steps++
	if b.steps > b.lim.MaxSteps {
		return b.limitf("more than %d evaluation steps", b.lim.MaxSteps)
	}
	if b.steps&15 == 0 && b.done != nil {
		select {
		case <-b.done:
			return b.fail(b.ctx.Err())
		default:
		}
	}
	return nil
}

// enter and leave bracket a macro or caller() call.
func (b *budget) enter() error {
	b.depth++
	if b.depth > b.lim.MaxCallDepth {
		return b.limitf("macro calls nested more than %d deep", b.lim.MaxCallDepth)
	}
	return nil
}

func (b *budget) leave() { b.depth-- }

// charge accounts n bytes the render created.
func (b *budget) charge(n int64) error {
	if b.err != nil {
		return b.err
	}
	b.alloc += n
	if b.alloc > b.lim.MaxAllocBytes || n < 0 {
		return b.limitf("creates more than %d bytes of values", b.lim.MaxAllocBytes)
	}
	return nil
}

// room says whether n more bytes may be created, before creating them
// (for results whose size is known up front: 'x' * n, range(n), join).
func (b *budget) room(n int64) error {
	if b.err != nil {
		return b.err
	}
	if n < 0 || n > b.lim.MaxAllocBytes-b.alloc {
		return b.limitf("would create more than %d bytes of values", b.lim.MaxAllocBytes)
	}
	return nil
}

// mulSize and addSize combine sizes (non-negative) for room: a result
// that does not fit an int64 is -1, which room refuses, rather than a
// wrapped product that passes it.
func mulSize(a, b int64) int64 {
	if a < 0 || b < 0 || (a != 0 && b > math.MaxInt64/a) {
		return -1
	}
	return a * b
}

func addSize(a, b int64) int64 {
	if a < 0 || b < 0 || a > math.MaxInt64-b {
		return -1
	}
	return a + b
}

// innerSlots is what a two-slot list inside a result costs (items,
// dictsort): its two Values.
const innerSlots = 2 * 16

// chargeValue accounts a value an operation produced: its string bytes,
// or 16 bytes per list slot or dict entry (a Value is two words).
func (b *budget) chargeValue(v Value) error {
	switch v.kind {
	case KindString:
		return b.charge(int64(len(v.v.(string))))
	case KindList:
		return b.charge(16 * int64(len(v.v.(*List).Items)))
	case KindDict:
		return b.charge(48 * int64(len(v.v.(*Dict).Keys)))
	}
	return nil
}

// nodes counts value nodes one walk visited; the walk stops at the cap.
// A walk in a render (b set) also counts each node as a step of it: a
// comparison makes nothing to charge, and a test over a list of shared
// children (`x in L`) walks up to the cap once per item.
type walk struct {
	nodes int
	b     *budget
}

func (w *walk) visit(depth int) bool {
	w.nodes++
	if w.b != nil && w.b.step() != nil {
		return false
	}
	return w.nodes <= maxValueNodes && depth <= maxValueDepth
}

// work counts n steps at once, for an operation whose cost is known before
// it runs (a sort's comparisons).
func (b *budget) work(n int64) error {
	if b.err != nil {
		return b.err
	}
	if n < 0 || n > b.lim.MaxSteps-b.steps {
		return b.limitf("more than %d evaluation steps", b.lim.MaxSteps)
	}
	b.steps += n
	return nil
}

// sortWork is the comparisons a sort of n items makes, about n·log2(n).
func sortWork(n int) int64 {
	return int64(n) * int64(bits.Len(uint(n))+1)
}
