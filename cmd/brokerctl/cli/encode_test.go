package cli

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// encodeBlocks splits encode's human output into one block per request: the
// item table rows (by ID) and the execution line.
type encodeBlock struct {
	rows      []map[string]string
	execution string
}

func parseEncodeOutput(t *testing.T, out string, header []string) []encodeBlock {
	t.Helper()
	var blocks []encodeBlock
	for _, chunk := range strings.Split(strings.TrimSuffix(out, "\n"), "\n\n") {
		table, exec, ok := strings.Cut(chunk, "\nexecution: ")
		if !ok {
			t.Fatalf("block without execution line:\n%s", chunk)
		}
		blocks = append(blocks, encodeBlock{rows: checkTable(t, table, header), execution: exec})
	}
	return blocks
}

func TestEncodeSources(t *testing.T) {
	dir := t.TempDir()
	crlf := filepath.Join(dir, "crlf.txt")
	if err := os.WriteFile(crlf, []byte("alpha\r\nbeta\r\ngamma"), 0o600); err != nil {
		t.Fatal(err)
	}
	header := []string{"ID", "DIM", "VECTOR", "SIGNATURE"}
	tests := []struct {
		name      string
		args      []string
		stdin     io.Reader
		wantTexts []string
		wantSizes []int // items per Encode request at the fake
	}{
		{name: "arguments", args: []string{"encode", "hello world", "second text"}, wantTexts: []string{"hello world", "second text"}, wantSizes: []int{2}},
		{name: "arguments ignore stdin", args: []string{"encode", "x"}, stdin: strings.NewReader("not read\n"), wantTexts: []string{"x"}, wantSizes: []int{1}},
		{name: "stdin without args", args: []string{"encode"}, stdin: strings.NewReader("one\ntwo\nthree\n"), wantTexts: []string{"one", "two", "three"}, wantSizes: []int{3}},
		{name: "stdin dash batched", args: []string{"encode", "-", "--batch", "2"}, stdin: strings.NewReader("a1\na2\na3\na4\na5\n"),
			wantTexts: []string{"a1", "a2", "a3", "a4", "a5"}, wantSizes: []int{2, 2, 1}},
		{name: "batch divides evenly", args: []string{"encode", "--batch=2"}, stdin: strings.NewReader("a1\na2\na3\na4"),
			wantTexts: []string{"a1", "a2", "a3", "a4"}, wantSizes: []int{2, 2}},
		{name: "file with CRLF and no final newline", args: []string{"encode", "--file", crlf}, wantTexts: []string{"alpha", "beta", "gamma"}, wantSizes: []int{3}},
		{name: "arguments batched too", args: []string{"encode", "--batch", "1", "p", "q"}, wantTexts: []string{"p", "q"}, wantSizes: []int{1, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := startServer(t)
			r := ts.runStdin(t, tt.stdin, tt.args...)
			if r.code != ExitOK || r.stderr != "" {
				t.Fatalf("got %v", r)
			}
			if got := ts.broker.encodeCalls(); !slices.Equal(got, tt.wantSizes) {
				t.Errorf("requests carried %v items, want %v", got, tt.wantSizes)
			}
			blocks := parseEncodeOutput(t, r.stdout, header)
			if len(blocks) != len(tt.wantSizes) {
				t.Fatalf("got %d blocks, want %d:\n%s", len(blocks), len(tt.wantSizes), r.stdout)
			}
			idx := 0
			for bi, b := range blocks {
				if len(b.rows) != tt.wantSizes[bi] {
					t.Errorf("block %d has %d rows, want %d", bi, len(b.rows), tt.wantSizes[bi])
				}
				wantExec := "model nbmf-hash-v1 v1, device cpu:0 (cpu), batch " + strconv.Itoa(tt.wantSizes[bi]) +
					" (sizes " + strconv.Itoa(tt.wantSizes[bi]) + "), queue 1.200ms, compute 2.500ms, total 4.000ms, cost $0.00000"
				if !strings.HasPrefix(b.execution, wantExec) {
					t.Errorf("execution line %q, want prefix %q", b.execution, wantExec)
				}
				for _, row := range b.rows {
					text := tt.wantTexts[idx]
					want := map[string]string{
						"ID": strconv.Itoa(idx), "DIM": "8d", "VECTOR": vectorPreview(fakeVector(text)), "SIGNATURE": signature([]byte(text)),
					}
					for col, w := range want {
						if row[col] != w {
							t.Errorf("item %d %s = %q, want %q", idx, col, row[col], w)
						}
					}
					idx++
				}
			}
			if idx != len(tt.wantTexts) {
				t.Errorf("printed %d items, want %d", idx, len(tt.wantTexts))
			}
		})
	}
}

