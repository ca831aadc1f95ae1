package daemon

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
	"github.com/brokerd/brokerd/server/config"
)

// modelDaemon starts brokerd over a repository the test fills with fill.
func modelDaemon(t *testing.T, fill func(repo string), edit func(*config.Config)) (*daemon, brokerv1.BrokerServiceClient) {
	t.Helper()
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	fill(cfg.ModelRepo)
	if edit != nil {
		edit(&cfg)
	}
	d := startDaemon(t, cfg)
	return d, brokerv1.NewBrokerServiceClient(d.conn)
}

// testCtx bounds a test's calls, far above what they take (seconds; a
// minute for the heaviest under -race on a loaded machine).
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), startBound)
	t.Cleanup(cancel)
	return ctx
}

func mlpInput(rows [][]float32) *brokerv1.Tensor {
	var flat []float32
	for _, r := range rows {
		flat = append(flat, r...)
	}
	return &brokerv1.Tensor{Name: "input", Dtype: brokerv1.DataType_DATA_TYPE_FP32,
		Shape: []int64{int64(len(rows)), int64(len(rows[0]))}, Data: f32le(flat)}
}

func randRows(seed uint64, n, width int) [][]float32 {
	r := rand.New(rand.NewPCG(seed, 3))
	rows := make([][]float32, n)
	for i := range rows {
		rows[i] = make([]float32, width)
		for j := range rows[i] {
			rows[i][j] = float32(r.NormFloat64())
		}
	}
	return rows
}

// checkMLP compares an output [len(rows), out] with the float64 reference.
func checkMLP(t *testing.T, ref *mlpRef, rows [][]float32, shape []int64, data []byte) {
	t.Helper()
	if !slices.Equal(shape, []int64{int64(len(rows)), int64(ref.out)}) {
		t.Fatalf("output shape %v, want [%d %d]", shape, len(rows), ref.out)
	}
	got := fromF32le(data)
	for i, row := range rows {
		want := ref.forward(row)
		var num, den float64
		for j, w := range want {
			d := float64(got[i*ref.out+j]) - w
			num += d * d
			den += w * w
		}
		if rel := math.Sqrt(num / den); rel > 1e-4 || math.IsNaN(rel) {
			t.Errorf("row %d: relative error %.3g against the float64 reference (got %v, want %v)", i, rel, got[i*ref.out:(i+1)*ref.out], want)
		}
	}
}

func wantCode(t *testing.T, err error, code codes.Code, substrs ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("err = %v, want %v", err, code)
	}
	for _, s := range substrs {
		if !strings.Contains(status.Convert(err).Message(), s) {
			t.Errorf("message %q does not say %q", status.Convert(err).Message(), s)
		}
	}
}

