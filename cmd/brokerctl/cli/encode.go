package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/brokerd/brokerd/client"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// DefaultEncodeBatch is how many items encode puts in one request when it
// reads lines: large enough to amortise the RPC, small enough that the first
// results come back soon from a long file.
const DefaultEncodeBatch = 256

// vectorHead is how many leading vector values the human output shows.
const vectorHead = 4

func parseFidelity(s string) (brokerv1.Fidelity, bool) {
	switch strings.ToLower(s) {
	case "semantic":
		return brokerv1.Fidelity_FIDELITY_SEMANTIC, true
	case "lossless":
		return brokerv1.Fidelity_FIDELITY_LOSSLESS, true
	case "both":
		return brokerv1.Fidelity_FIDELITY_BOTH, true
	}
	return brokerv1.Fidelity_FIDELITY_UNSPECIFIED, false
}

func parsePriority(s string) (brokerv1.Priority, bool) {
	switch strings.ToLower(s) {
	case "":
		return brokerv1.Priority_PRIORITY_UNSPECIFIED, true
	case "low":
		return brokerv1.Priority_PRIORITY_LOW, true
	case "normal":
		return brokerv1.Priority_PRIORITY_NORMAL, true
	case "high":
		return brokerv1.Priority_PRIORITY_HIGH, true
	}
	return brokerv1.Priority_PRIORITY_UNSPECIFIED, false
}

// encodeFlags are encode's flags; build turns them into the request every
// batch of items is sent with.
type encodeFlags struct {
	model, fidelity, priority, device, typ, file string
	noNormalize, noTruncate, asJSON              bool
	batch                                        int
}

func (f *encodeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.model, "model", "", "model `NAME` (default: the server's default, nbmf-hash-v1)")
	fs.StringVar(&f.fidelity, "fidelity", "semantic", "fidelity `F` of each item: semantic (vector), lossless (compressed code) or both")
	fs.BoolVar(&f.noNormalize, "no-normalize", false, "do not L2-normalise the vectors")
	fs.BoolVar(&f.noTruncate, "no-truncate", false, "refuse texts longer than the model takes instead of cutting them (cut ones are listed after the table)")
	fs.StringVar(&f.priority, "priority", "", "scheduling priority `P`: low, normal or high (default: normal)")
	fs.StringVar(&f.device, "device", "", "run on device `ID`, e.g. gpu:0")
	fs.StringVar(&f.typ, "type", "", "run on a device of type `T`: cpu, gpu or tpu")
	fs.StringVar(&f.file, "file", "", "read the texts from `PATH`, one per line")
	fs.IntVar(&f.batch, "batch", DefaultEncodeBatch, "at most `N` items per request")
	fs.BoolVar(&f.asJSON, "json", false, "print each EncodeResponse as JSON (protojson, snake_case field names)")
}

// template validates the flags and returns the request without items.
func (f *encodeFlags) template() (*brokerv1.EncodeRequest, error) {
	fid, ok := parseFidelity(f.fidelity)
	if !ok {
		return nil, usagef("--fidelity %q: want semantic, lossless or both", f.fidelity)
	}
	prio, ok := parsePriority(f.priority)
	if !ok {
		return nil, usagef("--priority %q: want low, normal or high", f.priority)
	}
	if f.batch < 1 {
		return nil, usagef("--batch %d: must be at least 1", f.batch)
	}
	req := &brokerv1.EncodeRequest{Model: f.model, Fidelity: fid, Priority: prio, DeviceId: f.device}
	if f.typ != "" {
		t, ok := parseDeviceType(f.typ)
		if !ok || t == brokerv1.DeviceType_DEVICE_TYPE_AMD_GPU || t == brokerv1.DeviceType_DEVICE_TYPE_EDGE_TPU {
			return nil, usagef("--type %q: want cpu, gpu or tpu", f.typ)
		}
		req.DeviceType = t
	}
	// Unset means the server's default (true); only send false.
	if f.noNormalize {
		req.Normalize = proto.Bool(false)
	}
	if f.noTruncate {
		req.Truncate = proto.Bool(false)
	}
	return req, nil
}

// textSource yields the texts to encode one at a time, io.EOF at the end, so
// a long file is never held in memory.
type textSource interface {
	next() (string, error)
}

type argSource struct{ args []string }

func (s *argSource) next() (string, error) {
	if len(s.args) == 0 {
		return "", io.EOF
	}
	t := s.args[0]
	s.args = s.args[1:]
	return t, nil
}

// lineSource reads one text per line. Lines may end in \n or \r\n; a last
// line without a newline counts. Empty lines are items too (the server
// rejects them, naming the index), so indexes always match line numbers.
type lineSource struct {
	r    *bufio.Reader
	name string
}

