package daemon

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
)

// TestEncodePinnedToAnAbsentDeviceType: a device type the host lacks (or
// one no replica runs on) is not a transient failure: UNAVAILABLE told
// clients to retry forever; it is FAILED_PRECONDITION. Every replica
// cordoned stays UNAVAILABLE (an uncordon helps).
func TestEncodePinnedToAnAbsentDeviceType(t *testing.T) {
	d := startDaemon(t, testConfig(t)) // cpu:0 and four TPUs without a PJRT plugin: no GPU, no TPU replica
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)
	for _, typ := range []brokerv1.DeviceType{brokerv1.DeviceType_DEVICE_TYPE_GPU, brokerv1.DeviceType_DEVICE_TYPE_TPU} {
		_, err := c.Encode(ctx, &brokerv1.EncodeRequest{Model: "nbmf-hash-v1", DeviceType: typ, Items: textItems("a record")})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("Encode pinned to %v: %v, want FAILED_PRECONDITION", typ, err)
		}
	}
	if _, err := c.Encode(ctx, &brokerv1.EncodeRequest{Model: "nbmf-hash-v1", DeviceType: brokerv1.DeviceType_DEVICE_TYPE_CPU, Items: textItems("a record")}); err != nil {
		t.Errorf("Encode pinned to the CPU: %v", err)
	}
}

// TestModelFileErrorsAreClientFacing: a shard the index names but that is
// not there, and a link loop, answered INTERNAL (reserved for bugs);
// rope_theta 1.7e308 loaded and gave NaN logits; every model-file error
// read "invalid safetensors file"; and the reasons ListModels and Triton's
// RepositoryIndex give data-plane clients named the repository's absolute
// path. Each is now INVALID_ARGUMENT, says which file is wrong, and names
// paths relative to the repository.
func TestModelFileErrorsAreClientFacing(t *testing.T) {
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	repo := cfg.ModelRepo
	// A sharded checkpoint whose index names a shard that is not there.
	writeTinyLlama(t, repo, "shards")
	shards := filepath.Join(repo, "shards", "1")
	if err := os.Remove(filepath.Join(shards, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	writeJSON(t, filepath.Join(shards, "model.safetensors.index.json"), map[string]any{
		"weight_map": map[string]string{"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}})
	// config.json a link to itself.
	writeBERT(t, repo, "loop", 1, 1, 0)
	loop := filepath.Join(repo, "loop", "1", "config.json")
	if err := os.Remove(loop); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("config.json", loop); err != nil {
		t.Fatal(err)
	}
	// rope_theta 1.7e308.
	writeTinyLlama(t, repo, "theta")
	thetaCfg := filepath.Join(repo, "theta", "1", "config.json")
	var c map[string]any
	if b, err := os.ReadFile(thetaCfg); err != nil || json.Unmarshal(b, &c) != nil {
		t.Fatal(err)
	}
	c["rope_theta"] = 1.7e308
	writeJSON(t, thetaCfg, c)

	d := startDaemonWith(t, Options{Config: cfg, Tokenizers: byteTokenizers})
	bc := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)
	for _, tc := range []struct{ model, first, says string }{
		{"shards", "invalid model: ", "shards/1/model-00001-of-00002.safetensors is missing"},
		{"loop", "invalid model: ", "loop/1/config.json: too many links"},
		{"theta", "invalid model config: ", "rope_theta"},
	} {
		_, err := bc.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: tc.model})
		msg := status.Convert(err).Message()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(msg, tc.first) || !strings.Contains(msg, tc.says) ||
			strings.Contains(msg, "invalid safetensors file") {
			t.Errorf("LoadModel %s: %v, want INVALID_ARGUMENT saying %q then %q", tc.model, err, tc.first, tc.says)
		}
		if strings.Contains(msg, repo) {
			t.Errorf("LoadModel %s names the repository's path: %s", tc.model, msg)
		}
	}

	list, err := bc.ListModels(ctx, &brokerv1.ListModelsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	index, err := inference.NewGRPCInferenceServiceClient(d.conn).RepositoryIndex(ctx, &inference.RepositoryIndexRequest{})
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]string{}
	for _, m := range list.GetModels() {
		reasons["ListModels "+m.GetName()] = m.GetError()
	}
	for _, m := range index.GetModels() {
		reasons["RepositoryIndex "+m.GetName()] = m.GetReason()
	}
	for _, name := range []string{"shards", "loop", "theta"} {
		for _, api := range []string{"ListModels ", "RepositoryIndex "} {
			why := reasons[api+name]
			if !strings.Contains(why, name+"/1") {
				t.Errorf("%s%s: reason %q does not name the file relative to the repository", api, name, why)
			}
			if strings.Contains(why, repo) || strings.Contains(why, filepath.Dir(repo)) {
				t.Errorf("%s%s: reason %q names the repository's path", api, name, why)
			}
		}
	}
}
