package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, " ") }

func (l *stringList) Set(s string) error {
	*l = append(*l, s)
	return nil
}

// tensorJSON is an input file of infer, and each output of infer --json:
// {"shape": [2, 3], "datatype": "FP32", "data": [[1, 2, 3], [4, 5, 6]]}.
// data may be nested or flat; BYTES data are strings.
type tensorJSON struct {
	Name     string  `json:"name,omitempty"`
	Shape    []int64 `json:"shape"`
	Datatype string  `json:"datatype"`
	Data     any     `json:"data"`
	// Labels name an output's columns (a classifier's id2label); an
	// input file may carry them, and they are ignored there.
	Labels []string `json:"labels,omitempty"`
}

// elementSizes are the fixed sizes of the datatypes infer writes.
var elementSizes = map[brokerv1.DataType]int{
	brokerv1.DataType_DATA_TYPE_FP32: 4, brokerv1.DataType_DATA_TYPE_FP64: 8,
	brokerv1.DataType_DATA_TYPE_INT8: 1, brokerv1.DataType_DATA_TYPE_INT16: 2, brokerv1.DataType_DATA_TYPE_INT32: 4,
	brokerv1.DataType_DATA_TYPE_INT64: 8, brokerv1.DataType_DATA_TYPE_UINT8: 1, brokerv1.DataType_DATA_TYPE_BOOL: 1,
}

func inferCmd(fs *flag.FlagSet) action {
	var inputs, outputs stringList
	fs.Var(&inputs, "input", "input `NAME=@FILE` (a JSON tensor file; @- reads stdin) or NAME=JSON inline; repeat for each input")
	fs.Var(&outputs, "output", "only the output `NAME` (repeatable; default: every output)")
	version := fs.Int64("version", 0, "run version `V` (default: the one serving)")
	priority := fs.String("priority", "", "scheduling priority `P`: low, normal or high (default: normal)")
	device := fs.String("device", "", "run on device `ID`, e.g. gpu:0")
	typ := fs.String("type", "", "run on a device of type `T`: cpu, gpu or tpu")
	noTruncate := fs.Bool("no-truncate", false, "refuse texts longer than the model takes instead of truncating them")
	deadline := fs.Duration("deadline", 0, "server-side timeout `DUR` of the request (0: none besides --timeout)")
	asJSON := fs.Bool("json", false, "print the outputs as JSON tensors (the input file format) with the execution info")
	return func(ctx context.Context, inv *invocation, args []string) error {
		if len(inputs) == 0 {
			return usagef("give at least one --input NAME=@FILE")
		}
		prio, ok := parsePriority(*priority)
		if !ok {
			return usagef("--priority %q: want low, normal or high", *priority)
		}
		req := &brokerv1.InferRequest{Model: args[0], ModelVersion: *version, Outputs: outputs, Priority: prio, DeviceId: *device}
		if *typ != "" {
			t, ok := parseDeviceType(*typ)
			if !ok || t == brokerv1.DeviceType_DEVICE_TYPE_AMD_GPU || t == brokerv1.DeviceType_DEVICE_TYPE_EDGE_TPU {
				return usagef("--type %q: want cpu, gpu or tpu", *typ)
			}
			req.DeviceType = t
		}
		if *noTruncate {
			req.Truncate = proto.Bool(false)
		}
		if *deadline > 0 {
			req.Timeout = durationpb.New(*deadline)
		}
		for _, spec := range inputs {
			t, err := readInput(spec, inv.stdin)
			if err != nil {
				return err
			}
			req.Inputs = append(req.Inputs, t)
		}
		c, err := inv.broker(ctx)
		if err != nil {
			return err
		}
		resp, err := c.Infer(ctx, req)
		if err != nil {
			return err
		}
		labels := classLabels(ctx, c, resp)
		var b bytes.Buffer
		if *asJSON {
			err = writeInferJSON(&b, resp, labels)
		} else {
			err = writeInferResult(&b, resp, labels)
		}
		if err != nil {
			return err
		}
		return inv.write(b.Bytes())
	}
}