func (s *lineSource) next() (string, error) {
	line, err := s.r.ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read %s: %w", s.name, err)
	}
	if errors.Is(err, io.EOF) && line == "" {
		return "", io.EOF
	}
	line = strings.TrimSuffix(line, "\n")
	return strings.TrimSuffix(line, "\r"), nil
}

// isTerminal reports whether r is a character device (an interactive
// terminal), which encode must not wait on for lines.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// source picks where the texts come from: --file, "-" (stdin), arguments, or
// stdin when there are no arguments and it is not a terminal.
func (f *encodeFlags) source(inv *invocation, args []string) (textSource, func(), error) {
	dash := len(args) == 1 && args[0] == "-"
	switch {
	case f.file != "" && len(args) > 0:
		return nil, nil, usagef("give texts as arguments or with --file, not both")
	case f.file != "":
		fh, err := os.Open(f.file)
		if err != nil {
			return nil, nil, fmt.Errorf("open --file: %w", err)
		}
		return &lineSource{r: bufio.NewReader(fh), name: f.file}, func() { _ = fh.Close() }, nil
	case !dash && len(args) > 0:
		for _, a := range args {
			if a == "-" {
				return nil, nil, usagef(`"-" (read stdin) cannot be mixed with text arguments`)
			}
		}
		return &argSource{args: args}, func() {}, nil
	case dash || (inv.stdin != nil && !isTerminal(inv.stdin)):
		if inv.stdin == nil {
			return nil, nil, usagef("no stdin to read texts from")
		}
		return &lineSource{r: bufio.NewReader(inv.stdin), name: "stdin"}, func() {}, nil
	}
	return nil, nil, usagef("no texts: give TEXT arguments, - to read lines from stdin, or --file PATH")
}

func encodeCmd(fs *flag.FlagSet) action {
	f := &encodeFlags{}
	f.register(fs)
	return func(ctx context.Context, inv *invocation, args []string) error {
		tmpl, err := f.template()
		if err != nil {
			return err
		}
		src, done, err := f.source(inv, args)
		if err != nil {
			return err
		}
		defer done()
		c, err := inv.lib(ctx)
		if err != nil {
			return err
		}
		e := &encoder{inv: inv, client: c, tmpl: tmpl, asJSON: f.asJSON}
		var items []*brokerv1.EncodeItem
		total := 0
		for {
			text, err := src.next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			// The ID is the 0-based input index, so results of later
			// requests can be matched to their line; the server echoes it.
			items = append(items, encodeItem(strconv.Itoa(total), text))
			total++
			if len(items) == f.batch {
				if err := e.send(ctx, items, total-len(items)); err != nil {
					return err
				}
				items = nil
			}
		}
		if len(items) > 0 {
			if err := e.send(ctx, items, total-len(items)); err != nil {
				return err
			}
		}
		if total == 0 {
			return errors.New("no texts to encode: the input was empty")
		}
		return nil
	}
}

// encoder sends batches of items one request at a time and prints each
// response as it arrives.
type encoder struct {
	inv      *invocation
	client   *client.Client
	tmpl     *brokerv1.EncodeRequest
	asJSON   bool
	requests int
}

func (e *encoder) send(ctx context.Context, items []*brokerv1.EncodeItem, first int) error {
	req := proto.CloneOf(e.tmpl)
	req.Items = items
	e.requests++
	resp, err := e.client.Encode(ctx, req)
	if err != nil {
		// The server names indexes within this request; after the first
		// request those differ from input indexes, so say which items.
		if st, ok := status.FromError(err); ok && first > 0 {
			p := st.Proto()
			p.Message = fmt.Sprintf("request %d (items %d-%d): %s", e.requests, first, first+len(items)-1, p.Message)
			return fmt.Errorf("encode: %w", status.FromProto(p).Err())
		}
		return fmt.Errorf("encode: %w", err)
	}
	if err := checkResults(items, resp.GetResults()); err != nil {
		return err
	}
	if e.asJSON {
		return e.inv.writeJSON(resp)
	}
	var b bytes.Buffer
	if e.requests > 1 {
		b.WriteByte('\n')
	}
	if err := writeEncodeResults(&b, resp); err != nil {
		return err
	}
	return e.inv.write(b.Bytes())
}

