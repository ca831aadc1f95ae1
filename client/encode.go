package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/klauspost/compress/zstd"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// What Encode returns per item.
const (
	Semantic = brokerv1.Fidelity_FIDELITY_SEMANTIC // the vector
	Lossless = brokerv1.Fidelity_FIDELITY_LOSSLESS // the compressed code and signature
	Both     = brokerv1.Fidelity_FIDELITY_BOTH
)

// Encode encodes req's items through EncodeStream and puts the parts back
// together, so answers larger than gRPC's default 4 MiB message limit
// (thousands of records with codes) arrive whole. Results are in the items'
// order, one per item.
func (c *Client) Encode(ctx context.Context, req *brokerv1.EncodeRequest) (*brokerv1.EncodeResponse, error) {
	st, err := c.broker.EncodeStream(ctx, &brokerv1.EncodeStreamRequest{Request: req})
	if err != nil {
		return nil, wrap(err)
	}
	resp := &brokerv1.EncodeResponse{}
	for {
		p, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, wrap(err)
		}
		if int(p.GetOffset()) != len(resp.Results) || int(p.GetTotal()) > len(req.GetItems()) {
			return nil, fmt.Errorf("brokerd sent a part at offset %d of %d results after %d", p.GetOffset(), p.GetTotal(), len(resp.Results))
		}
		resp.Results = append(resp.Results, p.GetResults()...)
		if p.GetExecution() != nil {
			resp.Model, resp.ModelVersion, resp.Execution = p.GetModel(), p.GetModelVersion(), p.GetExecution()
		}
	}
	if len(resp.Results) != len(req.GetItems()) {
		return nil, fmt.Errorf("brokerd returned %d results for %d items", len(resp.Results), len(req.GetItems()))
	}
	return resp, nil
}

// EncodeTexts encodes texts with model ("" for the built-in encoder) at
// fidelity; item IDs are the texts' indexes.
func (c *Client) EncodeTexts(ctx context.Context, model string, texts []string, fidelity brokerv1.Fidelity) ([]*brokerv1.EncodeResult, error) {
	items := make([]*brokerv1.EncodeItem, len(texts))
	for i, t := range texts {
		items[i] = &brokerv1.EncodeItem{Id: fmt.Sprint(i), Content: &brokerv1.EncodeItem_Text{Text: t}}
	}
	r, err := c.Encode(ctx, &brokerv1.EncodeRequest{Model: model, Items: items, Fidelity: fidelity})
	if err != nil {
		return nil, err
	}
	return r.GetResults(), nil
}

// ErrSignature is returned by Decode when a code does not decompress to
// the bytes its signature names.
var ErrSignature = errors.New("client: the code does not match its signature")

// maxDecoded bounds what Decode inflates: a code is at most an item, and
// items are bounded by the daemon's --max-item-bytes (16 MiB by default).
const maxDecoded = 1 << 30

// Decode decompresses a result's code back to the original bytes and checks
// them against its signature (sha256 of the original).
func Decode(r *brokerv1.EncodeResult) ([]byte, error) {
	if len(r.GetCode()) == 0 {
		return nil, errors.New("client: the result has no code (encode with Lossless or Both)")
	}
	if codec := r.GetCodec(); codec != "zstd" {
		return nil, fmt.Errorf("client: unknown codec %q", codec)
	}
	dec, err := zstd.NewReader(bytes.NewReader(r.GetCode()), zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxDecoded))
	if err != nil {
		return nil, fmt.Errorf("client: decode: %w", err)
	}
	defer dec.Close()
	out, err := io.ReadAll(io.LimitReader(dec, maxDecoded+1))
	if err != nil {
		return nil, fmt.Errorf("client: decode: %w", err)
	}
	if len(out) > maxDecoded {
		return nil, fmt.Errorf("client: decode: more than %d bytes", maxDecoded)
	}
	if err := Verify(out, r.GetSignature()); err != nil {
		return nil, err
	}
	return out, nil
}

// Verify checks original bytes against a result's signature
// ("sha256:" and the hex digest).
func Verify(original []byte, signature string) error {
	hexSum, ok := strings.CutPrefix(signature, "sha256:")
	if !ok {
		return fmt.Errorf("client: signature %q is not sha256:HEX", signature)
	}
	sum := sha256.Sum256(original)
	if hex.EncodeToString(sum[:]) != hexSum {
		return ErrSignature
	}
	return nil
}