// readInput reads one --input NAME=@FILE (or NAME=@-, or NAME=JSON).
func readInput(spec string, stdin io.Reader) (*brokerv1.Tensor, error) {
	name, val, ok := strings.Cut(spec, "=")
	if !ok || name == "" || val == "" {
		return nil, usagef("--input %q: want NAME=@FILE, NAME=@- or NAME=JSON", spec)
	}
	var content []byte
	switch {
	case val == "@-":
		if stdin == nil {
			return nil, usagef("--input %s=@-: no standard input", name)
		}
		b, err := io.ReadAll(stdin)
		if err != nil {
			return nil, fmt.Errorf("--input %s: read stdin: %w", name, err)
		}
		content = b
	case strings.HasPrefix(val, "@"):
		b, err := os.ReadFile(val[1:])
		if err != nil {
			return nil, fmt.Errorf("--input %s: %w", name, err)
		}
		content = b
	default:
		content = []byte(val)
	}
	t, err := parseTensorJSON(name, content)
	if err != nil {
		return nil, usagef("--input %s: %v", name, err)
	}
	return t, nil
}

// parseTensorJSON reads a tensor document, or a plain (nested) array of
// numbers as FP32 with the shape of its nesting.
func parseTensorJSON(name string, content []byte) (*brokerv1.Tensor, error) {
	var doc any
	dec := json.NewDecoder(bytes.NewReader(content))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	var (
		data  any
		shape []int64
		dtype = "FP32"
	)
	switch d := doc.(type) {
	case []any:
		data = d
	case map[string]any:
		for k := range d {
			if k != "shape" && k != "datatype" && k != "data" && k != "name" && k != "labels" {
				return nil, fmt.Errorf("unknown key %q: want shape, datatype and data", k)
			}
		}
		var ok bool
		if data, ok = d["data"]; !ok {
			return nil, errors.New(`no "data"`)
		}
		if s, ok := d["datatype"].(string); ok {
			dtype = strings.ToUpper(s)
		} else if d["datatype"] != nil {
			return nil, errors.New(`"datatype" must be a string such as "FP32"`)
		}
		if raw, ok := d["shape"]; ok {
			list, ok := raw.([]any)
			if !ok {
				return nil, errors.New(`"shape" must be an array of integers`)
			}
			for _, x := range list {
				n, err := toInt(x)
				if err != nil || n < 0 {
					return nil, fmt.Errorf(`"shape" must be an array of integers of 0 or more, not %v`, x)
				}
				shape = append(shape, n)
			}
		}
	default:
		return nil, errors.New(`want {"shape": [...], "datatype": "FP32", "data": [...]} or a nested array of numbers`)
	}
	var flat []any
	nested, err := flatten(data, 0, &flat)
	if err != nil {
		return nil, err
	}
	if shape == nil {
		shape = nested
	}
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	if n != int64(len(flat)) {
		return nil, fmt.Errorf("%d values for shape %v (%d elements)", len(flat), shape, n)
	}
	dt, ok := brokerv1.DataType_value["DATA_TYPE_"+dtype]
	if !ok || dt == 0 || dtype == "FP16" || dtype == "BF16" {
		return nil, fmt.Errorf("datatype %q: want FP32, FP64, INT8, INT16, INT32, INT64, UINT8, BOOL or BYTES", dtype)
	}
	t := &brokerv1.Tensor{Name: name, Dtype: brokerv1.DataType(dt), Shape: shape}
	if t.Data, err = encodeValues(t.Dtype, flat); err != nil {
		return nil, err
	}
	return t, nil
}

