package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

func textItems(texts ...string) []*brokerv1.EncodeItem {
	items := make([]*brokerv1.EncodeItem, len(texts))
	for i, t := range texts {
		items[i] = &brokerv1.EncodeItem{Id: fmt.Sprintf("id-%d", i), Content: &brokerv1.EncodeItem_Text{Text: t}}
	}
	return items
}

func TestEncodeBatchedEqualsAlone(t *testing.T) {
	d := startDaemon(t, testConfig(t))
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Each client sends a few items of its own; the texts overlap between
	// clients so batches mix requests.
	const clients = 64
	text := func(client, i int) string {
		return fmt.Sprintf("record %d of client %d: the quick brown fox %s", i, client, strings.Repeat("jumps ", (client+i)%5))
	}
	type got struct {
		text string
		vec  []float32
	}
	results := make([][]got, clients)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 1 + cl%4
			var texts []string
			for i := range n {
				texts = append(texts, text(cl, i))
			}
			resp, err := c.Encode(ctx, &brokerv1.EncodeRequest{Items: textItems(texts...)})
			if err != nil {
				errs <- err
				return
			}
			if len(resp.GetResults()) != n {
				errs <- fmt.Errorf("client %d: %d results for %d items", cl, len(resp.GetResults()), n)
				return
			}
			for i, r := range resp.GetResults() {
				if r.GetId() != fmt.Sprintf("id-%d", i) {
					errs <- fmt.Errorf("client %d: result %d has id %q", cl, i, r.GetId())
				}
				results[cl] = append(results[cl], got{texts[i], r.GetVector()})
			}
			if e := resp.GetExecution(); e.GetDeviceId() != "cpu:0" || e.GetBatchSize() < 1 || e.GetTotalNs() <= 0 {
				errs <- fmt.Errorf("client %d: execution info %v", cl, e)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	batched := false
	for cl := range clients {
		for _, g := range results[cl] {
			alone, err := c.Encode(ctx, &brokerv1.EncodeRequest{Items: textItems(g.text)})
			if err != nil {
				t.Fatal(err)
			}
			want := alone.GetResults()[0].GetVector()
			if len(want) != 384 {
				t.Fatalf("vector has %d dimensions, want 384", len(want))
			}
			for i := range want {
				if math.Float32bits(want[i]) != math.Float32bits(g.vec[i]) {
					t.Fatalf("client %d %q: batched vector differs from the vector alone at %d: %v vs %v", cl, g.text, i, g.vec[i], want[i])
				}
			}
		}
	}
	stats, err := c.GetStats(ctx, &brokerv1.GetStatsRequest{Model: "nbmf-hash-v1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range stats.GetStats() {
		if st.GetDeviceId() == "" {
			if st.GetCompleted() < 64 {
				t.Errorf("stats completed = %d, want ≥ 64", st.GetCompleted())
			}
			batched = st.GetMeanBatchSize() > 1
		}
	}
	if !batched {
		t.Logf("mean batch size stayed 1: the load did not batch (not an error on a fast machine)")
	}
}

func TestEncodeLosslessRoundTrip(t *testing.T) {
	d := startDaemon(t, testConfig(t))
	c := brokerv1.NewBrokerServiceClient(d.conn)
	binary := []byte{0, 1, 2, 0xff, 0xfe, 'x', 0}
	items := []*brokerv1.EncodeItem{
		{Id: "a", Content: &brokerv1.EncodeItem_Text{Text: strings.Repeat("memory record ", 100)}},
		{Id: "b", Content: &brokerv1.EncodeItem_Data{Data: binary}},
	}
	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	for _, fid := range []brokerv1.Fidelity{brokerv1.Fidelity_FIDELITY_LOSSLESS, brokerv1.Fidelity_FIDELITY_BOTH} {
		t.Run(fid.String(), func(t *testing.T) {
			resp, err := c.Encode(context.Background(), &brokerv1.EncodeRequest{Items: items, Fidelity: fid})
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range resp.GetResults() {
				orig := itemBytes(items[i])
				back, err := dec.DecodeAll(r.GetCode(), nil)
				if err != nil || !bytes.Equal(back, orig) || r.GetCodec() != "zstd" {
					t.Errorf("item %d: code does not round-trip (%v, codec %q)", i, err, r.GetCodec())
				}
				sum := sha256.Sum256(orig)
				if r.GetSignature() != "sha256:"+hex.EncodeToString(sum[:]) {
					t.Errorf("item %d: signature %q", i, r.GetSignature())
				}
				if hasVec := len(r.GetVector()) == 384; hasVec != (fid == brokerv1.Fidelity_FIDELITY_BOTH) {
					t.Errorf("item %d: vector length %d with %v", i, len(r.GetVector()), fid)
				}
				if r.GetDeviceId() != "cpu:0" {
					t.Errorf("item %d: device_id %q, want the device that computed it, cpu:0", i, r.GetDeviceId())
				}
			}
			if i := strings.Repeat("memory record ", 100); len(resp.GetResults()[0].GetCode()) >= len(i) {
				t.Errorf("repetitive text did not compress: %d bytes", len(resp.GetResults()[0].GetCode()))
			}
		})
	}
}

func TestEncodeLimits(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxItemsPerRequest = 10
	cfg.MaxItemBytes = 1000
	cfg.MaxQueueItems = 8
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := context.Background()
	if _, err := c.CordonDevice(ctx, &brokerv1.CordonDeviceRequest{Id: "tpu:0"}); err != nil {
		t.Fatal(err)
	}
	many := make([]string, 11)
	for i := range many {
		many[i] = "x"
	}
	tests := []struct {
		name string
		req  *brokerv1.EncodeRequest
		code codes.Code
		msg  string
	}{
		{"no items", &brokerv1.EncodeRequest{}, codes.InvalidArgument, "at least one item"},
		{"empty text", &brokerv1.EncodeRequest{Items: textItems("ok", "")}, codes.InvalidArgument, "items[1]: empty"},
		{"no content", &brokerv1.EncodeRequest{Items: []*brokerv1.EncodeItem{{Id: "a"}}}, codes.InvalidArgument, "items[0]"},
		{"too many items", &brokerv1.EncodeRequest{Items: textItems(many...)}, codes.InvalidArgument, "max-items-per-request 10"},
		{"item too large", &brokerv1.EncodeRequest{Items: textItems("a", "b", strings.Repeat("z", 1001))}, codes.InvalidArgument, "items[2]: 1001 bytes"},
		{"unknown model", &brokerv1.EncodeRequest{Model: "gpt-9", Items: textItems("a")}, codes.NotFound, "gpt-9"},
		{"bad fidelity", &brokerv1.EncodeRequest{Fidelity: 42, Items: textItems("a")}, codes.InvalidArgument, "fidelity"},
		{"bad priority", &brokerv1.EncodeRequest{Priority: 9, Items: textItems("a")}, codes.InvalidArgument, "priority"},
		{"unknown device", &brokerv1.EncodeRequest{DeviceId: "gpu:3", Items: textItems("a")}, codes.NotFound, "gpu:3"},
		{"cordoned device", &brokerv1.EncodeRequest{DeviceId: "tpu:0", Items: textItems("a")}, codes.FailedPrecondition, "cordoned"},
		{"device without replica", &brokerv1.EncodeRequest{DeviceId: "tpu:1", Items: textItems("a")}, codes.NotFound, "tpu:1"},
		{"larger than the whole queue", &brokerv1.EncodeRequest{Items: textItems("a", "b", "c", "d", "e", "f", "g", "h", "i")}, codes.InvalidArgument, "split the request"},
		{"ok", &brokerv1.EncodeRequest{Items: textItems("a", "b")}, codes.OK, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Encode(ctx, tt.req)
			st := status.Convert(err)
			if st.Code() != tt.code || !strings.Contains(st.Message(), tt.msg) {
				t.Fatalf("got %v %q, want %v containing %q", st.Code(), st.Message(), tt.code, tt.msg)
			}
			if tt.code == codes.ResourceExhausted {
				var retry *errdetails.RetryInfo
				for _, det := range st.Details() {
					if r, ok := det.(*errdetails.RetryInfo); ok {
						retry = r
					}
				}
				if retry == nil || retry.GetRetryDelay().AsDuration() <= 0 {
					t.Errorf("RESOURCE_EXHAUSTED without a RetryInfo delay: %v", st.Details())
				}
			}
		})
	}
	// A bad request harmed nobody: the daemon still serves.
	if _, err := c.Encode(ctx, &brokerv1.EncodeRequest{Items: textItems("still here")}); err != nil {
		t.Fatal(err)
	}
}

func TestDrainCompletesAcceptedWork(t *testing.T) {
	d := startDaemon(t, testConfig(t))
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The connection is up before the load starts, so the calls below
	// reach the server at once.
	if _, err := c.Encode(ctx, &brokerv1.EncodeRequest{Items: textItems("warm up")}); err != nil {
		t.Fatal(err)
	}
	// Accepted calls in flight while the drain starts.
	var wg sync.WaitGroup
	var okCalls, unavailable, other int
	var mu sync.Mutex
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			texts := make([]string, 50)
			for j := range texts {
				texts[j] = fmt.Sprintf("drain test %d %d", i, j)
			}
			_, err := c.Encode(ctx, &brokerv1.EncodeRequest{Items: textItems(texts...)})
			mu.Lock()
			defer mu.Unlock()
			switch status.Code(err) {
			case codes.OK:
				okCalls++
			case codes.Unavailable:
				unavailable++
			default:
				other++
				t.Errorf("call during drain: %v", err)
			}
		}()
	}
	// Drain once some of the load is queued or done.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		st, err := c.GetStats(ctx, &brokerv1.GetStatsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		busy := false
		for _, row := range st.GetStats() {
			busy = busy || (row.GetDeviceId() == "" && (row.GetQueued() > 0 || row.GetRunning() > 0 || row.GetCompleted() > 1))
		}
		if busy {
			break
		}
		time.Sleep(time.Millisecond)
	}
	dr, err := c.Drain(ctx, &brokerv1.DrainRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	t.Logf("drain: %d completed while draining; %d calls ok, %d refused", dr.GetCompleted(), okCalls, unavailable)
	if okCalls == 0 {
		t.Error("no call accepted before the drain completed")
	}
	_, err = c.Encode(ctx, &brokerv1.EncodeRequest{Items: textItems("after drain")})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("Encode after drain: %v, want UNAVAILABLE", err)
	}
	hc, err := healthpb.NewHealthClient(d.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health after drain: %v, %v", hc, err)
	}
}

func TestListModels(t *testing.T) {
	d := startDaemon(t, testConfig(t))
	resp, err := brokerv1.NewBrokerServiceClient(d.conn).ListModels(context.Background(), &brokerv1.ListModelsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := &brokerv1.Model{Name: "nbmf-hash-v1", Version: 1, Kind: "hash-encoder", State: brokerv1.ModelState_MODEL_STATE_READY,
		DeviceIds: []string{"cpu:0"}, BaseBatch: 8, AvailableVersions: []int64{1}}
	if len(resp.GetModels()) != 1 {
		t.Fatalf("models: %v", resp.GetModels())
	}
	got := proto.Clone(resp.GetModels()[0]).(*brokerv1.Model)
	got.MemoryBytes = 0
	if !proto.Equal(got, want) {
		t.Errorf("model = %v, want %v", got, want)
	}
}

// itemBytes are an item's bytes: its text's, or its data.
func itemBytes(it *brokerv1.EncodeItem) []byte {
	if t, ok := it.GetContent().(*brokerv1.EncodeItem_Text); ok {
		return []byte(t.Text)
	}
	return it.GetData()
}
