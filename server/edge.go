package server

import (
	"net/http"
	"os"
	goruntime "runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/brokerd/brokerd/lifecycle"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
	"github.com/brokerd/brokerd/server/config"
)

// Admins is who holds the admin role, resolved once at start.
type Admins struct{ a admins }

// ResolveAdmins resolves the admin settings, names through the system's
// user and group databases; root and brokerd's own user are always admins.
func ResolveAdmins(cfg config.Config) (Admins, error) {
	a, err := resolveAdmins(cfg, os.Geteuid(), osLookupUser, osLookupGroup)
	return Admins{a}, err
}

// LogFields describe the admins for the start's log.
func (a Admins) LogFields() []zap.Field {
	return []zap.Field{zap.String("uids", joinIDs(a.a.uids)), zap.String("groups", joinIDs(a.a.gids)),
		zap.Stringers("identities", a.a.identities)}
}

// EdgeOptions are what NewEdge builds brokerd's servers over.
type EdgeOptions struct {
	// Config's listener settings say which servers to build; its limits,
	// TLS, keepalive and HTTP settings configure them.
	Config    config.Config
	Admins    Admins
	Inventory Inventory
	Policy    Policy // Version is also the HTTP APIs'
	Sched     Scheduler
	Models    *lifecycle.Set
	// InflightBytes is the in-flight byte budget (MemoryLimits).
	InflightBytes int64
	Registerer    prometheus.Registerer
	// LogLevel is the logger's level, which Triton's LogSettings may
	// change; nil: it is fixed.
	LogLevel *zap.AtomicLevel
	// OnDrained is called once a Drain RPC asking brokerd to exit has
	// drained everything.
	OnDrained func()
}

// Edge is brokerd's servers, built but not serving: the daemon opens
// their listeners, serves and stops them.
type Edge struct {
	Unix   *grpc.Server // the Unix socket's
	TCP    *grpc.Server // --listen's; nil when off
	Health *grpc.Server // --health-listen's, plaintext health only; nil when off
	HTTP   *http.Server // the Ollama and OpenAI APIs (--http-listen); nil when off

	health   *health.Server
	draining atomic.Bool
}