// flatten appends the leaves of a nested array to out and returns its shape;
// the nesting must be rectangular.
func flatten(v any, depth int, out *[]any) ([]int64, error) {
	list, ok := v.([]any)
	if !ok {
		*out = append(*out, v)
		return nil, nil
	}
	var inner []int64
	for i, x := range list {
		s, err := flatten(x, depth+1, out)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			inner = s
		} else if !equalShape(s, inner) {
			return nil, fmt.Errorf("ragged array at depth %d: element %d has shape %v, element 0 %v", depth, i, s, inner)
		}
	}
	return append([]int64{int64(len(list))}, inner...), nil
}

func equalShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func toInt(v any) (int64, error) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("%v is not a number", v)
	}
	return n.Int64()
}

// encodeValues writes values as raw little-endian data of dt (BYTES: each
// string with a 4-byte little-endian length prefix).
func encodeValues(dt brokerv1.DataType, vals []any) ([]byte, error) {
	le := binary.LittleEndian
	var out []byte
	for i, v := range vals {
		if dt == brokerv1.DataType_DATA_TYPE_BYTES {
			s, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("value %d: %v is not a string (BYTES data are strings)", i, v)
			}
			out = le.AppendUint32(out, uint32(len(s)))
			out = append(out, s...)
			continue
		}
		if dt == brokerv1.DataType_DATA_TYPE_BOOL {
			b, ok := v.(bool)
			if !ok {
				return nil, fmt.Errorf("value %d: %v is not true or false", i, v)
			}
			if b {
				out = append(out, 1)
			} else {
				out = append(out, 0)
			}
			continue
		}
		num, ok := v.(json.Number)
		if !ok {
			return nil, fmt.Errorf("value %d: %v is not a number", i, v)
		}
		switch dt {
		case brokerv1.DataType_DATA_TYPE_FP32, brokerv1.DataType_DATA_TYPE_FP64:
			f, err := num.Float64()
			if err != nil {
				return nil, fmt.Errorf("value %d: %w", i, err)
			}
			if dt == brokerv1.DataType_DATA_TYPE_FP32 {
				out = le.AppendUint32(out, math.Float32bits(float32(f)))
			} else {
				out = le.AppendUint64(out, math.Float64bits(f))
			}
		default:
			n, err := strconv.ParseInt(num.String(), 10, elementSizes[dt]*8)
			if dt == brokerv1.DataType_DATA_TYPE_UINT8 {
				var u uint64
				u, err = strconv.ParseUint(num.String(), 10, 8)
				n = int64(u)
			}
			if err != nil {
				return nil, fmt.Errorf("value %d: %s does not fit %s", i, num, dtypeName(dt))
			}
			switch elementSizes[dt] {
			case 1:
				out = append(out, byte(n))
			case 2:
				out = le.AppendUint16(out, uint16(n))
			case 4:
				out = le.AppendUint32(out, uint32(n))
			default:
				out = le.AppendUint64(out, uint64(n))
			}
		}
	}
	return out, nil
}

// decodeValues reads raw data of dt into printable values.
func decodeValues(dt brokerv1.DataType, data []byte) ([]any, error) {
	le := binary.LittleEndian
	var out []any
	if dt == brokerv1.DataType_DATA_TYPE_BYTES {
		for len(data) > 0 {
			if len(data) < 4 || int(le.Uint32(data)) > len(data)-4 {
				return nil, errors.New("malformed BYTES data")
			}
			n := int(le.Uint32(data))
			out = append(out, string(data[4:4+n]))
			data = data[4+n:]
		}
		return out, nil
	}
	size := elementSizes[dt]
	if size == 0 || len(data)%size != 0 {
		return nil, fmt.Errorf("%d bytes of %s data", len(data), dtypeName(dt))
	}
	for i := 0; i < len(data); i += size {
		b := data[i:]
		switch dt {
		case brokerv1.DataType_DATA_TYPE_FP32:
			out = append(out, math.Float32frombits(le.Uint32(b)))
		case brokerv1.DataType_DATA_TYPE_FP64:
			out = append(out, math.Float64frombits(le.Uint64(b)))
		case brokerv1.DataType_DATA_TYPE_INT8:
			out = append(out, int8(b[0]))
		case brokerv1.DataType_DATA_TYPE_INT16:
			out = append(out, int16(le.Uint16(b)))
		case brokerv1.DataType_DATA_TYPE_INT32:
			out = append(out, int32(le.Uint32(b)))
		case brokerv1.DataType_DATA_TYPE_INT64:
			out = append(out, int64(le.Uint64(b)))
		case brokerv1.DataType_DATA_TYPE_UINT8:
			out = append(out, b[0])
		case brokerv1.DataType_DATA_TYPE_BOOL:
			out = append(out, b[0] != 0)
		}
	}
	return out, nil
}