func findModel(t *testing.T, c brokerv1.BrokerServiceClient, name string) *brokerv1.Model {
	t.Helper()
	resp, err := c.ListModels(testCtx(t), &brokerv1.ListModelsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range resp.GetModels() {
		if m.GetName() == name {
			return m
		}
	}
	t.Fatalf("ListModels has no %s: %v", name, resp.GetModels())
	return nil
}

func TestModelLifecycle(t *testing.T) {
	var refs [3]*mlpRef
	_, c := modelDaemon(t, func(repo string) {
		refs[1] = writeMLP(t, repo, "mlp", 1, 1, 6, 16, 3)
		refs[2] = writeMLP(t, repo, "mlp", 2, 2, 6, 16, 3)
	}, nil)
	ctx := testCtx(t)
	rows := randRows(5, 4, 6)
	infer := func(version int64) (*brokerv1.InferResponse, error) {
		return c.Infer(ctx, &brokerv1.InferRequest{Model: "mlp", ModelVersion: version, Inputs: []*brokerv1.Tensor{mlpInput(rows)}})
	}
	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"listed before loading", func(t *testing.T) {
			m := findModel(t, c, "mlp")
			if m.GetState() != brokerv1.ModelState_MODEL_STATE_AVAILABLE || m.GetKind() != "mlp" ||
				!slices.Equal(m.GetAvailableVersions(), []int64{1, 2}) || m.GetVersion() != 2 || len(m.GetDeviceIds()) != 0 {
				t.Errorf("model = %v", m)
			}
		}},
		{"infer before loading", func(t *testing.T) {
			_, err := infer(0)
			wantCode(t, err, codes.FailedPrecondition, "mlp", "not loaded")
		}},
		{"load version 1", func(t *testing.T) {
			resp, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "mlp", Version: 1})
			if err != nil {
				t.Fatal(err)
			}
			m := resp.GetModel()
			if m.GetVersion() != 1 || m.GetState() != brokerv1.ModelState_MODEL_STATE_READY || !slices.Equal(m.GetDeviceIds(), []string{"cpu:0"}) ||
				m.GetMemoryBytes() == 0 || len(m.GetInputs()) != 1 || m.GetInputs()[0].GetName() != "input" ||
				!slices.Equal(m.GetInputs()[0].GetShape(), []int64{-1, 6}) || m.GetInputs()[0].GetDtype() != brokerv1.DataType_DATA_TYPE_FP32 ||
				!slices.Equal(m.GetOutputs()[0].GetShape(), []int64{-1, 3}) {
				t.Errorf("loaded = %v", m)
			}
		}},
		{"listed loaded", func(t *testing.T) {
			m := findModel(t, c, "mlp")
			if m.GetState() != brokerv1.ModelState_MODEL_STATE_READY || m.GetVersion() != 1 || !slices.Equal(m.GetAvailableVersions(), []int64{1, 2}) {
				t.Errorf("model = %v", m)
			}
		}},
		{"infer version 1", func(t *testing.T) {
			resp, err := infer(0)
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetModelVersion() != 1 || resp.GetExecution().GetDeviceId() != "cpu:0" || resp.GetOutputs()[0].GetName() != "output" {
				t.Errorf("response = %v", resp)
			}
			checkMLP(t, refs[1], rows, resp.GetOutputs()[0].GetShape(), resp.GetOutputs()[0].GetData())
		}},
		{"pinned version not loaded", func(t *testing.T) {
			_, err := infer(2)
			wantCode(t, err, codes.FailedPrecondition, "version 2 is not loaded")
		}},
		{"stats under the name", func(t *testing.T) {
			st, err := c.GetStats(ctx, &brokerv1.GetStatsRequest{Model: "mlp"})
			if err != nil {
				t.Fatal(err)
			}
			if len(st.GetStats()) == 0 || st.GetStats()[0].GetModel() != "mlp@1" || st.GetStats()[0].GetCompleted() != 4 {
				t.Errorf("stats = %v", st.GetStats())
			}
		}},
		{"load the highest version", func(t *testing.T) {
			resp, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "mlp"})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetModel().GetVersion() != 2 {
				t.Errorf("loaded = %v", resp.GetModel())
			}
			out, err := infer(0)
			if err != nil {
				t.Fatal(err)
			}
			if out.GetModelVersion() != 2 {
				t.Errorf("served version %d", out.GetModelVersion())
			}
			checkMLP(t, refs[2], rows, out.GetOutputs()[0].GetShape(), out.GetOutputs()[0].GetData())
		}},
		{"unload", func(t *testing.T) {
			resp, err := c.UnloadModel(ctx, &brokerv1.UnloadModelRequest{Name: "mlp"})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetModel().GetState() != brokerv1.ModelState_MODEL_STATE_AVAILABLE || resp.GetModel().GetVersion() != 2 {
				t.Errorf("unloaded = %v", resp.GetModel())
			}
			if m := findModel(t, c, "mlp"); m.GetState() != brokerv1.ModelState_MODEL_STATE_AVAILABLE || len(m.GetDeviceIds()) != 0 {
				t.Errorf("after unload: %v", m)
			}
			_, err = infer(0)
			wantCode(t, err, codes.FailedPrecondition, "not loaded")
			st, err := c.GetStats(ctx, &brokerv1.GetStatsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range st.GetStats() {
				if strings.HasPrefix(s.GetModel(), "mlp@") {
					t.Errorf("the scheduler still serves %s", s.GetModel())
				}
			}
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			return
		}
	}
}

func TestModelManagementErrors(t *testing.T) {
	_, c := modelDaemon(t, func(repo string) { writeMLP(t, repo, "mlp", 1, 1, 6, 16, 3) }, nil)
	ctx := testCtx(t)
	tests := []struct {
		name string
		call func() error
		code codes.Code
		msg  []string
	}{
		{"load unknown", func() error {
			_, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "nope"})
			return err
		}, codes.NotFound, []string{"nope"}},
		{"load missing version", func() error {
			_, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "mlp", Version: 7})
			return err
		}, codes.NotFound, []string{"no version 7"}},
		{"load without name", func() error { _, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{}); return err }, codes.InvalidArgument, []string{"name"}},
		{"unload not loaded", func() error {
			_, err := c.UnloadModel(ctx, &brokerv1.UnloadModelRequest{Name: "mlp"})
			return err
		}, codes.FailedPrecondition, []string{"not loaded"}},
		{"unload unknown", func() error {
			_, err := c.UnloadModel(ctx, &brokerv1.UnloadModelRequest{Name: "nope"})
			return err
		}, codes.NotFound, []string{"nope"}},
		{"unload built-in", func() error {
			_, err := c.UnloadModel(ctx, &brokerv1.UnloadModelRequest{Name: "nbmf-hash-v1"})
			return err
		}, codes.FailedPrecondition, []string{"built in"}},
		{"infer unknown", func() error {
			_, err := c.Infer(ctx, &brokerv1.InferRequest{Model: "nope", Inputs: []*brokerv1.Tensor{mlpInput(randRows(1, 1, 6))}})
			return err
		}, codes.NotFound, []string{"nope"}},
		{"infer built-in", func() error {
			_, err := c.Infer(ctx, &brokerv1.InferRequest{Model: "nbmf-hash-v1", Inputs: []*brokerv1.Tensor{mlpInput(randRows(1, 1, 6))}})
			return err
		}, codes.InvalidArgument, []string{"Encode only"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantCode(t, tt.call(), tt.code, tt.msg...) })
	}
}

