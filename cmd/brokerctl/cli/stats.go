package cli

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// failureReasons is the order of the scheduler's failure reasons in the
// FAILED column (the order of the API's comment); other reasons follow
// alphabetically.
var failureReasons = []string{"rejected", "cancelled", "timeout", "backend"}

func statsCmd(fs *flag.FlagSet) action {
	model := fs.String("model", "", "only the model `NAME`")
	asJSON := jsonFlag(fs, "GetStatsResponse")
	return func(ctx context.Context, inv *invocation, _ []string) error {
		c, err := inv.broker(ctx)
		if err != nil {
			return err
		}
		resp, err := c.GetStats(ctx, &brokerv1.GetStatsRequest{Model: *model})
		if err != nil {
			return err
		}
		if *asJSON {
			return inv.writeJSON(resp)
		}
		var b bytes.Buffer
		batch, gens := splitStats(resp.GetStats())
		if len(batch) > 0 || len(gens) == 0 {
			if err := writeStatsTable(&b, batch); err != nil {
				return err
			}
		}
		if len(gens) > 0 {
			if len(batch) > 0 {
				b.WriteString("\n")
			}
			if err := writeGenTable(&b, gens); err != nil {
				return err
			}
		}
		return inv.write(b.Bytes())
	}
}

// splitStats sorts rows by model and device (a model's total row, no
// device, first) and parts the batch queues' rows from the generators'.
func splitStats(stats []*brokerv1.QueueStats) (batch, gens []*brokerv1.QueueStats) {
	sorted := slices.Clone(stats)
	slices.SortStableFunc(sorted, func(a, b *brokerv1.QueueStats) int {
		if c := strings.Compare(a.GetModel(), b.GetModel()); c != 0 {
			return c
		}
		return strings.Compare(a.GetDeviceId(), b.GetDeviceId())
	})
	for _, s := range sorted {
		if s.GetGeneration() != nil {
			gens = append(gens, s)
		} else {
			batch = append(batch, s)
		}
	}
	return batch, gens
}

// deviceCell is a row's device, "all" for a model's total row.
func deviceCell(s *brokerv1.QueueStats) string {
	if s.GetDeviceId() == "" {
		return "all"
	}
	return s.GetDeviceId()
}

// writeStatsTable prints one row per (model, device) of batch queues, in
// splitStats's order; a model's total row shows "all".
func writeStatsTable(w io.Writer, sorted []*brokerv1.QueueStats) error {
	tw := newTable(w)
	row(tw, "", "MODEL", "DEVICE", "QUEUED", "RUNNING", "COMPLETED", "FAILED", "MEAN-BATCH", "P50", "P95", "P99", "ITEMS/S", "BUSY-ITEMS/S")
	for _, s := range sorted {
		lat := s.GetLatency()
		row(tw, "", orDash(s.GetModel()), deviceCell(s),
			strconv.FormatInt(s.GetQueued(), 10), strconv.FormatInt(s.GetRunning(), 10), strconv.FormatInt(s.GetCompleted(), 10),
			failureCell(s.GetFailed()), strconv.FormatFloat(s.GetMeanBatchSize(), 'f', 2, 64),
			formatMs(lat.GetP50Seconds()*1e3), formatMs(lat.GetP95Seconds()*1e3), formatMs(lat.GetP99Seconds()*1e3),
			strconv.FormatFloat(s.GetRecentItemsPerSecond(), 'f', 1, 64), strconv.FormatFloat(s.GetItemsPerSecond(), 'f', 1, 64))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write stats table: %w", err)
	}
	return nil
}

