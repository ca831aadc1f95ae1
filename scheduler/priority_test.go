package scheduler

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestPriorityFloodCannotStarveLowerLevels: a client flooding the highest
// level (anyone may ask for it) takes 7 picks in 8 while lower levels have
// work waiting; the 8th goes to the highest lower level owed one, so a
// lower level's wait is a count of picks, not the flood's length. Items
// are picks for batches; counted from the batches run, never timed.
func TestPriorityFloodCannotStarveLowerLevels(t *testing.T) {
	cases := []struct {
		name     string
		maxBatch int
		reqs     []levelReqs // queued in this order behind a held batch
		want     string      // level letters of the items run, batches split by |
	}{
		{"one item a batch", 1, reqs(levelReqs{"H", 3, "flood", 20, 1}, levelReqs{"N", 2, "quiet", 1, 2}),
			"H|H|H|H|H|H|H|N|H|H|H|H|H|H|H|N|H|H|H|H|H|H"},
		{"batches of 8", 8, reqs(levelReqs{"H", 3, "flood", 20, 1}, levelReqs{"N", 2, "quiet", 1, 2}),
			"HHHHHHHN|HHHHHHHN|HHHHHH"},
		{"three levels, each owed in turn", 1, reqs(levelReqs{"H", 3, "flood", 20, 1}, levelReqs{"N", 2, "quiet", 1, 2}, levelReqs{"L", 1, "low", 1, 2}),
			"H|H|H|H|H|H|H|N|L|H|H|H|H|H|H|H|N|L|H|H|H|H|H|H"},
		{"a lower level's flood does not hold a higher one back", 4, reqs(levelReqs{"N", 2, "quiet", 1, 2}, levelReqs{"L", 1, "flood", 20, 1}),
			"NNLL|LLLL|LLLL|LLLL|LLLL|LL"},
		{"one level: clients take turns, as before", 4, reqs(levelReqs{"A", 3, "flood", 10, 1}, levelReqs{"B", 3, "quiet", 1, 2}),
			"ABAB|AAAA|AAAA"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, Options{})
			f := newFake("cpu:0")
			f.hold = make(chan struct{})
			mustAdd(t, s, "m", cpu0, tc.maxBatch, f)
			ctx := context.Background()
			warm := submitAsync(ctx, s, Request{Model: "m", Client: "w", Inputs: []any{"warm"}})
			waitEntered(t, f)
			var chans []<-chan submitted
			queued := 0
			for _, r := range tc.reqs {
				for c := range r.copies {
					in := inputs(fmt.Sprint(r.tag, "/", c), r.items)
					chans = append(chans, submitAsync(ctx, s, Request{Model: "m", Client: r.client, Priority: r.prio, Inputs: in}))
					queued += r.items
					waitFor(t, "queued", func() bool { return queuedItems(t, s, "m") == int64(queued) })
				}
			}
			close(f.hold)
			for _, ch := range append(chans, warm) {
				if r := recv(t, ch); r.err != nil {
					t.Fatal(r.err)
				}
			}
			var got []string
			for _, b := range f.batchList()[1:] {
				var tags strings.Builder
				for _, in := range b {
					tags.WriteString(in.(string)[:1])
				}
				got = append(got, tags.String())
			}
			if g := strings.Join(got, "|"); g != tc.want {
				t.Errorf("levels run\n %s\nwant\n %s", g, tc.want)
			}
		})
	}
}

// levelReqs is copies requests of items each, of one client at one
// priority; tag's letter marks their items.
type levelReqs struct {
	tag           string
	prio          int
	client        string
	items, copies int
}

func reqs(r ...levelReqs) []levelReqs { return r }

