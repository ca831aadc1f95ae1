package daemon

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
	"github.com/brokerd/brokerd/server/config"
)

// TestMissingSaysItOnce: over gRPC, every way of naming a model, or a
// version, that does not serve says so once: "not found" exactly once when
// brokerd does not have it (NOT_FOUND), "not loaded" exactly once (and no
// "not found") when the repository holds it but it does not serve
// (FAILED_PRECONDITION). A version the repository lacks is NOT_FOUND on
// every inference API, whether or not another version serves.
func TestMissingSaysItOnce(t *testing.T) {
	d, c := modelDaemon(t, func(repo string) {
		writeMLP(t, repo, "mlp", 1, 1, 6, 16, 3)
		writeMLP(t, repo, "mlp", 2, 2, 6, 16, 3)
		writeMLP(t, repo, "idle", 1, 3, 6, 8, 2)
	}, func(cfg *config.Config) { cfg.LoadModels = "mlp" }) // version 2 serves
	k := inference.NewGRPCInferenceServiceClient(d.conn)
	ctx := testCtx(t)
	in := []*brokerv1.Tensor{mlpInput(randRows(1, 1, 6))}
	infer := func(model string, version int64) func() error {
		return func() error {
			_, err := c.Infer(ctx, &brokerv1.InferRequest{Model: model, ModelVersion: version, Inputs: in})
			return err
		}
	}
	modelInfer := func(model, version string) func() error {
		return func() error {
			_, err := k.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: model, ModelVersion: version,
				Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{1, 6}}},
				RawInputContents: [][]byte{f32le(make([]float32, 6))}})
			return err
		}
	}
	const notFound, notLoaded = "not found", "not loaded"
	for _, tt := range []struct {
		name string
		call func() error
		code codes.Code
		once string // said exactly once
		says string
	}{
		{"infer unknown model", infer("nope", 0), codes.NotFound, notFound, `"nope"`},
		{"infer unknown model, a version", infer("nope", 3), codes.NotFound, notFound, `"nope"`},
		{"infer unknown version of the served model", infer("mlp", 7), codes.NotFound, notFound, "holds version(s) 1, 2; version 2 serves"},
		{"infer unknown version of an unloaded model", infer("idle", 7), codes.NotFound, notFound, "idle version 7"},
		{"infer a held version that does not serve", infer("mlp", 1), codes.FailedPrecondition, notLoaded, "version 2 serves"},
		{"infer an unloaded model", infer("idle", 0), codes.FailedPrecondition, notLoaded, "brokerctl load idle"},
		{"infer an unloaded model's held version", infer("idle", 1), codes.FailedPrecondition, notLoaded, "brokerctl load idle --version 1"},
		{"encode unknown model", func() error {
			_, err := c.Encode(ctx, &brokerv1.EncodeRequest{Model: "nope", Items: textItems("a")})
			return err
		}, codes.NotFound, notFound, `"nope"`},
		{"load unknown model", func() error {
			_, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "nope"})
			return err
		}, codes.NotFound, notFound, `"nope"`},
		{"load unknown version", func() error {
			_, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "mlp", Version: 7})
			return err
		}, codes.NotFound, notFound, "no version 7"},
		{"unload unknown model", func() error {
			_, err := c.UnloadModel(ctx, &brokerv1.UnloadModelRequest{Name: "nope"})
			return err
		}, codes.NotFound, notFound, `"nope"`},
		{"unload an unloaded model", func() error {
			_, err := c.UnloadModel(ctx, &brokerv1.UnloadModelRequest{Name: "idle"})
			return err
		}, codes.FailedPrecondition, notLoaded, "idle"},
		{"stats of an unknown model", func() error {
			_, err := c.GetStats(ctx, &brokerv1.GetStatsRequest{Model: "nope"})
			return err
		}, codes.NotFound, notFound, `"nope"`},
		{"Triton: unknown model", modelInfer("nope", ""), codes.NotFound, notFound, `"nope"`},
		{"Triton: unknown version", modelInfer("mlp", "7"), codes.NotFound, notFound, "mlp version 7"},
		{"Triton: a held version that does not serve", modelInfer("mlp", "1"), codes.FailedPrecondition, notLoaded, "version 2 serves"},
		{"Triton: an unloaded model", modelInfer("idle", ""), codes.FailedPrecondition, notLoaded, "idle"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			wantCode(t, err, tt.code, tt.says)
			msg := status.Convert(err).Message()
			if n := strings.Count(msg, tt.once); n != 1 {
				t.Errorf("message says %q %d times, want once: %q", tt.once, n, msg)
			}
			if tt.once == notLoaded && strings.Contains(msg, notFound) {
				t.Errorf("a model the repository holds is %q: %q", notFound, msg)
			}
		})
	}
	if err := infer("mlp", 2)(); err != nil {
		t.Errorf("the serving version, named: %v", err)
	}
}
