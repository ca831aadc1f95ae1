package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/term"
	"google.golang.org/grpc"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// Terminal control for the live view: the alternate screen keeps the user's
// scrollback intact, and each frame overwrites the last one in place (home,
// every line cleared to its end, the rest of the screen cleared) instead of
// clearing first, which flickers.
const (
	enterScreen = "\x1b[?1049h\x1b[?25l" // alternate screen, cursor hidden
	leaveScreen = "\x1b[?25h\x1b[?1049l"
	cursorHome  = "\x1b[H"
	clearEOL    = "\x1b[K"
	clearBelow  = "\x1b[J"
)

func topCmd(fs *flag.FlagSet) action {
	interval := fs.Duration("interval", time.Second, "refresh every `DURATION`")
	once := fs.Bool("once", false, "print one frame as plain text (no escape codes) and exit: for pipes and scripts")
	model := fs.String("model", "", "only the model `NAME`")
	return func(ctx context.Context, inv *invocation, _ []string) error {
		if *interval <= 0 {
			return usagef("--interval %s: must be positive", *interval)
		}
		c, err := inv.broker(ctx)
		if err != nil {
			return err
		}
		v := &topView{client: c, model: *model, interval: *interval, rpcTimeout: inv.timeout, now: time.Now}
		if *once {
			f, err := v.fetch(ctx)
			if err != nil {
				return err
			}
			var b bytes.Buffer
			if err := renderTop(&b, f, 0); err != nil { // one frame: no refresh, no keys
				return err
			}
			return inv.write(b.Bytes())
		}

		// Keys come from stdin. A terminal goes into raw mode so q needs no
		// Enter (Ctrl-C then arrives as a byte, not a signal); a pipe is read
		// as it is, so `echo q | brokerctl top` quits too.
		var keys <-chan byte
		if inv.stdin != nil {
			if f, ok := inv.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
				state, err := term.MakeRaw(int(f.Fd()))
				if err != nil {
					return fmt.Errorf("terminal raw mode: %w", err)
				}
				defer func() { _ = term.Restore(int(f.Fd()), state) }()
			}
			keys = readKeys(inv.stdin)
		}
		tick := time.NewTicker(v.interval)
		defer tick.Stop()
		return v.loop(ctx, inv.stdout, keys, tick.C)
	}
}

// topClient is the part of the broker API top reads.
type topClient interface {
	ListDevices(ctx context.Context, in *brokerv1.ListDevicesRequest, opts ...grpc.CallOption) (*brokerv1.ListDevicesResponse, error)
	GetStats(ctx context.Context, in *brokerv1.GetStatsRequest, opts ...grpc.CallOption) (*brokerv1.GetStatsResponse, error)
}

// topView fetches and draws frames. now is a field so tests fix the clock.
type topView struct {
	client     topClient
	model      string
	interval   time.Duration
	rpcTimeout time.Duration
	now        func() time.Time
}

// topFrame is one refresh: what brokerd said, when, or why it said nothing.
type topFrame struct {
	at      time.Time
	devices []*brokerv1.Device
	stats   []*brokerv1.QueueStats
	err     error
}

func (v *topView) fetch(ctx context.Context) (topFrame, error) {
	f := topFrame{at: v.now()}
	if v.rpcTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, v.rpcTimeout)
		defer cancel()
	}
	devs, err := v.client.ListDevices(ctx, &brokerv1.ListDevicesRequest{})
	if err != nil {
		return f, err
	}
	stats, err := v.client.GetStats(ctx, &brokerv1.GetStatsRequest{Model: v.model})
	if err != nil {
		return f, err
	}
	f.devices, f.stats = devs.GetDevices(), stats.GetStats()
	return f, nil
}

// loop draws a frame now and on every tick until a quit key, the end of ctx
// (Ctrl-C outside raw mode cancels it) or a failed first fetch. A later
// failure (brokerd restarting) is shown in the frame and retried.
func (v *topView) loop(ctx context.Context, out io.Writer, keys <-chan byte, tick <-chan time.Time) error {
	f, err := v.fetch(ctx)
	if err != nil {
		return err
	}
	if _, err := io.WriteString(out, enterScreen); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	defer func() { _, _ = io.WriteString(out, leaveScreen) }()
	for {
		if err := v.draw(out, f); err != nil {
			return err
		}
		if quit, err := waitTick(ctx, &keys, tick); quit {
			return err
		}
		prev := f
		if f, err = v.fetch(ctx); err != nil {
			if ctx.Err() != nil {
				continue // waitTick ends the loop
			}
			f = topFrame{at: f.at, devices: prev.devices, stats: prev.stats, err: err}
		}
	}
}

// waitTick waits for the next refresh. It reports quit for a quit key or the
// end of ctx (a cancel is a clean exit: Ctrl-C outside raw mode); other keys
// are read and ignored without a redraw.
func waitTick(ctx context.Context, keys *<-chan byte, tick <-chan time.Time) (quit bool, err error) {
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return true, nil
			}
			return true, ctx.Err()
		case k, ok := <-*keys:
			if !ok {
				*keys = nil // stdin ended (a pipe, /dev/null): only ticks and Ctrl-C remain
				continue
			}
			if isQuitKey(k) {
				return true, nil
			}
		case <-tick:
			return false, nil
		}
	}
}