// NewEdge builds the services over the data plane and the servers that
// carry them.
func NewEdge(opts EdgeOptions, log *zap.Logger) (*Edge, error) {
	cfg := opts.Config
	reg := opts.Registerer
	rpcm := newRPCMetrics(reg)
	denied := newDeniedCounter(reg)
	budget := newByteBudget(opts.InflightBytes, reg)
	registerGateMetrics(reg, decompressing)
	log.Info("in-flight byte budget", zap.Int64("bytes", opts.InflightBytes))
	e := &Edge{health: health.NewServer()}
	var err error
	e.Unix, e.TCP, err = newGRPCServers(cfg, cfg.Listen != "", rpcm, &authorizer{admins: opts.Admins.a, scope: scopeAPI, log: log, denied: denied}, budget, log)
	if err != nil {
		return nil, err
	}
	broker := NewBrokerService(opts.Inventory, opts.Policy, DataPlane{
		sched: opts.Sched, models: opts.Models, budget: budget,
		limits:    Limits{MaxItemsPerRequest: cfg.MaxItemsPerRequest, MaxItemBytes: cfg.MaxItemBytes},
		draining:  e.StopServing,
		onDrained: opts.OnDrained,
	}, log)
	// KServe's ServerReady and ModelReady turn false once a drain starts.
	kserve := NewInferenceService(broker, func() bool { return !e.draining.Load() },
		KServeOptions{MaxQueueDelay: time.Duration(cfg.MaxQueueDelay), LogLevel: opts.LogLevel})
	for _, s := range []*grpc.Server{e.Unix, e.TCP} {
		if s != nil {
			registerAPI(s, broker, kserve, e.health)
		}
	}
	if cfg.HealthListen != "" {
		codec := newParseCodec(nil) // probes are tiny and must answer when the budget is full
		healthAuthz := &authorizer{scope: scopeHealth, log: log, denied: denied}
		// Idle connections are closed, as on the API listeners: the
		// listener has few slots (daemon's limits) and probes need none
		// kept open.
		e.Health = grpc.NewServer(grpc.ForceServerCodecV2(codec),
			// A probe is one small Check on a connection of its own.
			grpc.MaxRecvMsgSize(healthMaxMessage), grpc.MaxConcurrentStreams(healthMaxStreams),
			grpc.ChainUnaryInterceptor(unaryInterceptor(log, rpcm, codec), healthAuthz.unary()),
			grpc.ChainStreamInterceptor(streamInterceptor(log, rpcm, codec), healthAuthz.stream()),
			grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: time.Duration(cfg.MaxConnectionIdle)}),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}))
		healthpb.RegisterHealthServer(e.Health, e.health)
	}
	if cfg.HTTPListen != "" {
		if e.HTTP, err = newHTTPServer(cfg, broker, budget, opts.Policy.Version, reg, log); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// The health listener's gRPC limits: a HealthCheckRequest is a service
// name, and kubelet opens a connection per probe.
const (
	healthMaxMessage = 16 << 10
	healthMaxStreams = 4
)

// GRPCServers are the gRPC servers built, to serve and stop.
func (e *Edge) GRPCServers() []*grpc.Server {
	servers := []*grpc.Server{e.Unix}
	for _, s := range []*grpc.Server{e.TCP, e.Health} {
		if s != nil {
			servers = append(servers, s)
		}
	}
	return servers
}

// StartServing turns health SERVING, for the server and its services.
func (e *Edge) StartServing() {
	e.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	e.health.SetServingStatus(brokerv1.BrokerService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	e.health.SetServingStatus(inference.GRPCInferenceService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
}

// StopServing starts a drain at the edge: health goes NOT_SERVING, so
// probes and clients stop sending, and KServe's readiness false.
func (e *Edge) StopServing() {
	e.draining.Store(true)
	e.health.Shutdown()
}

// registerAPI registers every service the Unix socket and TCP listener serve;
// methodRoles must name each of their methods.
func registerAPI(s *grpc.Server, broker brokerv1.BrokerServiceServer, kserve inference.GRPCInferenceServiceServer, h healthpb.HealthServer) {
	brokerv1.RegisterBrokerServiceServer(s, broker)
	inference.RegisterGRPCInferenceServiceServer(s, kserve)
	healthpb.RegisterHealthServer(s, h)
	reflection.Register(s)
}

// newGRPCServers builds the Unix socket's server and, with withTCP, the TCP
// one (TLS unless --insecure-tcp allowed plaintext on loopback, which config
// checks). The socket is protected by its file mode, administration by authz,
// which runs inside the metrics interceptor so refusals are counted there too.
// The parse codec hands requests that do not parse to the interceptors.
func newGRPCServers(cfg config.Config, withTCP bool, rpcm *rpcMetrics, authz *authorizer, budget *byteBudget, log *zap.Logger) (unixSrv, tcpSrv *grpc.Server, err error) {
	// Compressed requests are decompressed before the budget sees them:
	// what they expand to at once is bounded by as much (compress.go).
	// grpc-go stops a decompression one byte past the message limit.
	decompressing.setLimits(budget.max, int64(cfg.MaxMessageBytes)+1+inflateSlack)
	codec := newParseCodec(budget)
	srvOpts := []grpc.ServerOption{
		grpc.ForceServerCodecV2(codec),
		grpc.ChainUnaryInterceptor(unaryInterceptor(log, rpcm, codec), authz.unary(), budget.unary()),
		grpc.ChainStreamInterceptor(streamInterceptor(log, rpcm, codec), authz.stream(), budget.stream(), pacedSends(sendTimeout)),
		grpc.MaxRecvMsgSize(cfg.MaxMessageBytes),
		// One connection's calls at once: unbounded, a client's streams on
		// one connection each take a handler goroutine and a message
		// (grpc-go's default is no limit). Extra streams wait in the
		// client (SETTINGS_MAX_CONCURRENT_STREAMS); one that does not wait
		// is refused with REFUSED_STREAM.
		grpc.MaxConcurrentStreams(uint32(cfg.MaxConcurrentStreams)),
		// Idle connections are closed; clients may ping no more than every
		// 10 s (a flood of pings is a denial of service).
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: time.Duration(cfg.MaxConnectionIdle)}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Reused handler goroutines keep their grown stacks: a new goroutine
		// per call re-grows its stack (featurising needs a few KiB) every time.
		grpc.NumStreamWorkers(uint32(goruntime.GOMAXPROCS(0))),
		grpc.MaxSendMsgSize(cfg.MaxMessageBytes),
	}
	unixSrv = grpc.NewServer(append(slices.Clone(srvOpts), grpc.Creds(unixCreds{procfs: cfg.Procfs}))...)
	if !withTCP {
		return unixSrv, nil, nil
	}
	tcpOpts := srvOpts
	if cfg.TLSCert != "" {
		tc, err := tlsConfig(cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA)
		if err != nil {
			return nil, nil, err
		}
		tcpOpts = append(slices.Clone(srvOpts), grpc.Creds(credentials.NewTLS(tc)))
	}
	return unixSrv, grpc.NewServer(tcpOpts...), nil
}