// writeInferResult prints each output: a header line, then one line per row
// (the last dimension), then, for an output with a column per label, each
// row's classes highest first, then what ran where.
func writeInferResult(w io.Writer, resp *brokerv1.InferResponse, labels []string) error {
	for _, o := range resp.GetOutputs() {
		vals, err := decodeValues(o.GetDtype(), o.GetData())
		if err != nil {
			return fmt.Errorf("output %s: %w", o.GetName(), err)
		}
		fmt.Fprintf(w, "%s %s %v\n", o.GetName(), dtypeName(o.GetDtype()), o.GetShape())
		width := len(vals)
		if s := o.GetShape(); len(s) > 1 && s[len(s)-1] > 0 {
			width = int(s[len(s)-1])
		}
		for start := 0; start < len(vals); start += max(width, 1) {
			cells := make([]string, 0, width)
			for _, v := range vals[start:min(start+width, len(vals))] {
				cells = append(cells, formatValue(v))
			}
			fmt.Fprintf(w, "  %s\n", strings.Join(cells, " "))
		}
		if labelled(o, labels) {
			writeClasses(w, o.GetName(), vals, labels, len(o.GetShape()) == 2)
		}
	}
	_, err := fmt.Fprintf(w, "execution: %s\n", executionLine(resp.GetModel(), resp.GetModelVersion(), resp.GetExecution()))
	return err
}

func formatValue(v any) string {
	switch x := v.(type) {
	case float32:
		return strconv.FormatFloat(float64(x), 'g', 6, 32)
	case float64:
		return strconv.FormatFloat(x, 'g', 8, 64)
	case string:
		return strconv.Quote(x)
	}
	return fmt.Sprint(v)
}

