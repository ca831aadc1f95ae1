package client_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/brokerd/brokerd/client"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// The README's example: encode two records with the built-in encoder, get
// one back from its code, and stream a chat answer (after make models).
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx) // BROKERD_ADDR, BROKERD_SOCKET or the default socket
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	res, err := c.EncodeTexts(ctx, "", []string{"the council meets at dawn", "the well ran dry"}, client.Both)
	for e, ok := client.AsError(err); ok && e.Retryable(); e, ok = client.AsError(err) {
		time.Sleep(client.RetryDelay(err, 0)) // queue full or draining: brokerd says when to retry
		res, err = c.EncodeTexts(ctx, "", []string{"the council meets at dawn", "the well ran dry"}, client.Both)
	}
	if err != nil {
		log.Fatal(err)
	}
	original, err := client.Decode(res[1]) // decompressed and checked against its signature
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d dims, %q\n", len(res[0].GetVector()), original)

	for part, err := range c.Chat(ctx, &brokerv1.ChatRequest{Model: "qwen-tiny",
		Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{{Role: "user", Content: "Hello"}}}},
		Sampling:      &brokerv1.SamplingParams{MaxTokens: 16}}) {
		if err != nil {
			log.Fatal(err)
		}
		for _, d := range part.GetDeltas() {
			fmt.Print(d.GetText())
		}
	}
}
