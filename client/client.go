// Package client is the Go client of brokerd's gRPC API: one connection to
// the daemon (its Unix socket by default, or TCP with TLS), typed errors
// with the server's retry hint, and the operations of the API as Go
// methods. brokerctl is built on it, so the CLI and the library agree.
//
//	c, err := client.Dial(ctx)              // BROKERD_ADDR, BROKERD_SOCKET or the default socket
//	res, err := c.EncodeTexts(ctx, "", []string{"hello"}, client.Both)
//	for part, err := range c.Generate(ctx, &brokerv1.GenerateRequest{Model: "qwen", Prompts: []string{"Hi"}}) { ... }
package client

import (
	"context"
	"crypto/tls"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/server/endpoint"
)

// Client is a connection to one brokerd. It is safe for concurrent use.
type Client struct {
	conn   *grpc.ClientConn
	broker brokerv1.BrokerServiceClient
	health healthpb.HealthClient
}

type options struct {
	socket, addr string
	tls          *tls.Config
	dial         []grpc.DialOption
	getenv       func(string) string
	euid         int
}

// Option configures Dial.
type Option func(*options)

// WithSocket connects to the Unix socket at path.
func WithSocket(path string) Option { return func(o *options) { o.socket, o.addr = path, "" } }

// WithAddress connects over TCP to host:port (plaintext unless WithTLS).
func WithAddress(hostPort string) Option { return func(o *options) { o.addr = hostPort } }

// WithTLS uses TLS with cfg on a TCP address (with a client certificate in
// cfg for brokerd's --tls-client-ca).
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithDialOptions adds gRPC dial options (interceptors, message limits...).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dial = append(o.dial, opts...) }
}

// withEnv replaces the process environment and uid (tests).
func withEnv(getenv func(string) string, euid int) Option {
	return func(o *options) { o.getenv, o.euid = getenv, euid }
}

// Dial returns a client of the brokerd found by the options, else by
// BROKERD_ADDR, else BROKERD_SOCKET, else the default socket of this user
// (what brokerd listens on when started by the same user without
// --socket). Like grpc.NewClient it does not connect: the first call does,
// and an unreachable daemon is an *Error with code Unavailable.
func Dial(ctx context.Context, opts ...Option) (*Client, error) {
	o := options{getenv: os.Getenv, euid: os.Geteuid()}
	for _, f := range opts {
		f(&o)
	}
	if o.socket == "" && o.addr == "" {
		if o.addr = o.getenv(endpoint.EnvAddr); o.addr == "" {
			if o.socket = o.getenv(endpoint.EnvSocket); o.socket == "" {
				o.socket = endpoint.DefaultSocketPath(o.euid, o.getenv)
			}
		}
	}
	dial := o.dial
	if o.tls != nil {
		dial = append([]grpc.DialOption{endpoint.WithTLS(o.tls)}, dial...)
	}
	conn, err := endpoint.Dial(ctx, o.socket, o.addr, dial...)
	if err != nil {
		return nil, err
	}
	return New(conn), nil
}

// New wraps a connection made elsewhere; Close closes it.
func New(conn *grpc.ClientConn) *Client {
	return &Client{conn: conn, broker: brokerv1.NewBrokerServiceClient(conn), health: healthpb.NewHealthClient(conn)}
}

// Conn is the underlying connection, for the generated clients of the
// other services (KServe's GRPCInferenceService).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Broker is the generated client of the whole BrokerService API, for what
// this package does not wrap.
func (c *Client) Broker() brokerv1.BrokerServiceClient { return c.broker }

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Healthy returns nil when brokerd reports SERVING, an error otherwise
// (an *Error with code Unavailable while it drains).
func (c *Client) Healthy(ctx context.Context) error {
	r, err := c.health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return wrap(err)
	}
	if r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return &Error{Code: codes.Unavailable, Message: "brokerd is " + r.GetStatus().String()}
	}
	return nil
}

// Devices lists the devices brokerd owns.
func (c *Client) Devices(ctx context.Context) ([]*brokerv1.Device, error) {
	r, err := c.broker.ListDevices(ctx, &brokerv1.ListDevicesRequest{})
	if err != nil {
		return nil, wrap(err)
	}
	return r.GetDevices(), nil
}

// Models lists the models of the repository and the built-in ones, loaded
// or not.
func (c *Client) Models(ctx context.Context) (*brokerv1.ListModelsResponse, error) {
	r, err := c.broker.ListModels(ctx, &brokerv1.ListModelsRequest{})
	return r, wrap(err)
}

// Load loads a model of the repository (version 0: the newest). It needs
// the admin role.
func (c *Client) Load(ctx context.Context, name string, version int64) (*brokerv1.LoadModelResponse, error) {
	r, err := c.broker.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: name, Version: version})
	return r, wrap(err)
}

// Unload unloads a model (its requests in flight finish first). It needs
// the admin role.
func (c *Client) Unload(ctx context.Context, name string) error {
	_, err := c.broker.UnloadModel(ctx, &brokerv1.UnloadModelRequest{Name: name})
	return wrap(err)
}

// Stats returns the per-model queue and throughput statistics: a row per
// model version (device_id empty) and per replica; a generator's rows
// carry its generation figures (QueueStats.Generation: tokens per second,
// TTFT and inter-token quantiles, KV-cache blocks, preemptions).
func (c *Client) Stats(ctx context.Context, req *brokerv1.GetStatsRequest) (*brokerv1.GetStatsResponse, error) {
	if req == nil {
		req = &brokerv1.GetStatsRequest{}
	}
	r, err := c.broker.GetStats(ctx, req)
	return r, wrap(err)
}

// Infer runs a tensor model.
func (c *Client) Infer(ctx context.Context, req *brokerv1.InferRequest) (*brokerv1.InferResponse, error) {
	r, err := c.broker.Infer(ctx, req)
	return r, wrap(err)
}
