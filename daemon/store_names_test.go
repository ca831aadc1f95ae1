package daemon

import (
	"testing"

	"google.golang.org/grpc/status"

	"github.com/brokerd/brokerd/bench/modelkit"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/server/config"
)

// tinyStoreConfig is a daemon's settings with an Ollama store holding a
// tiny Q8_0 model, tiny:0.5b.
func tinyStoreConfig(t *testing.T) config.Config {
	cfg := httpTestConfig(t)
	cfg.OllamaModels = t.TempDir()
	if err := modelkit.WriteOllamaModel(cfg.OllamaModels, "tiny", "0.5b", writeTinyGGUF(t, "q8_0"), modelkit.OllamaModel{
		Params: `{"temperature": 0, "num_ctx": 128}`, Family: "llama", FileType: "Q8_0"}); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestStoreModelByAnyName: a store model served as tiny:0.5b answers to
// Ollama's other forms of its name (library/tiny:0.5b) in LoadModel,
// Generate and UnloadModel alike.
func TestStoreModelByAnyName(t *testing.T) {
	cfg := tinyStoreConfig(t)
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)
	for _, name := range []string{"library/tiny:0.5b", "tiny:0.5b"} {
		t.Run(name, func(t *testing.T) {
			lr, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "library/tiny:0.5b"})
			if err != nil || lr.GetModel().GetName() != "tiny:0.5b" {
				t.Fatalf("LoadModel(library/tiny:0.5b): %v %v", lr, err)
			}
			st, err := c.Generate(ctx, &brokerv1.GenerateRequest{Model: name, Prompts: []string{"hi"}, Sampling: &brokerv1.SamplingParams{MaxTokens: 2}})
			if err == nil {
				_, err = st.Recv()
			}
			if err != nil {
				t.Errorf("Generate by %q: %v", name, err)
			}
			if _, err := c.UnloadModel(ctx, &brokerv1.UnloadModelRequest{Name: name}); err != nil {
				t.Errorf("UnloadModel(%q) of the model loaded as library/tiny:0.5b: %v (%s)", name, err, status.Code(err))
				// Leave it unloaded for the next case.
				if _, err := c.UnloadModel(ctx, &brokerv1.UnloadModelRequest{Name: "tiny:0.5b"}); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestLoadAtStartByAlias: --load-models naming a store model in another of
// Ollama's forms serves it under its listed name: a LoadModel of it is
// UNCHANGED, and one instance serves, not two copies of the weights.
func TestLoadAtStartByAlias(t *testing.T) {
	cfg := tinyStoreConfig(t)
	cfg.LoadModels = "library/tiny:0.5b"
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)
	ms, err := c.ListModels(ctx, &brokerv1.ListModelsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	ready := 0
	for _, m := range ms.GetModels() {
		names = append(names, m.GetName()+"="+m.GetState().String())
		if m.GetState() == brokerv1.ModelState_MODEL_STATE_READY && m.GetName() != "nbmf-hash-v1" {
			ready++
		}
	}
	lr, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "tiny:0.5b"})
	if err != nil {
		t.Fatal(err)
	}
	if lr.GetAction() != brokerv1.LoadAction_LOAD_ACTION_UNCHANGED {
		t.Errorf("LoadModel(tiny:0.5b) after --load-models=library/tiny:0.5b: %v, want UNCHANGED (listed at start: %v)", lr.GetAction(), names)
	}
	ms, err = c.ListModels(ctx, &brokerv1.ListModelsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ready = 0
	names = nil
	for _, m := range ms.GetModels() {
		names = append(names, m.GetName()+"="+m.GetState().String())
		if m.GetState() == brokerv1.ModelState_MODEL_STATE_READY && m.GetName() != "nbmf-hash-v1" {
			ready++
		}
	}
	if ready != 1 {
		t.Errorf("%d instances of the one store model serve: %v", ready, names)
	}
}