func (v *topView) draw(out io.Writer, f topFrame) error {
	var b bytes.Buffer
	if err := renderTop(&b, f, v.interval); err != nil {
		return err
	}
	if _, err := out.Write(liveFrame(b.Bytes())); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}

// liveFrame turns a plain frame into terminal output that replaces the last
// one. Lines end in \r\n because raw mode turns off the terminal's own \n
// translation.
func liveFrame(plain []byte) []byte {
	var b bytes.Buffer
	b.WriteString(cursorHome)
	for _, line := range strings.Split(strings.TrimSuffix(string(plain), "\n"), "\n") {
		b.WriteString(line)
		b.WriteString(clearEOL + "\r\n")
	}
	b.WriteString(clearBelow)
	return b.Bytes()
}

// isQuitKey reports the keys that end top: q, Q, and Ctrl-C (ETX) or Ctrl-D
// (EOT), which raw mode delivers as bytes instead of signals.
func isQuitKey(k byte) bool {
	switch k {
	case 'q', 'Q', 0x03, 0x04:
		return true
	}
	return false
}

// readKeys delivers r's bytes until it ends. The reading goroutine stays
// blocked on a terminal after top returns; the process exits right after.
func readKeys(r io.Reader) <-chan byte {
	ch := make(chan byte, 16)
	go func() {
		defer close(ch)
		buf := make([]byte, 64)
		for {
			n, err := r.Read(buf)
			for _, k := range buf[:n] {
				ch <- k
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

// renderTop prints one frame as plain text: a title line, the devices, and
// the queues per model and device. Interval 0 is a single frame (--once):
// its title promises no refresh and names no keys.
func renderTop(w io.Writer, f topFrame, interval time.Duration) error {
	if interval > 0 {
		fmt.Fprintf(w, "brokerd top  %s  every %s  (q or Ctrl-C quits)\n", f.at.Format("15:04:05"), interval)
	} else {
		fmt.Fprintf(w, "brokerd top  %s\n", f.at.Format("15:04:05"))
	}
	if f.err != nil {
		fmt.Fprintf(w, "refresh failed, showing the last frame: %v\n", f.err)
	}
	fmt.Fprintln(w)
	tw := newTable(w)
	row(tw, "", "DEVICE", "TYPE", "NAME", "MEMORY", "UTIL", "TEMP", "HEALTH", "CORDONED")
	for _, d := range f.devices {
		t := d.GetTelemetry()
		row(tw, "", d.GetId(), typeName(d.GetType()), orDash(d.GetName()), memoryCell(d), utilCell(t), tempCell(t),
			enumName(d.GetHealth().Descriptor(), d.GetHealth().Number()), yesNo(d.GetCordoned()))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write devices: %w", err)
	}

	fmt.Fprintln(w)
	stats, gens := splitStats(f.stats)
	if len(stats) == 0 && len(gens) > 0 {
		// Generators only: their table alone.
		return writeGenTable(w, gens)
	}
	tw = newTable(w)
	row(tw, "", "MODEL", "DEVICE", "QUEUED", "RUNNING", "ITEMS/S", "BUSY-ITEMS/S", "P99", "MEAN-BATCH")
	for _, s := range stats {
		row(tw, "", orDash(s.GetModel()), deviceCell(s), strconv.FormatInt(s.GetQueued(), 10), strconv.FormatInt(s.GetRunning(), 10),
			strconv.FormatFloat(s.GetRecentItemsPerSecond(), 'f', 1, 64), strconv.FormatFloat(s.GetItemsPerSecond(), 'f', 1, 64),
			formatMs(s.GetLatency().GetP99Seconds()*1e3),
			strconv.FormatFloat(s.GetMeanBatchSize(), 'f', 2, 64))
	}
	if len(stats) == 0 {
		row(tw, "", "(no models)")
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write queues: %w", err)
	}
	if len(gens) > 0 {
		fmt.Fprintln(w)
		return writeGenTable(w, gens)
	}
	return nil
}

// memoryCell is used/total from live telemetry, or the total alone.
func memoryCell(d *brokerv1.Device) string {
	t := d.GetTelemetry()
	total := t.GetMemoryTotalBytes()
	if total == 0 {
		total = d.GetMemoryTotalBytes()
	}
	if t == nil || t.GetMemoryUsedBytes() == 0 {
		return humanBytes(total)
	}
	return humanBytes(t.GetMemoryUsedBytes()) + " / " + humanBytes(total)
}

func utilCell(t *brokerv1.Telemetry) string {
	if t == nil {
		return "-"
	}
	return strconv.FormatFloat(t.GetUtilizationPercent(), 'f', 0, 64) + "%"
}

func tempCell(t *brokerv1.Telemetry) string {
	if t.GetTemperatureCelsius() == 0 {
		return "-"
	}
	return strconv.FormatFloat(t.GetTemperatureCelsius(), 'f', 0, 64) + " C"
}
