package server

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// parseCodec is the proto codec with one difference: a request that does
// not parse (bad wire bytes, a string that is not UTF-8) is remembered
// instead of failing inside grpc-go, which would answer INTERNAL before any
// interceptor runs — so it would neither get the right code nor be counted.
// The interceptors take the error back (takeParseError) and answer
// INVALID_ARGUMENT, counted like every other call.
type parseCodec struct {
	encoding.CodecV2
	bad sync.Map // the message grpc-go decoded into → its parse error
}

func newParseCodec() *parseCodec {
	return &parseCodec{CodecV2: encoding.GetCodecV2(protocodec.Name)}
}

func (c *parseCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if err := c.CodecV2.Unmarshal(data, v); err != nil {
		if m, ok := v.(proto.Message); ok {
			proto.Reset(m) // no half-parsed fields reach a handler
		}
		c.bad.Store(v, err)
	}
	return nil
}

// takeParseError returns (and forgets) the parse error of req, if any, as
// INVALID_ARGUMENT.
func (c *parseCodec) takeParseError(method string, req any) error {
	if c == nil {
		return nil
	}
	e, ok := c.bad.LoadAndDelete(req)
	if !ok {
		return nil
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