func TestLoadAdmission(t *testing.T) {
	// A budget of a few KiB of this machine's memory: the MLP's 64×512 and
	// 512×64 weights (256 KiB) cannot fit.
	_, c := modelDaemon(t, func(repo string) { writeMLP(t, repo, "big", 1, 1, 64, 512, 64) },
		func(cfg *config.Config) { cfg.MemoryStrategy = "0.0000001" })
	ctx := testCtx(t)
	dev, err := c.GetDevice(ctx, &brokerv1.GetDeviceRequest{Id: "cpu:0"})
	if err != nil {
		t.Fatal(err)
	}
	budget := dev.GetDevice().GetMemoryBudgetBytes()
	_, err = c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "big"})
	wantCode(t, err, codes.ResourceExhausted, "model big version 1 needs", "bytes of device memory",
		fmt.Sprintf("cpu:0 has %d bytes free of its %d-byte budget", budget, budget))
	if m := findModel(t, c, "big"); m.GetState() != brokerv1.ModelState_MODEL_STATE_FAILED || !strings.Contains(m.GetError(), "needs") {
		t.Errorf("after the refusal: %v", m)
	}
}

func TestLoadModelsAtStart(t *testing.T) {
	tests := []struct {
		name  string
		spec  string
		ready []string
	}{
		{"named", "a", []string{"a"}},
		{"all", "all", []string{"a", "b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, c := modelDaemon(t, func(repo string) {
				writeMLP(t, repo, "a", 1, 1, 4, 8, 2)
				writeMLP(t, repo, "b", 3, 2, 4, 8, 2)
			}, func(cfg *config.Config) { cfg.LoadModels = tt.spec })
			for _, name := range []string{"a", "b"} {
				m := findModel(t, c, name)
				want := brokerv1.ModelState_MODEL_STATE_AVAILABLE
				if slices.Contains(tt.ready, name) {
					want = brokerv1.ModelState_MODEL_STATE_READY
				}
				if m.GetState() != want {
					t.Errorf("%s: state %v, want %v", name, m.GetState(), want)
				}
			}
		})
	}
}

// TestHotReload reloads v1→v2 under continuous load: no request fails, and
// every answer is right for the version it reports.
func TestHotReload(t *testing.T) {
	var refs [3]*mlpRef
	_, c := modelDaemon(t, func(repo string) {
		refs[1] = writeMLP(t, repo, "mlp", 1, 1, 8, 32, 4)
		refs[2] = writeMLP(t, repo, "mlp", 2, 2, 8, 32, 4)
	}, nil)
	ctx := testCtx(t)
	if _, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "mlp", Version: 1}); err != nil {
		t.Fatal(err)
	}
	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		failures []error
		served   [3]atomic.Int64
	)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				rows := randRows(uint64(w*100000+i), 1+i%3, 8)
				resp, err := c.Infer(ctx, &brokerv1.InferRequest{Model: "mlp", Inputs: []*brokerv1.Tensor{mlpInput(rows)}})
				if err == nil && (resp.GetModelVersion() < 1 || resp.GetModelVersion() > 2) {
					err = fmt.Errorf("version %d", resp.GetModelVersion())
				}
				if err != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
					continue
				}
				v := resp.GetModelVersion()
				served[v].Add(1)
				got := fromF32le(resp.GetOutputs()[0].GetData())
				for r, row := range rows {
					for j, want := range refs[v].forward(row) {
						if math.Abs(float64(got[r*4+j])-want) > 1e-4*(1+math.Abs(want)) {
							mu.Lock()
							failures = append(failures, fmt.Errorf("version %d row %d col %d: %g, want %g", v, r, j, got[r*4+j], want))
							mu.Unlock()
						}
					}
				}
			}
		}()
	}
	waitFor := func(v int, n int64) {
		deadline := time.Now().Add(30 * time.Second)
		for served[v].Load() < n && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor(1, 200)
	resp, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "mlp", Version: 2})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetModel().GetVersion() != 2 {
		t.Errorf("loaded %v", resp.GetModel())
	}
	before := served[2].Load()
	waitFor(2, before+200)
	stop.Store(true)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d requests failed during the reload; first: %v", len(failures), failures[0])
	}
	if served[1].Load() < 200 || served[2].Load() < 200 {
		t.Errorf("served v1 %d, v2 %d times: the load did not span the reload", served[1].Load(), served[2].Load())
	}
	st, err := c.GetStats(ctx, &brokerv1.GetStatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.GetStats() {
		if s.GetModel() == "mlp@1" {
			t.Errorf("version 1 still has a queue after the reload: %v", s)
		}
	}
}

