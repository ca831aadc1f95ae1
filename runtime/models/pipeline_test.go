package models

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/brokerd/brokerd/runtime"
)

// gateDevice records copy-ins and runs, and holds every Run until release
// closes, after saying so on entered: a device whose batch is still running.
type gateDevice struct {
	runtime.Device
	entered chan struct{}
	release chan struct{}

	mu     sync.Mutex
	events []string
}

func (d *gateDevice) record(e string) {
	d.mu.Lock()
	d.events = append(d.events, e)
	d.mu.Unlock()
}

func (d *gateDevice) log() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.events)
}

func (d *gateDevice) CopyInInt32(ctx context.Context, dst runtime.Buffer, src []int32) error {
	d.record("copy-in")
	return d.Device.CopyInInt32(ctx, dst, src)
}

func (d *gateDevice) Run(ctx context.Context, g *runtime.Graph, bind map[string]runtime.Buffer) error {
	d.record("run")
	d.entered <- struct{}{}
	<-d.release
	return d.Device.Run(ctx, g, bind)
}

// TestExecuteOverlaps: two Executes on one replica overlap (the scheduler
// gives a pipelined device two batches at once): the second batch's inputs
// are copied in while the first batch's run has not returned, and both give
// what each item gives alone.
func TestExecuteOverlaps(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	cfg := tinyConfig()
	m := newTestBERT(t, cfg, randomBERT(r, cfg, 0), BERTOptions{})
	dev := openDevice(t, runtime.DeviceSpec{})
	gate := &gateDevice{Device: dev, entered: make(chan struct{}, 2), release: make(chan struct{})}
	rep, err := m.NewReplica(t.Context(), gate, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close()
	batches := [][]TextInput{
		{randomItem(r, cfg.VocabSize, 5, false, true), randomItem(r, cfg.VocabSize, 9, true, false)},
		{randomItem(r, cfg.VocabSize, 12, false, false), randomItem(r, cfg.VocabSize, 3, false, true)},
	}
	type result struct {
		out [][]float32
		err error
	}
	results := make([]chan result, len(batches))
	start := func(i int) {
		results[i] = make(chan result, 1)
		go func() {
			in := make([]any, len(batches[i]))
			for j, it := range batches[i] {
				in[j] = it
			}
			outs, err := rep.Execute(context.Background(), in)
			var vecs [][]float32
			for _, o := range outs {
				vecs = append(vecs, o.(Output).Values)
			}
			results[i] <- result{vecs, err}
		}()
	}
	start(0)
	select {
	case <-gate.entered: // batch 0 is running, held
	case <-time.After(5 * time.Second):
		t.Fatal("batch 0 did not reach Run")
	}
	before := len(gate.log())
	start(1)
	select {
	case <-gate.entered: // batch 1 copied its inputs in and reached Run too
	case <-time.After(5 * time.Second):
		t.Fatalf("batch 1 did not reach Run while batch 0 ran; device saw %v", gate.log())
	}
	if after := gate.log()[before:]; !slices.Contains(after, "copy-in") {
		t.Fatalf("no copy-in for batch 1 while batch 0 ran: %v", after)
	}
	close(gate.release)

	alone, err := m.NewReplica(t.Context(), dev, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close()
	for i, b := range batches {
		res := <-results[i]
		if res.err != nil {
			t.Fatalf("batch %d: %v", i, res.err)
		}
		for j, it := range b {
			want := execute(t, alone, []TextInput{it})[0]
			if e := relErr(res.out[j], float64s(want)); !(e < 1e-5) {
				t.Errorf("batch %d item %d: relative error %.3g against the item alone", i, j, e)
			}
		}
	}
}