func TestVectorPreview(t *testing.T) {
	tests := []struct {
		in   []float32
		want string
	}{
		{nil, "-"},
		{[]float32{0.5}, "[0.5000]"},
		{[]float32{0.0123, -0.0456, 1, 0}, "[0.0123 -0.0456 1.0000 0.0000]"},
		{[]float32{0.0123, -0.0456, 1, 0, 7}, "[0.0123 -0.0456 1.0000 0.0000 ...]"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := vectorPreview(tt.in); got != tt.want {
				t.Errorf("vectorPreview(%v) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestEncodeFidelity(t *testing.T) {
	tests := []struct {
		fidelity string
		header   []string
		want     map[string]string // columns of the row for "hello"
	}{
		{fidelity: "lossless", header: []string{"ID", "CODE", "CODEC", "SIGNATURE"},
			want: map[string]string{"CODE": "5 B", "CODEC": "identity", "SIGNATURE": signature([]byte("hello"))}},
		{fidelity: "BOTH", header: []string{"ID", "DIM", "VECTOR", "CODE", "CODEC", "SIGNATURE"},
			want: map[string]string{"DIM": "8d", "CODE": "5 B", "CODEC": "identity"}},
		{fidelity: "semantic", header: []string{"ID", "DIM", "VECTOR", "SIGNATURE"},
			want: map[string]string{"DIM": "8d", "VECTOR": vectorPreview(fakeVector("hello"))}},
	}
	for _, tt := range tests {
		t.Run(tt.fidelity, func(t *testing.T) {
			ts := startServer(t)
			r := ts.run(t, nil, "encode", "--fidelity", tt.fidelity, "hello")
			if r.code != ExitOK {
				t.Fatalf("got %v", r)
			}
			blocks := parseEncodeOutput(t, r.stdout, tt.header)
			row := blocks[0].rows[0]
			for col, w := range tt.want {
				if row[col] != w {
					t.Errorf("%s = %q, want %q\n%s", col, row[col], w, r.stdout)
				}
			}
			if strings.Contains(r.stdout, "VECTOR") != slices.Contains(tt.header, "VECTOR") {
				t.Errorf("VECTOR column presence wrong:\n%s", r.stdout)
			}
		})
	}
}

// TestEncodeRequest checks every flag lands in the request.
func TestEncodeRequest(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want *brokerv1.EncodeRequest
	}{
		{
			name: "defaults",
			args: []string{"encode", "t"},
			want: &brokerv1.EncodeRequest{Fidelity: brokerv1.Fidelity_FIDELITY_SEMANTIC},
		},
		{
			name: "every flag",
			args: []string{"encode", "--model", "bert-small", "--fidelity", "both", "--no-normalize", "--priority", "high", "--device", "gpu:0", "--type", "gpu", "t"},
			want: &brokerv1.EncodeRequest{
				Model: "bert-small", Fidelity: brokerv1.Fidelity_FIDELITY_BOTH, Normalize: proto.Bool(false),
				Priority: brokerv1.Priority_PRIORITY_HIGH, DeviceId: "gpu:0", DeviceType: brokerv1.DeviceType_DEVICE_TYPE_GPU,
			},
		},
		{
			name: "low priority on tpu",
			args: []string{"encode", "t", "--priority=low", "--type=TPU"},
			want: &brokerv1.EncodeRequest{Fidelity: brokerv1.Fidelity_FIDELITY_SEMANTIC, Priority: brokerv1.Priority_PRIORITY_LOW, DeviceType: brokerv1.DeviceType_DEVICE_TYPE_TPU},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := startServer(t)
			r := ts.run(t, nil, tt.args...)
			if r.code != ExitOK {
				t.Fatalf("got %v", r)
			}
			tt.want.Items = []*brokerv1.EncodeItem{{Id: "0", Content: &brokerv1.EncodeItem_Text{Text: "t"}}}
			ts.broker.mu.Lock()
			got := ts.broker.lastEncode
			ts.broker.mu.Unlock()
			if !proto.Equal(got, tt.want) {
				t.Errorf("request = %v\nwant      %v", got, tt.want)
			}
		})
	}
}

// TestEncodeJSON checks that --json prints each response as protojson that
// parses back to exactly what the server sent, one document per request.
func TestEncodeJSON(t *testing.T) {
	item := func(id, text string) *brokerv1.EncodeItem {
		return &brokerv1.EncodeItem{Id: id, Content: &brokerv1.EncodeItem_Text{Text: text}}
	}
	tests := []struct {
		name string
		args []string
		reqs [][]*brokerv1.EncodeItem
	}{
		{name: "one request", args: []string{"encode", "--json", "--fidelity", "both", "a", "bb"},
			reqs: [][]*brokerv1.EncodeItem{{item("0", "a"), item("1", "bb")}}},
		{name: "two requests", args: []string{"encode", "--json", "--fidelity", "both", "--batch", "2", "a", "bb", "ccc"},
			reqs: [][]*brokerv1.EncodeItem{{item("0", "a"), item("1", "bb")}, {item("2", "ccc")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := startServer(t)
			r := ts.run(t, nil, tt.args...)
			if r.code != ExitOK {
				t.Fatalf("got %v", r)
			}
			dec := json.NewDecoder(strings.NewReader(r.stdout))
			for i, items := range tt.reqs {
				var raw json.RawMessage
				if err := dec.Decode(&raw); err != nil {
					t.Fatalf("document %d: %v\n%s", i, err, r.stdout)
				}
				var got brokerv1.EncodeResponse
				if err := protojson.Unmarshal(raw, &got); err != nil {
					t.Fatalf("document %d does not parse as EncodeResponse: %v", i, err)
				}
				want, err := fakeEncode(&brokerv1.EncodeRequest{Fidelity: brokerv1.Fidelity_FIDELITY_BOTH, Items: items})
				if err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(&got, want) {
					t.Errorf("document %d = %v\nwant %v", i, &got, want)
				}
			}
			if err := dec.Decode(new(json.RawMessage)); !errors.Is(err, io.EOF) {
				t.Errorf("more documents than requests (err %v)", err)
			}
			if !strings.HasPrefix(r.stdout, "{\n  \"model\": \"nbmf-hash-v1\",\n  \"model_version\": \"1\",") {
				t.Errorf("not the documented protojson conventions:\n%.120s", r.stdout)
			}
		})
	}
}

func TestEncodeErrors(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		stdin      io.Reader
		wantCode   int
		wantStderr string // prefix
		wantCalls  int
	}{
		{name: "bad fidelity", args: []string{"encode", "--fidelity", "fast", "x"}, wantCode: ExitUsage,
			wantStderr: "brokerctl: encode: --fidelity \"fast\": want semantic, lossless or both\n"},
		{name: "bad priority", args: []string{"encode", "--priority", "urgent", "x"}, wantCode: ExitUsage,
			wantStderr: "brokerctl: encode: --priority \"urgent\": want low, normal or high\n"},
		{name: "bad type", args: []string{"encode", "--type", "amdgpu", "x"}, wantCode: ExitUsage,
			wantStderr: "brokerctl: encode: --type \"amdgpu\": want cpu, gpu or tpu\n"},
		{name: "zero batch", args: []string{"encode", "--batch", "0", "x"}, wantCode: ExitUsage,
			wantStderr: "brokerctl: encode: --batch 0: must be at least 1\n"},
		{name: "args and file", args: []string{"encode", "--file", "f.txt", "x"}, wantCode: ExitUsage,
			wantStderr: "brokerctl: encode: give texts as arguments or with --file, not both\n"},
		{name: "dash among texts", args: []string{"encode", "x", "-"}, wantCode: ExitUsage,
			wantStderr: "brokerctl: encode: \"-\" (read stdin) cannot be mixed with text arguments\n"},
		{name: "no input at all", args: []string{"encode"}, wantCode: ExitUsage,
			wantStderr: "brokerctl: encode: no texts: give TEXT arguments, - to read lines from stdin, or --file PATH\n"},
		{name: "missing file", args: []string{"encode", "--file", "/nonexistent/texts.txt"}, wantCode: ExitError,
			wantStderr: "brokerctl: encode: open --file: open /nonexistent/texts.txt: no such file or directory\n"},
		{name: "empty stdin", args: []string{"encode", "-"}, stdin: strings.NewReader(""), wantCode: ExitError,
			wantStderr: "brokerctl: encode: no texts to encode: the input was empty\n"},
		{name: "empty item", args: []string{"encode", "a", "", "c"}, wantCode: ExitError, wantCalls: 1,
			wantStderr: "brokerctl: encode: item 1: empty text (INVALID_ARGUMENT)\n"},
		{name: "empty line in a later request", args: []string{"encode", "--batch", "2"}, stdin: strings.NewReader("a\nb\nc\n\ne\n"),
			wantCode: ExitError, wantCalls: 2,
			wantStderr: "brokerctl: encode: request 2 (items 2-3): item 1: empty text (INVALID_ARGUMENT)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := startServer(t)
			r := ts.runStdin(t, tt.stdin, tt.args...)
			if r.code != tt.wantCode || !strings.HasPrefix(r.stderr, tt.wantStderr) {
				t.Errorf("got %v\nwant exit %d, stderr starting %q", r, tt.wantCode, tt.wantStderr)
			}
			if tt.wantCode == ExitUsage && !strings.Contains(r.stderr, "usage: brokerctl encode") {
				t.Errorf("usage error without usage:\n%s", r.stderr)
			}
			if got := len(ts.broker.encodeCalls()); got != tt.wantCalls {
				t.Errorf("%d Encode calls reached the server, want %d", got, tt.wantCalls)
			}
		})
	}
}

func TestCheckResults(t *testing.T) {
	items := []*brokerv1.EncodeItem{{Id: "0"}, {Id: "1"}}
	tests := []struct {
		name    string
		results []*brokerv1.EncodeResult
		wantErr string
	}{
		{name: "ok", results: []*brokerv1.EncodeResult{{Id: "0"}, {Id: "1"}}},
		{name: "too few", results: []*brokerv1.EncodeResult{{Id: "0"}}, wantErr: "the server returned 1 results for 2 items"},
		{name: "swapped", results: []*brokerv1.EncodeResult{{Id: "1"}, {Id: "0"}}, wantErr: `result 0 has id "1", want "0"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkResults(items, tt.results)
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("checkResults = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestEncodeInvalidUTF8 sends a line that is not UTF-8 as bytes: a proto
// string cannot carry it (the client's marshaller refused the whole call).
func TestEncodeInvalidUTF8(t *testing.T) {
	ts := startServer(t)
	r := ts.runStdin(t, strings.NewReader("plain text\n\xff\xfe latin-1 \xe9t\xe9\n"), "encode")
	if r.code != ExitOK {
		t.Fatalf("got %v", r)
	}
	ts.broker.mu.Lock()
	items := ts.broker.lastEncode.GetItems()
	ts.broker.mu.Unlock()
	if len(items) != 2 || items[0].GetText() != "plain text" || string(items[1].GetData()) != "\xff\xfe latin-1 \xe9t\xe9" {
		t.Errorf("items sent: %v", items)
	}
}

func TestEncodeNoTruncate(t *testing.T) {
	ts := startServer(t)
	if r := ts.run(t, nil, "encode", "--no-truncate", "a text"); r.code != ExitOK {
		t.Fatalf("got %v", r)
	}
	ts.broker.mu.Lock()
	req := ts.broker.lastEncode
	ts.broker.mu.Unlock()
	if req.Truncate == nil || req.GetTruncate() {
		t.Errorf("--no-truncate sent truncate=%v", req.Truncate)
	}
}

func TestEncodeTableListsTruncated(t *testing.T) {
	var b strings.Builder
	resp := &brokerv1.EncodeResponse{Results: []*brokerv1.EncodeResult{
		{Id: "0", Vector: []float32{1}}, {Id: "1", Vector: []float32{1}, Truncated: true}}}
	if err := writeEncodeResults(&b, resp); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "truncated to the model's length") || !strings.Contains(b.String(), ": 1\n") {
		t.Errorf("table:\n%s", b.String())
	}
}

func TestExecutionLineHostWork(t *testing.T) {
	line := executionLine("nbmf-hash-v1", 1, &brokerv1.ExecutionInfo{DeviceId: "cpu:0", DeviceType: brokerv1.DeviceType_DEVICE_TYPE_CPU})
	if strings.Contains(line, "batch 0") || !strings.Contains(line, "host work, no batch") {
		t.Errorf("LOSSLESS-only execution line: %q", line)
	}
}
