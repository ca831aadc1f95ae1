package daemon

import (
	"context"
	"testing"
	"time"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/server/config"
)

// TestLoadInFlightDoesNotDelayExit: a LoadModel in progress when SIGTERM
// comes (here a tokenizer read that does not look at its context; a large
// model's read and warm-up take minutes) does not keep brokerd from
// exiting: at the stop deadline its call is cut and Run returns without
// waiting for its handler (GracefulStop waits for every handler, even
// after Stop) or for the lifecycle lock the load holds (models.Close).
// The contract is the grace plus 3 s; 30 s only tells "exits" from
// "waits for the load".
func TestLoadInFlightDoesNotDelayExit(t *testing.T) {
	const grace = time.Second
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.ShutdownGrace = config.Duration(grace)
	writeTinyLlama(t, cfg.ModelRepo, "tiny-llm")
	tok := newGatedTokenizers(false)
	defer tok.open()
	d := startDaemonWith(t, Options{Config: cfg, Tokenizers: tok.load})
	c := brokerv1.NewBrokerServiceClient(d.conn)
	go func() { _, _ = c.LoadModel(context.Background(), &brokerv1.LoadModelRequest{Name: "tiny-llm"}) }()
	select {
	case <-tok.entered:
	case <-time.After(startBound):
		t.Fatal("the LoadModel never reached the tokenizer")
	}
	d.stop() // SIGTERM
	d.stop = nil
	defer d.conn.Close()
	select {
	case err := <-d.done:
		if err != nil {
			t.Errorf("Run returned %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("brokerd did not exit within 30 s of SIGTERM (grace %v + 3 s promised) while a LoadModel was in progress", grace)
		tok.open()
		<-d.done
	}
}