// TestReloadChangedFiles rewrites the weights of the version being served
// and loads it again under continuous load: the new files are served, no
// request fails, every answer is one instance's, memory comes back to one
// instance, and a load of unchanged files does nothing.
func TestReloadChangedFiles(t *testing.T) {
	var (
		repoDir string
		oldRef  *mlpRef
	)
	_, c := modelDaemon(t, func(repo string) {
		repoDir = repo
		oldRef = writeMLP(t, repo, "mlp", 1, 1, 8, 32, 4)
	}, nil)
	ctx := testCtx(t)
	first, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "mlp"})
	if err != nil {
		t.Fatal(err)
	}
	if first.GetAction() != brokerv1.LoadAction_LOAD_ACTION_LOADED {
		t.Errorf("first load: %v", first.GetAction())
	}
	again, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "mlp", Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	if again.GetAction() != brokerv1.LoadAction_LOAD_ACTION_UNCHANGED {
		t.Errorf("load of unchanged files: %v, want unchanged", again.GetAction())
	}
	memory := findModel(t, c, "mlp").GetMemoryBytes()

	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		failures []error
		byOld    atomic.Int64
		byNew    atomic.Int64
		matches  = func(ref *mlpRef, rows [][]float32, got []float32) bool {
			for r, row := range rows {
				for j, want := range ref.forward(row) {
					if math.Abs(float64(got[r*4+j])-want) > 1e-4*(1+math.Abs(want)) {
						return false
					}
				}
			}
			return true
		}
	)
	var newRef atomic.Pointer[mlpRef]
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				rows := randRows(uint64(w*100000+i), 1+i%3, 8)
				resp, err := c.Infer(ctx, &brokerv1.InferRequest{Model: "mlp", Inputs: []*brokerv1.Tensor{mlpInput(rows)}})
				if err == nil && resp.GetModelVersion() != 1 {
					err = fmt.Errorf("version %d", resp.GetModelVersion())
				}
				if err == nil {
					got := fromF32le(resp.GetOutputs()[0].GetData())
					switch n := newRef.Load(); {
					case matches(oldRef, rows, got):
						byOld.Add(1)
					case n != nil && matches(n, rows, got):
						byNew.Add(1)
					default:
						err = fmt.Errorf("an answer matches neither instance: %v", got)
					}
				}
				if err != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
				}
			}
		}()
	}
	waitFor := func(n *atomic.Int64, want int64) {
		deadline := time.Now().Add(30 * time.Second)
		for n.Load() < want && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor(&byOld, 200)
	// New weights in the same version directory (the files are rewritten,
	// so their modification times change).
	time.Sleep(10 * time.Millisecond)
	newRef.Store(writeMLP(t, repoDir, "mlp", 1, 3, 8, 32, 4))
	resp, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "mlp", Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetAction() != brokerv1.LoadAction_LOAD_ACTION_RELOADED {
		t.Errorf("load of changed files: %v, want reloaded", resp.GetAction())
	}
	oldAfter := byOld.Load()
	waitFor(&byNew, 200)
	stop.Store(true)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d requests failed during the reload; first: %v", len(failures), failures[0])
	}
	if byNew.Load() < 200 {
		t.Errorf("the new files answered %d times", byNew.Load())
	}
	if late := byOld.Load() - oldAfter; late > 16 {
		// Requests that entered the old instance before the switch may
		// finish after LoadModel returned; nothing new goes there.
		t.Errorf("%d answers from the old files after the reload returned", late)
	}
	if m := findModel(t, c, "mlp"); m.GetMemoryBytes() != memory || m.GetState() != brokerv1.ModelState_MODEL_STATE_READY {
		t.Errorf("after the reload: %v (memory before %d)", m, memory)
	}
	st, err := c.GetStats(ctx, &brokerv1.GetStatsRequest{Model: "mlp@1"})
	if err != nil {
		t.Fatalf("stats of the reloaded version by NAME@VERSION: %v", err)
	}
	if len(st.GetStats()) == 0 {
		t.Error("no stats for the reloaded version")
	}
	// Both instances are named mlp@1 (the new one's queue key is its own,
	// and stays inside brokerd): one model row is left, the new one's.
	all, err := c.GetStats(ctx, &brokerv1.GetStatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	queues := 0
	for _, s := range all.GetStats() {
		if s.GetModel() != "mlp@1" && strings.HasPrefix(s.GetModel(), "mlp") {
			t.Errorf("a row named %q, not the version's name", s.GetModel())
		}
		if s.GetModel() == "mlp@1" && s.GetDeviceId() == "" {
			queues++
		}
	}
	if queues != 1 {
		t.Errorf("%d queues of mlp@1 after the reload, want the new instance's alone", queues)
	}
	unchanged, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "mlp"})
	if err != nil {
		t.Fatal(err)
	}
	if unchanged.GetAction() != brokerv1.LoadAction_LOAD_ACTION_UNCHANGED {
		t.Errorf("second load of the new files: %v, want unchanged", unchanged.GetAction())
	}
}

