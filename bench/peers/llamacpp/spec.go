package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/brokerd/brokerd/bench/benchkit"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/scheduler"
)

// The scheduler's speculative decoding counters (scheduler/metrics.go).
const (
	draftedMetric  = "brokerd_generation_spec_decode_draft_tokens_total"
	acceptedMetric = "brokerd_generation_spec_decode_accepted_tokens_total"
)

// guesses counts speculative decoding's tokens: brokerd's guessed tokens
// run and those taken; llama.cpp's predictions checked (validated +
// refuted) and those validated (its sequence's tokenPredictions).
type guesses struct{ drafted, accepted int64 }

func (g guesses) add(h guesses) guesses {
	return guesses{g.drafted + h.drafted, g.accepted + h.accepted}
}

func (g guesses) String() string {
	if g.drafted == 0 {
		return "none guessed"
	}
	return fmt.Sprintf("%d of %d taken (%.0f%%)", g.accepted, g.drafted, 100*float64(g.accepted)/float64(g.drafted))
}

// maxDrafts is the engine's EngineOptions.MaxDrafts for -spec n with at
// most running sequences in a step: every sequence the scheduler lets
// guess (at most DefaultSpecMaxRunning) may use all n.
func maxDrafts(n, running int) int {
	if n <= 0 {
		return 0
	}
	return n * min(running, scheduler.DefaultSpecMaxRunning)
}

// genRound is benchkit.Round with speculative decoding at spec tokens a step
// (0: off, as benchkit.Round), and what the scheduler counted of the
// guesses (its Prometheus counters, in a registry of this round's own).
func genRound(ctx context.Context, m *llm.Model, eng *llm.Engine, jobs []benchkit.Job, running, chunk, spec int) (benchkit.RoundResult, guesses, error) {
	reg := prometheus.NewRegistry()
	res, err := benchkit.RoundWith(ctx, m, eng, jobs, benchkit.RoundOptions{Running: running, Chunk: chunk, Spec: spec, Registerer: reg})
	g, gerr := gathered(reg)
	return res, g, errors.Join(err, gerr)
}

// gathered sums the speculative decoding counters in reg.
func gathered(reg *prometheus.Registry) (guesses, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return guesses{}, err
	}
	var g guesses
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			v := int64(mt.GetCounter().GetValue())
			switch mf.GetName() {
			case draftedMetric:
				g.drafted += v
			case acceptedMetric:
				g.accepted += v
			}
		}
	}
	return g, nil
}

// scrapeGuesses reads the counters from a daemon's /metrics (the
// Prometheus text format), summed over their labels.
func scrapeGuesses(addr string) (guesses, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return guesses{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return guesses{}, fmt.Errorf("GET %s/metrics: %s", addr, resp.Status)
	}
	var g guesses
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var to *int64
		switch {
		case strings.HasPrefix(line, draftedMetric+"{"), strings.HasPrefix(line, draftedMetric+" "):
			to = &g.drafted
		case strings.HasPrefix(line, acceptedMetric+"{"), strings.HasPrefix(line, acceptedMetric+" "):
			to = &g.accepted
		default:
			continue
		}
		f := strings.Fields(line[strings.LastIndexByte(line, '}')+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return g, fmt.Errorf("%s: %w", line, err)
		}
		*to += int64(v)
	}
	return g, sc.Err()
}

// freeAddr is a loopback address with a port free now, for the daemon's
// metrics listener.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// peerPredictions is one llama.cpp sequence's tokenPredictions.
type peerPredictions struct {
	Used, Unused, Validated, Refuted int64
}

// peerGuesses sums a run's predictions: those checked (validated +
// refuted) and those validated. node-llama-cpp counts as refuted every
// predicted token from the first wrong one on, as brokerd counts a
// guess's rows run.
func peerGuesses(r peerRun) guesses {
	var g guesses
	for _, p := range r.Predictions {
		g.drafted += p.Validated + p.Refuted
		g.accepted += p.Validated
	}
	return g
}

// sameTokens says how far an engine's tokens with guesses follow its
// tokens without, for each check prompt.
func sameTokens(on, off [][]int32) string {
	var parts []string
	for i := range on {
		parts = append(parts, fmt.Sprintf("%d/%d", prefix(on[i], off[i]), len(off[i])))
	}
	return strings.Join(parts, ", ")
}
