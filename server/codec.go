package server

import (
	"context"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// parseCodec is the proto codec with two differences. A request that does
// not parse (bad wire bytes, a string that is not UTF-8) is remembered
// instead of failing inside grpc-go, which would answer INTERNAL before any
// interceptor runs — so it would neither get the right code nor be counted.
// And what decoding a request builds is charged to the in-flight budget
// before it is built (decodecost.go): a request the budget cannot take is
// remembered undecoded. The interceptors take the error back
// (takeParseError) and answer it, counted like every other call.
type parseCodec struct {
	encoding.CodecV2
	budget *byteBudget // nil: decoding is not charged
	bad    sync.Map    // the message grpc-go decoded into → its parse error or refusal
}

// decodeMethod labels the budget's refusals of a request not yet decoded.
const decodeMethod = "decode"

func newParseCodec(budget *byteBudget) *parseCodec {
	return &parseCodec{CodecV2: encoding.GetCodecV2(protocodec.Name), budget: budget}
}

func (c *parseCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok || c.budget == nil {
		if err := c.CodecV2.Unmarshal(data, v); err != nil {
			if ok {
				proto.Reset(m) // no half-parsed fields reach a handler
			}
			c.bad.Store(v, err)
		}
		return nil
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	// Charged while it decodes: its strings' copies and its structs. The
	// interceptors charge the decoded request (cost) for as long as it is
	// served.
	release, err := c.budget.acquire(decodeMethod, int64(len(b))+c.budget.shapes.wire(m.ProtoReflect().Descriptor(), b))
	if err != nil {
		// Its names and ids are decoded, for the answer (a stream of
		// requests answers this one by its id).
		_ = proto.Unmarshal(scalarFields(m.ProtoReflect().Descriptor(), b), m)
		c.bad.Store(v, refusal{err})
		return nil
	}
	defer release()
	if err := proto.Unmarshal(b, m); err != nil {
		proto.Reset(m)
		c.bad.Store(v, err)
	}
	return nil
}

// refusal is the budget's refusal of a request before it was decoded.
type refusal struct{ error }

// takeParseError returns (and forgets) the parse error of req, if any, as
// INVALID_ARGUMENT, or the budget's refusal to decode it.
func (c *parseCodec) takeParseError(method string, req any) error {
	if c == nil {
		return nil
	}
	e, ok := c.bad.LoadAndDelete(req)
	if !ok {
		return nil
	}
	if r, ok := e.(refusal); ok {
		st := status.Convert(r.error)
		p := st.Proto()
		p.Message = method + ": " + strings.TrimPrefix(p.Message, decodeMethod+": ")
		// Received whole: a stream of requests may answer it and read on.
		return budgetRefusal{status.FromProto(p).Err()}
	}
	return status.Errorf(codes.InvalidArgument, "%s: the request does not parse: %v", method, e)
}

// parseCheckedStream reports a streamed request that does not parse.
type parseCheckedStream struct {
	grpc.ServerStream
	codec  *parseCodec
	method string
}

func (s *parseCheckedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.codec.takeParseError(s.method, m)
}

// Context is the wrapped stream's (spelled out for readers of the wrapper).
func (s *parseCheckedStream) Context() context.Context { return s.ServerStream.Context() }