func TestInferValidation(t *testing.T) {
	ref := (*mlpRef)(nil)
	_, c := modelDaemon(t, func(repo string) {
		ref = writeMLP(t, repo, "mlp", 1, 1, 6, 16, 3)
		writeBERT(t, repo, "cls", 1, 3, 2)
	}, func(cfg *config.Config) { cfg.LoadModels = "mlp,cls" })
	ctx := testCtx(t)
	good := mlpInput(randRows(1, 2, 6))
	fp32 := brokerv1.DataType_DATA_TYPE_FP32
	bytesT := brokerv1.DataType_DATA_TYPE_BYTES
	tests := []struct {
		name   string
		model  string
		inputs []*brokerv1.Tensor
		out    []string
		msg    []string
	}{
		{"unknown input", "mlp", []*brokerv1.Tensor{{Name: "x", Dtype: fp32, Shape: []int64{1, 6}, Data: make([]byte, 24)}},
			nil, []string{`input "x" is not an input of model mlp`, "input FP32 [-1, 6]"}},
		{"wrong dtype", "mlp", []*brokerv1.Tensor{{Name: "input", Dtype: brokerv1.DataType_DATA_TYPE_FP64, Shape: []int64{1, 6}, Data: make([]byte, 48)}},
			nil, []string{`input "input": datatype FP64, want FP32`}},
		{"wrong rank", "mlp", []*brokerv1.Tensor{{Name: "input", Dtype: fp32, Shape: []int64{6}, Data: make([]byte, 24)}},
			nil, []string{`input "input": shape [6] has 1 dimensions, want 2`}},
		{"wrong width", "mlp", []*brokerv1.Tensor{{Name: "input", Dtype: fp32, Shape: []int64{2, 5}, Data: make([]byte, 40)}},
			nil, []string{`input "input": shape [2, 5]: dimension 1 is 5, want 6`}},
		{"short data", "mlp", []*brokerv1.Tensor{{Name: "input", Dtype: fp32, Shape: []int64{2, 6}, Data: make([]byte, 44)}},
			nil, []string{`input "input": 44 bytes of data, want 48 (shape [2, 6] of FP32, 4 bytes each)`}},
		{"negative dimension", "mlp", []*brokerv1.Tensor{{Name: "input", Dtype: fp32, Shape: []int64{-1, 6}, Data: make([]byte, 24)}},
			nil, []string{`dimension 0 is -1`}},
		{"empty batch", "mlp", []*brokerv1.Tensor{{Name: "input", Dtype: fp32, Shape: []int64{0, 6}}},
			nil, []string{`input "input": shape [0, 6]: the batch (dimension 0) is empty`}},
		{"given twice", "mlp", []*brokerv1.Tensor{good, good}, nil, []string{`input "input" is given twice`}},
		{"unknown output", "mlp", []*brokerv1.Tensor{good}, []string{"logits"}, []string{`output "logits" is not an output of model mlp (outputs: output)`}},
		{"missing text", "cls", []*brokerv1.Tensor{{Name: "text_pair", Dtype: bytesT, Shape: []int64{1}, Data: bytesLE("a")}},
			nil, []string{`input "text" is missing (model cls takes text BYTES [-1], optional text_pair BYTES [-1])`}},
		{"bytes prefix overrun", "cls", []*brokerv1.Tensor{{Name: "text", Dtype: bytesT, Shape: []int64{1}, Data: bytesLE("yes")[:6]}},
			nil, []string{`input "text": BYTES element 0 of 1: length 3 runs past the end of the data (2 bytes left)`}},
		{"bytes shape beyond the data", "cls", []*brokerv1.Tensor{{Name: "text", Dtype: bytesT, Shape: []int64{2}, Data: bytesLE("yes")[:6]}},
			nil, []string{`input "text": shape [2] has 2 BYTES elements but the data is 6 bytes`}},
		{"bytes short prefix", "cls", []*brokerv1.Tensor{{Name: "text", Dtype: bytesT, Shape: []int64{2}, Data: append(bytesLE("yes"), 1, 0)}},
			nil, []string{`input "text": BYTES element 1 of 2: 2 bytes left, want a 4-byte little-endian length prefix`}},
		{"bytes trailing", "cls", []*brokerv1.Tensor{{Name: "text", Dtype: bytesT, Shape: []int64{1}, Data: append(bytesLE("yes"), 'x')}},
			nil, []string{`input "text": 1 bytes after the 1 BYTES elements of shape [1]`}},
		{"pair shape", "cls", []*brokerv1.Tensor{
			{Name: "text", Dtype: bytesT, Shape: []int64{2}, Data: bytesLE("a", "b")},
			{Name: "text_pair", Dtype: bytesT, Shape: []int64{1}, Data: bytesLE("c")}},
			nil, []string{`input "text_pair": shape [1], want the shape of "text" [2]`}},
		{"empty text", "cls", []*brokerv1.Tensor{{Name: "text", Dtype: bytesT, Shape: []int64{2}, Data: bytesLE("a", "")}},
			nil, []string{`input "text" element 1: empty text`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Infer(ctx, &brokerv1.InferRequest{Model: tt.model, Inputs: tt.inputs, Outputs: tt.out})
			wantCode(t, err, codes.InvalidArgument, tt.msg...)
		})
	}
	t.Run("negative version", func(t *testing.T) {
		_, err := c.Infer(ctx, &brokerv1.InferRequest{Model: "mlp", ModelVersion: -1, Inputs: []*brokerv1.Tensor{good}})
		wantCode(t, err, codes.InvalidArgument, "model_version -1 is invalid")
	})
	t.Run("truncate false", func(t *testing.T) {
		long := strings.Repeat("the quick brown fox ", 5)
		_, err := c.Infer(ctx, &brokerv1.InferRequest{Model: "cls", Truncate: new(bool),
			Inputs: []*brokerv1.Tensor{{Name: "text", Dtype: bytesT, Shape: []int64{2}, Data: bytesLE("yes", long)}}})
		wantCode(t, err, codes.InvalidArgument, `input "text" element 1`, "22 tokens", "truncate=false")
	})
	t.Run("valid request", func(t *testing.T) {
		rows := randRows(9, 3, 6)
		resp, err := c.Infer(ctx, &brokerv1.InferRequest{Model: "mlp", Inputs: []*brokerv1.Tensor{mlpInput(rows)}, Outputs: []string{"output"}})
		if err != nil {
			t.Fatal(err)
		}
		checkMLP(t, ref, rows, resp.GetOutputs()[0].GetShape(), resp.GetOutputs()[0].GetData())
	})
}

