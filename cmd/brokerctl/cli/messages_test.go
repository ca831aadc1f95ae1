package cli

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// brokerd's own messages for a model it does not know (lifecycle's Missing
// and a repository load of an unknown name or version).
const (
	msgUnknownModel  = `model "nope" not found (Served: nbmf-hash-v1): model not found`
	msgNotInRepo     = `model nope: model not found: "nope" is not in the repository`
	msgNoVersion     = `model sentiment: model not found: model "sentiment" has no version 7 (versions [1])`
	msgNotLoaded     = `model sentiment is in the repository but not loaded (brokerctl load sentiment): model not loaded`
	msgUnknownDevice = `device "gpu:9": device not found`
)

func (f *fakeBroker) LoadModel(_ context.Context, req *brokerv1.LoadModelRequest) (*brokerv1.LoadModelResponse, error) {
	if req.GetVersion() != 0 {
		return nil, status.Error(codes.NotFound, msgNoVersion)
	}
	return nil, status.Error(codes.NotFound, msgNotInRepo)
}

func (f *fakeBroker) UnloadModel(ctx context.Context, _ *brokerv1.UnloadModelRequest) (*brokerv1.UnloadModelResponse, error) {
	f.mu.Lock()
	_, f.unloadDeadline = ctx.Deadline()
	f.mu.Unlock()
	return nil, status.Error(codes.NotFound, msgUnknownModel)
}

// TestWaitingCommandsHaveNoDefaultDeadline: unload (like load and drain)
// waits on brokerd's own work, a long generation's end, so it has no
// deadline unless --timeout gives one (it failed after the default 10s
// while the unload went on).
func TestWaitingCommandsHaveNoDefaultDeadline(t *testing.T) {
	ts := startServer(t)
	for _, tc := range []struct {
		args     []string
		deadline bool
	}{
		{[]string{"unload", "nope"}, false},
		{[]string{"--timeout", "1h", "unload", "nope"}, true},
	} {
		ts.run(t, nil, tc.args...)
		ts.broker.mu.Lock()
		got := ts.broker.unloadDeadline
		ts.broker.mu.Unlock()
		if got != tc.deadline {
			t.Errorf("brokerctl %s: deadline %v, want %v", strings.Join(tc.args, " "), got, tc.deadline)
		}
	}
}

func TestTidyMessage(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{msgUnknownModel, `model "nope" not found (Served: nbmf-hash-v1)`},
		{msgNotInRepo, `model nope: "nope" is not in the repository`},
		{msgNoVersion, `model sentiment: model "sentiment" has no version 7 (versions [1])`},
		{msgNotLoaded, `model sentiment is in the repository but not loaded (brokerctl load sentiment)`},
		{msgUnknownDevice, msgUnknownDevice}, // the only statement of what is missing
		{`scheduler: "enc" on gpu:3: device not found`, `scheduler: "enc" on gpu:3: device not found`},
		{"model not found", "model not found"},
		{`input "x" is not an input of model m (it takes text BYTES [-1])`, `input "x" is not an input of model m (it takes text BYTES [-1])`},
	} {
		if got := tidyMessage(tt.in); got != tt.want {
			t.Errorf("tidyMessage(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestNotFoundOnce: brokerctl says "not found" once per message, whatever
// brokerd's message repeats.
func TestNotFoundOnce(t *testing.T) {
	ts := startServer(t)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"load", "nope"}, `brokerctl: load: model nope: "nope" is not in the repository (NOT_FOUND)` + "\n"},
		{[]string{"load", "sentiment", "--version", "7"}, `brokerctl: load: model sentiment: model "sentiment" has no version 7 (versions [1]) (NOT_FOUND)` + "\n"},
		{[]string{"unload", "nope"}, `brokerctl: unload: model "nope" not found (Served: nbmf-hash-v1) (NOT_FOUND)` + "\n"},
	} {
		r := ts.run(t, nil, tt.args...)
		if r.code != ExitError || r.stderr != tt.want || strings.Count(r.stderr, "not found") > 1 {
			t.Errorf("brokerctl %s: got %v\nwant stderr %q", strings.Join(tt.args, " "), r, tt.want)
		}
	}
}