// checkResults holds the server to the contract: one result per item, in
// request order, each echoing its item's ID.
func checkResults(items []*brokerv1.EncodeItem, results []*brokerv1.EncodeResult) error {
	if len(results) != len(items) {
		return fmt.Errorf("encode: the server returned %d results for %d items", len(results), len(items))
	}
	for i, r := range results {
		if r.GetId() != items[i].GetId() {
			return fmt.Errorf("encode: result %d has id %q, want %q (results out of order)", i, r.GetId(), items[i].GetId())
		}
	}
	return nil
}

// writeEncodeResults prints one response: a table of its items, then what
// ran where.
func writeEncodeResults(w io.Writer, resp *brokerv1.EncodeResponse) error {
	results := resp.GetResults()
	var hasVec, hasCode bool
	for _, r := range results {
		hasVec = hasVec || len(r.GetVector()) > 0
		hasCode = hasCode || r.GetCode() != nil || r.GetCodec() != ""
	}
	header := []string{"ID"}
	if hasVec {
		header = append(header, "DIM", "VECTOR")
	}
	if hasCode {
		header = append(header, "CODE", "CODEC")
	}
	header = append(header, "SIGNATURE")
	tw := newTable(w)
	row(tw, "", header...)
	for _, r := range results {
		cells := []string{orDash(r.GetId())}
		if hasVec {
			cells = append(cells, strconv.Itoa(len(r.GetVector()))+"d", vectorPreview(r.GetVector()))
		}
		if hasCode {
			cells = append(cells, strconv.Itoa(len(r.GetCode()))+" B", orDash(r.GetCodec()))
		}
		cells = append(cells, orDash(r.GetSignature()))
		row(tw, "", cells...)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write encode results: %w", err)
	}
	var cut []string
	for _, r := range results {
		if r.GetTruncated() {
			cut = append(cut, orDash(r.GetId()))
		}
	}
	if len(cut) > 0 {
		fmt.Fprintf(w, "truncated to the model's length (their vectors describe their beginning; --no-truncate refuses them): %s\n", strings.Join(cut, ", "))
	}
	_, err := fmt.Fprintf(w, "execution: %s\n", executionLine(resp.GetModel(), resp.GetModelVersion(), resp.GetExecution()))
	return err
}

// vectorPreview is the first few values of v: [0.0123 -0.0456 ...].
func vectorPreview(v []float32) string {
	if len(v) == 0 {
		return "-"
	}
	n := min(len(v), vectorHead)
	parts := make([]string, 0, n+1)
	for _, x := range v[:n] {
		parts = append(parts, strconv.FormatFloat(float64(x), 'f', 4, 32))
	}
	if len(v) > n {
		parts = append(parts, "...")
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// executionLine summarises an ExecutionInfo on one line.
func executionLine(model string, version int64, x *brokerv1.ExecutionInfo) string {
	var b strings.Builder
	if model != "" {
		b.WriteString("model " + model)
		if version > 0 {
			fmt.Fprintf(&b, " v%d", version)
		}
		b.WriteString(", ")
	}
	if x == nil {
		b.WriteString("no execution info")
		return b.String()
	}
	devices := x.GetDeviceId()
	if len(x.GetDeviceIds()) > 1 {
		devices = strings.Join(x.GetDeviceIds(), ",")
	}
	fmt.Fprintf(&b, "device %s (%s), ", orDash(devices), typeName(x.GetDeviceType()))
	if x.GetBatchSize() == 0 {
		b.WriteString("host work, no batch") // LOSSLESS alone: compression in the handler
	} else {
		fmt.Fprintf(&b, "batch %d", x.GetBatchSize())
	}
	if len(x.GetBatchSizes()) > 0 {
		fmt.Fprintf(&b, " (sizes %s)", joinInts(x.GetBatchSizes(), ","))
	}
	fmt.Fprintf(&b, ", queue %s, compute %s, total %s, cost $%s",
		formatMs(float64(x.GetQueueNs())/1e6), formatMs(float64(x.GetComputeNs())/1e6), formatMs(float64(x.GetTotalNs())/1e6),
		strconv.FormatFloat(x.GetCostUsd(), 'f', -1, 64))
	return b.String()
}

// formatMs prints milliseconds with microsecond resolution: 0.052ms.
func formatMs(ms float64) string {
	return strconv.FormatFloat(ms, 'f', 3, 64) + "ms"
}

// encodeItem sends text as a text item, or as bytes when it is not valid
// UTF-8 (a proto string must be, and the server encodes both alike).
func encodeItem(id, text string) *brokerv1.EncodeItem {
	if !utf8.ValidString(text) {
		return &brokerv1.EncodeItem{Id: id, Content: &brokerv1.EncodeItem_Data{Data: []byte(text)}}
	}
	return &brokerv1.EncodeItem{Id: id, Content: &brokerv1.EncodeItem_Text{Text: text}}
}