func TestTextModels(t *testing.T) {
	_, c := modelDaemon(t, func(repo string) {
		writeBERT(t, repo, "enc", 1, 4, 0)
		writeBERT(t, repo, "cls", 1, 5, 3)
	}, func(cfg *config.Config) { cfg.LoadModels = "all" })
	ctx := testCtx(t)
	texts := []string{"the quick brown fox", "a lazy dog is running", strings.Repeat("memory record ", 12)}
	bytesT := brokerv1.DataType_DATA_TYPE_BYTES

	t.Run("classifier pairs", func(t *testing.T) {
		resp, err := c.Infer(ctx, &brokerv1.InferRequest{Model: "cls", Inputs: []*brokerv1.Tensor{
			{Name: "text", Dtype: bytesT, Shape: []int64{3}, Data: bytesLE(texts...)},
			{Name: "text_pair", Dtype: bytesT, Shape: []int64{3}, Data: bytesLE("yes", "no", "good")},
		}})
		if err != nil {
			t.Fatal(err)
		}
		out := resp.GetOutputs()[0]
		if out.GetName() != "logits" || !slices.Equal(out.GetShape(), []int64{3, 3}) || len(out.GetData()) != 36 {
			t.Fatalf("logits = %v %v, %d bytes", out.GetName(), out.GetShape(), len(out.GetData()))
		}
		single, err := c.Infer(ctx, &brokerv1.InferRequest{Model: "cls", Inputs: []*brokerv1.Tensor{
			{Name: "text", Dtype: bytesT, Shape: []int64{1}, Data: bytesLE(texts[0])}}})
		if err != nil {
			t.Fatal(err)
		}
		// The second segment changes the logits: the pair reached the model.
		if slices.Equal(single.GetOutputs()[0].GetData(), out.GetData()[:12]) {
			t.Error("logits of a text alone equal those of the text with a pair")
		}
	})
	t.Run("encoder via Infer and Encode", func(t *testing.T) {
		resp, err := c.Infer(ctx, &brokerv1.InferRequest{Model: "enc", Inputs: []*brokerv1.Tensor{
			{Name: "text", Dtype: bytesT, Shape: []int64{3}, Data: bytesLE(texts...)}}})
		if err != nil {
			t.Fatal(err)
		}
		out := resp.GetOutputs()[0]
		if out.GetName() != "embedding" || !slices.Equal(out.GetShape(), []int64{3, tinyHidden}) {
			t.Fatalf("embedding = %v %v", out.GetName(), out.GetShape())
		}
		emb := fromF32le(out.GetData())
		enc, err := c.Encode(ctx, &brokerv1.EncodeRequest{Model: "enc", Items: textItems(texts...), Fidelity: brokerv1.Fidelity_FIDELITY_BOTH})
		if err != nil {
			t.Fatal(err)
		}
		if enc.GetModel() != "enc" || enc.GetModelVersion() != 1 || len(enc.GetResults()) != 3 {
			t.Fatalf("encode = %v", enc)
		}
		for i, r := range enc.GetResults() {
			v := r.GetVector()
			var norm float64
			for j, x := range v {
				norm += float64(x) * float64(x)
				if d := math.Abs(float64(x - emb[i*tinyHidden+j])); d > 1e-5 {
					t.Fatalf("item %d: Encode and Infer differ by %g at %d", i, d, j)
				}
			}
			if len(v) != tinyHidden || math.Abs(math.Sqrt(norm)-1) > 1e-4 {
				t.Errorf("item %d: %d values, norm %g", i, len(v), math.Sqrt(norm))
			}
			if len(r.GetCode()) == 0 || r.GetCodec() != "zstd" || !strings.HasPrefix(r.GetSignature(), "sha256:") {
				t.Errorf("item %d: lossless part %v", i, r)
			}
		}
		// An item alone encodes to the vector it has in a padded batch.
		alone, err := c.Encode(ctx, &brokerv1.EncodeRequest{Model: "enc", Items: textItems(texts[0])})
		if err != nil {
			t.Fatal(err)
		}
		for j, x := range alone.GetResults()[0].GetVector() {
			if d := math.Abs(float64(x - enc.GetResults()[0].GetVector()[j])); d > 1e-5 {
				t.Fatalf("alone and batched differ by %g at %d", d, j)
			}
		}
	})
	t.Run("encode errors", func(t *testing.T) {
		long := strings.Repeat("the quick brown fox ", 5)
		_, err := c.Encode(ctx, &brokerv1.EncodeRequest{Model: "enc", Items: textItems("yes", long), Truncate: new(bool)})
		wantCode(t, err, codes.InvalidArgument, "items[1]", "22 tokens, the limit is 16", "truncate=false")
		_, err = c.Encode(ctx, &brokerv1.EncodeRequest{Model: "cls", Items: textItems("yes")})
		wantCode(t, err, codes.InvalidArgument, "bert-classifier", "use Infer")
		truncated, err := c.Encode(ctx, &brokerv1.EncodeRequest{Model: "enc", Items: textItems(long)})
		if err != nil || len(truncated.GetResults()[0].GetVector()) != tinyHidden {
			t.Errorf("truncated encode: %v, %v", truncated, err)
		}
	})
}