// writeGenTable prints the generators' rows: sequences running and waiting,
// completed and failed, prompt and output tokens per second over the last
// 10 s, time to first token and between tokens (p50, p99), KV-cache blocks
// used/total and the cache's type, the share of prompt tokens the prefix
// cache mapped, preemptions, the share of guessed tokens kept
// (speculative decoding), and the samples put off for a grammar's mask.
func writeGenTable(w io.Writer, sorted []*brokerv1.QueueStats) error {
	tw := newTable(w)
	row(tw, "", "MODEL", "DEVICE", "RUNNING", "WAITING", "COMPLETED", "FAILED", "PROMPT-TOK/S", "OUT-TOK/S",
		"TTFT-P50", "TTFT-P99", "ITL-P50", "ITL-P99", "KV-BLOCKS", "KV-TYPE", "PREFIX-HIT", "PREEMPTED", "ACCEPT", "DEFERRED")
	for _, s := range sorted {
		g := s.GetGeneration()
		row(tw, "", orDash(s.GetModel()), deviceCell(s), strconv.FormatInt(s.GetRunning(), 10), strconv.FormatInt(s.GetQueued(), 10),
			strconv.FormatInt(s.GetCompleted(), 10), failureCell(s.GetFailed()),
			strconv.FormatFloat(g.GetPromptTokensPerSecond(), 'f', 1, 64), strconv.FormatFloat(g.GetOutputTokensPerSecond(), 'f', 1, 64),
			formatMs(g.GetTimeToFirstToken().GetP50Seconds()*1e3), formatMs(g.GetTimeToFirstToken().GetP99Seconds()*1e3),
			formatMs(g.GetInterTokenLatency().GetP50Seconds()*1e3), formatMs(g.GetInterTokenLatency().GetP99Seconds()*1e3),
			kvCell(g), orDash(g.GetKvCacheDtype()), prefixCell(g), strconv.FormatInt(g.GetPreemptions(), 10), acceptCell(g),
			strconv.FormatInt(g.GetDeferredSamples(), 10))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write generator table: %w", err)
	}
	return nil
}

// kvCell is "used/total" KV-cache blocks, or "-" when the executor does not
// report its cache.
func kvCell(g *brokerv1.GenerationStats) string {
	if g.GetKvCacheBlocksTotal() == 0 {
		return "-"
	}
	return strconv.FormatInt(g.GetKvCacheBlocksUsed(), 10) + "/" + strconv.FormatInt(g.GetKvCacheBlocksTotal(), 10)
}

// prefixCell is the prompt tokens the prefix cache mapped instead of
// computing, as a percentage of the prompt tokens, or "-" before any.
func prefixCell(g *brokerv1.GenerationStats) string {
	if g.GetPromptTokens() <= 0 {
		return "-"
	}
	return strconv.FormatFloat(100*float64(g.GetPrefixCacheHitTokens())/float64(g.GetPromptTokens()), 'f', 1, 64) + "%"
}

// acceptCell is the guessed tokens kept of those run (speculative
// decoding) as a percentage, or "-" when none were guessed (it is off, or
// nothing matched yet).
func acceptCell(g *brokerv1.GenerationStats) string {
	if g.GetSpecDraftTokens() <= 0 {
		return "-"
	}
	return strconv.FormatFloat(100*float64(g.GetSpecAcceptedTokens())/float64(g.GetSpecDraftTokens()), 'f', 1, 64) + "%"
}

// failureCell prints failures by reason, known reasons first, zero counts
// left out: "timeout=2 backend=1", or "-" when there are none.
func failureCell(failed map[string]int64) string {
	var parts []string
	for _, r := range failureReasons {
		if n := failed[r]; n != 0 {
			parts = append(parts, r+"="+strconv.FormatInt(n, 10))
		}
	}
	var others []string
	for r, n := range failed {
		if n != 0 && !slices.Contains(failureReasons, r) {
			others = append(others, r+"="+strconv.FormatInt(n, 10))
		}
	}
	slices.Sort(others)
	return orDash(strings.Join(append(parts, others...), " "))
}

func drainCmd(fs *flag.FlagSet) action {
	exit := fs.Bool("exit", false, "make brokerd exit once drained")
	asJSON := jsonFlag(fs, "DrainResponse")
	return func(ctx context.Context, inv *invocation, _ []string) error {
		c, err := inv.broker(ctx)
		if err != nil {
			return err
		}
		resp, err := c.Drain(ctx, &brokerv1.DrainRequest{Exit: *exit})
		if err != nil {
			return err
		}
		if *asJSON {
			return inv.writeJSON(resp)
		}
		msg := fmt.Sprintf("drained: %d item(s) completed while draining\n", resp.GetCompleted())
		if *exit {
			msg += "brokerd is exiting\n"
		} else {
			msg += "brokerd accepts no new work until it restarts\n"
		}
		return inv.write([]byte(msg))
	}
}