// writeInferJSON prints {"model", "model_version", "outputs": [tensors in
// the input file format, data nested by shape], "execution"}.
func writeInferJSON(w io.Writer, resp *brokerv1.InferResponse, labels []string) error {
	type doc struct {
		Model        string          `json:"model"`
		ModelVersion int64           `json:"model_version"`
		Outputs      []tensorJSON    `json:"outputs"`
		Execution    json.RawMessage `json:"execution"`
	}
	d := doc{Model: resp.GetModel(), ModelVersion: resp.GetModelVersion(), Outputs: []tensorJSON{}}
	for _, o := range resp.GetOutputs() {
		vals, err := decodeValues(o.GetDtype(), o.GetData())
		if err != nil {
			return fmt.Errorf("output %s: %w", o.GetName(), err)
		}
		for i, v := range vals {
			if f, ok := v.(float32); ok && (math.IsNaN(float64(f)) || math.IsInf(float64(f), 0)) {
				vals[i] = strconv.FormatFloat(float64(f), 'g', -1, 32) // JSON has no NaN or Inf
			}
		}
		t := tensorJSON{Name: o.GetName(), Shape: o.GetShape(), Datatype: dtypeName(o.GetDtype()), Data: nest(vals, o.GetShape())}
		if labelled(o, labels) {
			t.Labels = labels
		}
		d.Outputs = append(d.Outputs, t)
	}
	exec, err := marshalJSON(resp.GetExecution())
	if err != nil {
		return err
	}
	d.Execution = exec
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return fmt.Errorf("marshal infer output: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// nest shapes flat values as nested arrays (flat when the shape does not
// account for them).
func nest(vals []any, shape []int64) any {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	if len(shape) <= 1 || n != int64(len(vals)) {
		return vals
	}
	rows := int(shape[0])
	out := make([]any, rows)
	step := len(vals) / max(rows, 1)
	for i := range rows {
		out[i] = nest(vals[i*step:(i+1)*step], shape[1:])
	}
	return out
}

// maxClasses is how many classes of a row infer prints, highest first.
const maxClasses = 5

// classLabels returns the labels (id2label) of the model version that
// answered resp, when one of its outputs could be a score per class;
// nil otherwise, or when brokerd does not list its models to this caller
// (labels are a convenience of the display).
func classLabels(ctx context.Context, c brokerv1.BrokerServiceClient, resp *brokerv1.InferResponse) []string {
	if !slices.ContainsFunc(resp.GetOutputs(), scores) {
		return nil
	}
	list, err := c.ListModels(ctx, &brokerv1.ListModelsRequest{})
	if err != nil {
		return nil
	}
	for _, m := range list.GetModels() {
		if m.GetName() == resp.GetModel() && m.GetVersion() == resp.GetModelVersion() {
			return m.GetLabels()
		}
	}
	return nil
}

// scores reports whether o could be a score per class: FP32 or FP64 of
// shape [classes] or [rows, classes], two classes or more.
func scores(o *brokerv1.Tensor) bool {
	s := o.GetShape()
	return len(s) > 0 && len(s) <= 2 && s[len(s)-1] > 1 &&
		(o.GetDtype() == brokerv1.DataType_DATA_TYPE_FP32 || o.GetDtype() == brokerv1.DataType_DATA_TYPE_FP64)
}

// labelled reports whether o is a score per label: a column per label.
func labelled(o *brokerv1.Tensor, labels []string) bool {
	return len(labels) > 1 && scores(o) && o.GetShape()[len(o.GetShape())-1] == int64(len(labels))
}

// writeClasses prints each row's classes, highest score first (ties: the
// lower index), at most maxClasses of them. An output named logits is
// shown as probabilities (its softmax), as a classification pipeline
// shows a single-label classifier's; any other output by its values.
func writeClasses(w io.Writer, name string, vals []any, labels []string, rows bool) {
	n := len(labels)
	softmax := name == "logits"
	head := "classes of " + name
	if softmax {
		head += " (softmax)"
	}
	head += ", highest first"
	if n > maxClasses {
		head += fmt.Sprintf(" (top %d of %d)", maxClasses, n)
	}
	fmt.Fprintf(w, "%s:\n", head)
	for r := 0; r+n <= len(vals); r += n {
		scores := make([]float64, n)
		for i, v := range vals[r : r+n] {
			switch x := v.(type) {
			case float32:
				scores[i] = float64(x)
			case float64:
				scores[i] = x
			}
		}
		if softmax {
			top := math.Inf(-1)
			for _, x := range scores {
				top = max(top, x)
			}
			var sum float64
			for i, x := range scores {
				scores[i] = math.Exp(x - top)
				sum += scores[i]
			}
			for i := range scores {
				scores[i] /= sum
			}
		}
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(scores[b], scores[a]) })
		cells := make([]string, 0, maxClasses)
		for _, i := range idx[:min(n, maxClasses)] {
			score := strconv.FormatFloat(scores[i], 'g', 6, 64)
			if softmax {
				score = strconv.FormatFloat(scores[i], 'f', 4, 64)
			}
			cells = append(cells, labels[i]+" "+score)
		}
		prefix := "  "
		if rows {
			prefix = fmt.Sprintf("  [%d] ", r/n)
		}
		fmt.Fprintf(w, "%s%s\n", prefix, strings.Join(cells, "  "))
	}
}