func TestKServe(t *testing.T) {
	var ref *mlpRef
	d, c := modelDaemon(t, func(repo string) {
		ref = writeMLP(t, repo, "mlp", 3, 1, 6, 16, 3)
		writeBERT(t, repo, "cls", 1, 5, 2)
		writeMLP(t, repo, "idle", 1, 2, 4, 8, 2)
	}, func(cfg *config.Config) { cfg.LoadModels = "mlp,cls" })
	k := inference.NewGRPCInferenceServiceClient(d.conn)
	ctx := testCtx(t)
	rows := randRows(11, 3, 6)
	var flat []float32
	for _, r := range rows {
		flat = append(flat, r...)
	}

	t.Run("server", func(t *testing.T) {
		live, err := k.ServerLive(ctx, &inference.ServerLiveRequest{})
		if err != nil || !live.GetLive() {
			t.Errorf("live: %v %v", live, err)
		}
		ready, err := k.ServerReady(ctx, &inference.ServerReadyRequest{})
		if err != nil || !ready.GetReady() {
			t.Errorf("ready: %v %v", ready, err)
		}
		md, err := k.ServerMetadata(ctx, &inference.ServerMetadataRequest{})
		if err != nil || md.GetName() != "brokerd" || md.GetVersion() != "test" || !slices.Contains(md.GetExtensions(), "parameters") {
			t.Errorf("metadata: %v %v", md, err)
		}
	})
	t.Run("model ready", func(t *testing.T) {
		tests := []struct {
			name, version string
			ready         bool
			code          codes.Code
		}{
			{"mlp", "", true, codes.OK},
			{"mlp", "3", true, codes.OK},
			{"mlp", "1", false, codes.OK},
			{"idle", "", false, codes.OK},
			{"nope", "", false, codes.NotFound},
			{"mlp", "x", false, codes.InvalidArgument},
		}
		for _, tt := range tests {
			t.Run(tt.name+"@"+tt.version, func(t *testing.T) {
				resp, err := k.ModelReady(ctx, &inference.ModelReadyRequest{Name: tt.name, Version: tt.version})
				if status.Code(err) != tt.code || resp.GetReady() != tt.ready {
					t.Errorf("ready %v err %v, want %v %v", resp.GetReady(), err, tt.ready, tt.code)
				}
			})
		}
	})
	t.Run("model metadata", func(t *testing.T) {
		md, err := k.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "cls"})
		if err != nil {
			t.Fatal(err)
		}
		if md.GetName() != "cls" || !slices.Equal(md.GetVersions(), []string{"1"}) || len(md.GetInputs()) != 2 ||
			md.GetInputs()[0].GetName() != "text" || md.GetInputs()[0].GetDatatype() != "BYTES" || md.GetInputs()[1].GetName() != "text_pair" ||
			md.GetOutputs()[0].GetName() != "logits" || !slices.Equal(md.GetOutputs()[0].GetShape(), []int64{-1, 2}) {
			t.Errorf("metadata = %v", md)
		}
		_, err = k.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "idle"})
		wantCode(t, err, codes.FailedPrecondition, "not loaded")
	})
	input := &inference.ModelInferRequest_InferInputTensor{Name: "input", Datatype: "FP32", Shape: []int64{3, 6}}
	t.Run("infer raw", func(t *testing.T) {
		resp, err := k.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "mlp", Id: "req-1",
			Inputs: []*inference.ModelInferRequest_InferInputTensor{input}, RawInputContents: [][]byte{f32le(flat)}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetModelName() != "mlp" || resp.GetModelVersion() != "3" || resp.GetId() != "req-1" || len(resp.GetRawOutputContents()) != 1 ||
			resp.GetOutputs()[0].GetDatatype() != "FP32" || resp.GetParameters()["device_id"].GetStringParam() != "cpu:0" {
			t.Fatalf("response = %v", resp)
		}
		checkMLP(t, ref, rows, resp.GetOutputs()[0].GetShape(), resp.GetRawOutputContents()[0])
	})
	t.Run("infer typed", func(t *testing.T) {
		typed := &inference.ModelInferRequest_InferInputTensor{Name: "input", Datatype: "FP32", Shape: []int64{3, 6},
			Contents: &inference.InferTensorContents{Fp32Contents: flat}}
		resp, err := k.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "mlp", ModelVersion: "3",
			Inputs:  []*inference.ModelInferRequest_InferInputTensor{typed},
			Outputs: []*inference.ModelInferRequest_InferRequestedOutputTensor{{Name: "output"}}})
		if err != nil {
			t.Fatal(err)
		}
		checkMLP(t, ref, rows, resp.GetOutputs()[0].GetShape(), resp.GetRawOutputContents()[0])
	})
	t.Run("infer bytes", func(t *testing.T) {
		typed := &inference.ModelInferRequest_InferInputTensor{Name: "text", Datatype: "BYTES", Shape: []int64{2},
			Contents: &inference.InferTensorContents{BytesContents: [][]byte{[]byte("the fox"), []byte("a dog")}}}
		a, err := k.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "cls", Inputs: []*inference.ModelInferRequest_InferInputTensor{typed}})
		if err != nil {
			t.Fatal(err)
		}
		raw := &inference.ModelInferRequest_InferInputTensor{Name: "text", Datatype: "BYTES", Shape: []int64{2}}
		b, err := k.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "cls", Inputs: []*inference.ModelInferRequest_InferInputTensor{raw},
			RawInputContents: [][]byte{bytesLE("the fox", "a dog")}})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a.GetOutputs()[0].GetShape(), []int64{2, 2}) || !slices.Equal(a.GetRawOutputContents()[0], b.GetRawOutputContents()[0]) {
			t.Errorf("typed %v %v, raw %v", a.GetOutputs(), fromF32le(a.GetRawOutputContents()[0]), fromF32le(b.GetRawOutputContents()[0]))
		}
	})
	t.Run("infer errors", func(t *testing.T) {
		tests := []struct {
			name string
			req  *inference.ModelInferRequest
			code codes.Code
			msg  string
		}{
			{"raw count", &inference.ModelInferRequest{ModelName: "mlp", Inputs: []*inference.ModelInferRequest_InferInputTensor{input},
				RawInputContents: [][]byte{f32le(flat), f32le(flat)}}, codes.InvalidArgument, "raw_input_contents has 2 entries for 1 inputs"},
			{"typed count", &inference.ModelInferRequest{ModelName: "mlp", Inputs: []*inference.ModelInferRequest_InferInputTensor{
				{Name: "input", Datatype: "FP32", Shape: []int64{3, 6}, Contents: &inference.InferTensorContents{Fp32Contents: flat[:5]}}}},
				codes.InvalidArgument, `input "input": 5 FP32 elements in contents, want 18`},
			{"unknown datatype", &inference.ModelInferRequest{ModelName: "mlp", Inputs: []*inference.ModelInferRequest_InferInputTensor{
				{Name: "input", Datatype: "FLOAT", Shape: []int64{3, 6}}}, RawInputContents: [][]byte{f32le(flat)}},
				codes.InvalidArgument, `unknown datatype "FLOAT"`},
			{"wrong datatype", &inference.ModelInferRequest{ModelName: "mlp", Inputs: []*inference.ModelInferRequest_InferInputTensor{
				{Name: "input", Datatype: "FP64", Shape: []int64{3, 3}}}, RawInputContents: [][]byte{f32le(flat)}},
				codes.InvalidArgument, `datatype FP64, want FP32`},
			{"not loaded", &inference.ModelInferRequest{ModelName: "idle", Inputs: []*inference.ModelInferRequest_InferInputTensor{input},
				RawInputContents: [][]byte{f32le(flat)}}, codes.FailedPrecondition, "not loaded"},
			{"unknown model", &inference.ModelInferRequest{ModelName: "nope", Inputs: []*inference.ModelInferRequest_InferInputTensor{input},
				RawInputContents: [][]byte{f32le(flat)}}, codes.NotFound, "nope"},
			{"bad parameter", &inference.ModelInferRequest{ModelName: "cls", Inputs: []*inference.ModelInferRequest_InferInputTensor{
				{Name: "text", Datatype: "BYTES", Shape: []int64{1}}}, RawInputContents: [][]byte{bytesLE("x")},
				Parameters: map[string]*inference.InferParameter{"truncate": {ParameterChoice: &inference.InferParameter_StringParam{StringParam: "no"}}}},
				codes.InvalidArgument, "parameter truncate: want a bool_param"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				_, err := k.ModelInfer(ctx, tt.req)
				wantCode(t, err, tt.code, tt.msg)
			})
		}
	})
	t.Run("not ready while draining", func(t *testing.T) {
		if _, err := c.Drain(ctx, &brokerv1.DrainRequest{}); err != nil {
			t.Fatal(err)
		}
		ready, err := k.ServerReady(ctx, &inference.ServerReadyRequest{})
		if err != nil || ready.GetReady() {
			t.Errorf("ready while draining: %v %v", ready, err)
		}
		mr, err := k.ModelReady(ctx, &inference.ModelReadyRequest{Name: "mlp"})
		if err != nil || mr.GetReady() {
			t.Errorf("model ready while draining: %v %v", mr, err)
		}
		_, err = k.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "mlp", Inputs: []*inference.ModelInferRequest_InferInputTensor{input},
			RawInputContents: [][]byte{f32le(flat)}})
		wantCode(t, err, codes.Unavailable, "draining")
	})
}