// TestGeneratePriorityFloodCannotStarveAdmission: while a client floods
// the highest level, a sequence of a lower level is admitted after 7 of
// the flood's admissions at most (one admission in 8 goes to the highest
// lower level owed one), counted in the steps' admission order.
func TestGeneratePriorityFloodCannotStarveAdmission(t *testing.T) {
	cases := []struct {
		name  string
		lower []levelReqs // queued after the flood, one sequence each copy
		want  string      // levels in admission order; the first H ran before the rest came
	}{
		{"two levels", reqs(levelReqs{"N", 2, "quiet", 1, 2}),
			"H" + "HHHHHHH" + "N" + "HHHHHHH" + "N" + "HHHHH"},
		{"three levels", reqs(levelReqs{"N", 2, "quiet", 1, 1}, levelReqs{"L", 1, "low", 1, 1}),
			"H" + "HHHHHHH" + "NL" + "HHHHHHHHHHHH"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, Options{})
			f, gate := addHeldGen(t, s, 4096, GenOptions{MaxRunning: 1, MaxStepTokens: 64})
			tags := map[uint64]string{}
			var streams []*GenStream
			gen := func(tag string, prio int, client string) {
				st, err := s.Generate(context.Background(), GenRequest{Model: "llm", Client: client, Priority: prio,
					Prompt: prompt(len(streams), 3), MaxNewTokens: 1, State: &genState{}})
				if err != nil {
					t.Fatal(err)
				}
				tags[st.Seq()] = tag
				streams = append(streams, st)
			}
			gen("H", 3, "flood")
			<-f.entered // it runs, held: the rest wait
			for range 19 {
				gen("H", 3, "flood")
			}
			for _, r := range tc.lower {
				for range r.copies {
					gen(r.tag, r.prio, r.client)
				}
			}
			close(gate)
			for _, st := range streams {
				if r := collect(st); r.err != nil || len(r.tokens) != 1 {
					t.Fatalf("%d tokens, %v", len(r.tokens), r.err)
				}
			}
			f.check(t)
			var got strings.Builder
			for _, ids := range f.steps { // one sequence a step
				got.WriteString(tags[ids[0]])
			}
			if got.String() != tc.want {
				t.Errorf("admission order\n %s\nwant\n %s", got.String(), tc.want)
			}
		})
	}
}

// TestGeneratePriorityFloodCannotStarveChunks: a higher level's long
// prompts, whose chunks fill every step's token budget, pass over a lower
// level's prompt for 7 steps at most: then its chunk goes ahead of theirs
// for a step. Without it the lower prompt ran a token a step beside them
// (had it started first), or was not admitted at all until they ended.
// Counted in the fake's steps.
func TestGeneratePriorityFloodCannotStarveChunks(t *testing.T) {
	const promptLen = 64
	opts := GenOptions{MaxRunning: 4, MaxStepTokens: 16, MaxChunk: 8}
	cases := []struct {
		name       string
		lowerFirst bool // the lower level's sequence ran a step before the flood came
	}{
		{"the flood runs first", false},
		{"the lower level runs first", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, Options{})
			f, gate := addHeldGen(t, s, 4096, opts)
			var streams []*GenStream
			gen := func(client string, prio, seed, n int) *GenStream {
				st, err := s.Generate(context.Background(), GenRequest{Model: "llm", Client: client, Priority: prio,
					Prompt: prompt(seed, n), MaxNewTokens: 2, State: &genState{}})
				if err != nil {
					t.Fatal(err)
				}
				streams = append(streams, st)
				return st
			}
			flood := func() {
				gen("a", 3, 0, 400)
				gen("a", 3, 1, 400)
				for running(s, "llm") < len(streams) { // steps until all run (the first may have run alone)
					gate <- struct{}{}
				}
			}
			var b *GenStream
			var submitted int // steps before b came
			if tc.lowerFirst {
				b = gen("b", 2, 99, promptLen)
				<-f.entered // its first step, held
				flood()
			} else {
				flood()
				b = gen("b", 2, 99, promptLen)
				submitted = f.stepCount()
			}
			close(gate)
			for _, st := range streams {
				if r := collect(st); r.err != nil || len(r.tokens) != 2 {
					t.Fatalf("%d tokens, %v", len(r.tokens), r.err)
				}
			}
			f.check(t)
			f.mu.Lock()
			var chunks []int // b's tokens in each of its steps
			first := -1
			for i, ids := range f.steps {
				if k := slices.Index(ids, b.Seq()); k >= 0 {
					chunks = append(chunks, f.chunks[i][k])
					if first < 0 {
						first = i
					}
				}
			}
			f.mu.Unlock()
			t.Logf("b's first step %d (%d after it came); its chunks %v", first, first-submitted, chunks)
			if !tc.lowerFirst && first-submitted > lowerLevelShare {
				t.Errorf("the lower level's sequence first ran %d steps after it came, want at most %d (the higher prompts take 50)", first-submitted, lowerLevelShare)
			}
			// Its prompt: a whole chunk (or what is left of it) in every 8 steps.
			left, since := promptLen, 0
			for i, n := range chunks {
				if left <= 0 {
					break
				}
				if n == min(left, opts.MaxChunk) {
					since = 0
				} else if since++; since >= lowerLevelShare {
					t.Fatalf("its prompt's step %d is the %dth in a row without a whole chunk (chunks %v)", i, since, chunks)
				}
				left -= n
			}
		})
	}
}
