// Package daemon is brokerd's composition root: it parses the settings into
// the packages' types, opens the listeners, detects the devices, builds the
// scheduler, the model lifecycle and the edge (package server) over them,
// serves, and stops cleanly.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/lifecycle"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models/ollama"
	modelrepo "github.com/brokerd/brokerd/runtime/models/repo"
	"github.com/brokerd/brokerd/runtime/onednn"
	"github.com/brokerd/brokerd/runtime/pjrt"
	"github.com/brokerd/brokerd/runtime/probe"
	"github.com/brokerd/brokerd/scheduler"
	"github.com/brokerd/brokerd/server"
	"github.com/brokerd/brokerd/server/config"
)

// Addresses are where a started brokerd listens.
type Addresses struct {
	Socket  string
	TCP     string // empty when off
	Metrics string // empty when off
	Health  string // plaintext grpc.health.v1 only; empty when off
	HTTP    string // the Ollama and OpenAI HTTP APIs; empty when off
}

// Options configure Run.
type Options struct {
	Config  config.Config
	Version string
	// Getenv reads the environment for detection (TPU_* variables) and the
	// PJRT plugin search; nil means os.Getenv.
	Getenv func(string) string
	// Ready, when set, is called once brokerd serves.
	Ready func(Addresses)
	// NVML, when set, replaces the host's NVML library (--nvml-library):
	// tests and simulated hosts use go-nvml's mocks to get GPUs without a driver.
	NVML detect.NVML
	// Tokenizers reads decoder LLMs' tokenizers and chat templates from
	// the model repository; nil: byte-level BPE (runtime/models/tokenizer/bpe).
	Tokenizers modelrepo.TokenizerLoader
	// LogLevel is the logger's level (server.NewLoggerLevel's), which Triton's
	// LogSettings may change; nil: it is fixed.
	LogLevel *zap.AtomicLevel
}

// Run starts brokerd and serves until ctx is cancelled (SIGTERM/SIGINT in
// main), then stops cleanly: health goes NOT_SERVING, in-flight calls finish
// within the shutdown grace, listeners close and the socket is removed.
func Run(ctx context.Context, opts Options, log *zap.Logger) error {
	start := time.Now()
	cfg := opts.Config
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	pol, err := policyFromConfig(cfg, getenv)
	if err != nil {
		return config.Invalid(err)
	}
	// Load checked it; a Config built in code (tests, embedders) is
	// checked here, so no caller serves the data plane over HTTP to
	// whoever reaches it without saying so.
	if err := cfg.CheckHTTPAccess(); err != nil {
		return config.Invalid(err)
	}
	adm, err := server.ResolveAdmins(cfg)
	if err != nil {
		return config.Invalid(err)
	}

	// Listeners first: a second brokerd on the same socket stops here, before
	// it touches the state dir or the devices, and a busy port stops it in
	// one line, before anything is logged.
	lis, err := openListeners(cfg)
	if err != nil {
		return err
	}
	defer lis.close()
	addrs := lis.addrs
	if cfg.HTTPListen != "" && cfg.APIKeysFile == "" {
		log.Warn("HTTP APIs need no API key: every user who can reach the address may use the data plane (--http-allow-unauthenticated)",
			zap.String("http_listen", cfg.HTTPListen))
	}
	log.Info("admins", adm.LogFields()...)

	inv, closeNVML, err := discover(ctx, cfg, opts, &pol, getenv, log)
	if err == nil {
		defer closeNVML()
	}
	if stoppedDuringStart(ctx, log) {
		return nil
	}
	if err != nil {
		return err
	}

	var memTotal uint64
	if e, err := inv.Device("cpu:0"); err == nil {
		memTotal = e.MemoryTotal // the cgroup limit when lower than the host's
	}
	goLimit, inflight := memoryLimits(cfg.GoMemoryLimit, cfg.MaxInflightBytes, memTotal, cfg.MaxMessageBytes)
	setGoMemoryLimit(goLimit, getenv, log)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newDeviceCollector(inv.Devices))
	lis.limit(cfg, newConnMetrics(reg), log)

	sched := scheduler.New(scheduler.Options{
		MaxQueueItems: cfg.MaxQueueItems,
		MaxQueueDelay: time.Duration(cfg.MaxQueueDelay),
		BatchTimeout:  time.Duration(cfg.BatchTimeout),
		Registerer:    reg,
		Logger:        log,
	})
	// How long the scheduler's close may wait for device calls; once a stop
	// has begun, what is left of its deadline.
	closeWait := time.Duration(cfg.ShutdownGrace) + stopBound
	// Set once lifecycle.Open returns; closed after the scheduler, in
	// every path (see closeRuntime).
	var models *lifecycle.Set
	defer func() {
		var mc io.Closer
		if models != nil {
			mc = models
		}
		closeRuntime(sched, mc, closeWait, log)
	}()
	tokenizers := opts.Tokenizers
	if tokenizers == nil {
		tokenizers = modelrepo.BPETokenizers
	}
	repoOpts := []modelrepo.Option{modelrepo.WithTokenizerLoader(tokenizers), modelrepo.WithMaxContext(cfg.MaxContext)}
	if dir := cfg.OllamaModelsDir(); dir != "" {
		// Ollama's store, read-only: its models are served beside the
		// repository's under Ollama's names.
		store, err := ollama.Open(dir, ollama.Limits{})
		if err != nil {
			return fmt.Errorf("ollama-models: %w", err)
		}
		log.Info("Ollama model store", zap.String("dir", dir))
		repoOpts = append(repoOpts, modelrepo.WithOllamaStore(store))
	}
	repo, err := lifecycle.OpenRepository(cfg.ModelRepoDir(), cfg.ModelRepo == "", log, repoOpts...)
	if err != nil {
		return err
	}
	models, err = lifecycle.Open(ctx, inv.Devices(), []lifecycle.Encoder{lifecycle.NewHashEncoder()}, sched, repo, lifecycle.Options{
		Adapters: map[string]runtime.Adapter{onednn.Name: onednn.New(onednn.Options{Registerer: reg, AMXRelaid: cfg.CPUAMXRelaid}),
			pjrt.Name: pjrt.New(pjrt.AdapterOptions{Discovery: pol.pjrt, Registerer: reg,
				Identify: func(id string) (string, string) { e, _ := inv.Device(id); return e.PCIBusID, e.UUID }})},
		Factors:        pol.Factors,
		MaxBatch:       cfg.MaxBatch,
		Select:         pol.Select,
		MaxBatchTokens: cfg.MaxBatchTokens,
		Entries:        inv.Devices,
		DTypes:         pol.dtypes,
		KVCacheDType:   map[string]runtime.DType{"f32": runtime.F32, "bf16": runtime.BF16, "f16": runtime.F16, "q8_0": runtime.Q8_0, "q4_0": runtime.Q4_0}[cfg.KVCacheDType], // auto: 0
		SpecTokens:     cfg.SpeculativeTokens,
		SpecMaxRunning: cfg.SpeculativeMaxRunning,
	}, log)
	if stoppedDuringStart(ctx, log) {
		return nil
	}
	if err != nil {
		return err
	}
	err = models.LoadAtStart(ctx, cfg.LoadModels)
	if stoppedDuringStart(ctx, log) {
		return nil
	}
	if err != nil {
		return err
	}

	hostname, _ := os.Hostname()
	drainedExit := make(chan struct{})
	var exitOnce sync.Once
	edge, err := server.NewEdge(server.EdgeOptions{
		Config: cfg, Admins: adm, Inventory: inv,
		Policy: server.Policy{
			Select: pol.Select, Factors: pol.Factors, Memory: pol.Memory, Costs: pol.Costs,
			Runtimes: pol.Runtimes, Version: opts.Version, Hostname: hostname,
		},
		Sched: sched, Models: models, InflightBytes: inflight, Registerer: reg, LogLevel: opts.LogLevel,
		OnDrained: func() { exitOnce.Do(func() { close(drainedExit) }) },
	}, log)
	if err != nil {
		return err
	}

	errc := make(chan error, 5)
	go func() { errc <- serveGRPC(edge.Unix, lis.sock, "socket") }()
	if edge.TCP != nil {
		go func() { errc <- serveGRPC(edge.TCP, lis.tcp, "tcp") }()
	}
	if edge.Health != nil {
		go func() { errc <- serveGRPC(edge.Health, lis.health, "health") }()
	}
	var metricsSrv *http.Server
	if lis.metrics != nil {
		if host, _, err := net.SplitHostPort(lis.addrs.Metrics); cfg.Pprof && (err != nil || !config.IsLoopback(host)) {
			// Profiles show the heap's contents and every goroutine's stack.
			log.Warn("--pprof serves heap and goroutine profiles on a non-loopback address: anyone who reaches it can read them; keep the metrics listener private or drop --pprof",
				zap.String("metrics_listen", lis.addrs.Metrics))
		}
		metricsSrv = newMetricsServer(reg, cfg.Pprof, time.Duration(cfg.MaxConnectionIdle))
		go func() {
			if err := metricsSrv.Serve(lis.metrics); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("metrics server: %w", err)
			}
		}()
	}

	httpSrv := edge.HTTP
	if httpSrv != nil {
		go func() {
			var err error
			if httpSrv.TLSConfig != nil {
				err = httpSrv.ServeTLS(lis.http, "", "")
			} else {
				err = httpSrv.Serve(lis.http)
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("http server: %w", err)
			}
		}()
	}

	refreshCtx, stopRefresh := context.WithCancel(ctx)
	refreshDone := make(chan struct{})
	go func() {
		defer close(refreshDone)
		inv.Run(refreshCtx, time.Duration(cfg.Telemetry), nil)
	}()

	edge.StartServing()
	sel := inv.Select(pol.Select)
	current := "none"
	if sel.Device != nil {
		current = sel.Device.ID
	}
	log.Info("brokerd ready", zap.String("version", opts.Version), zap.String("socket", addrs.Socket),
		zap.String("tcp", addrs.TCP), zap.String("metrics", addrs.Metrics), zap.String("health", addrs.Health), zap.String("http", addrs.HTTP), zap.Int("devices", len(inv.Devices())),
		zap.String("current_device", current), zap.String("selection", sel.Reason), zap.Duration("startup", time.Since(start)))
	if opts.Ready != nil {
		opts.Ready(addrs)
	}

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("stopping: signal received; draining")
	case <-drainedExit:
		log.Info("stopping: drained on request")
	case runErr = <-errc:
		log.Error("stopping: a listener failed", zap.Error(runErr))
	}
	edge.StopServing() // everything NOT_SERVING: probes and clients stop sending
	// One deadline bounds the stop. Everything accepted completes (new
	// calls get UNAVAILABLE) within the grace; what still runs then is
	// ended with an error its client can read, and the servers close
	// within stopBound more, whatever their connections do.
	grace := time.Duration(cfg.ShutdownGrace)
	stopping := time.Now()
	graceEnd := stopping.Add(grace)
	stopBy := graceEnd.Add(stopBound)
	dctx, cancelDrain := context.WithDeadline(context.Background(), graceEnd)
	if err := sched.Drain(dctx); err != nil {
		// Queued work fails and running sequences end with ErrDraining:
		// gRPC calls answer UNAVAILABLE, HTTP streams their API's error
		// event or line, and their handlers return.
		log.Warn("the shutdown grace ended with work in flight: ending it", zap.Duration("grace", grace), zap.Error(err))
		if !sched.CloseWithin(max(time.Until(stopBy), time.Millisecond)) {
			log.Error("device calls still running after the shutdown grace")
		}
	}
	cancelDrain()
	stopRefresh()
	sctx, cancelStop := context.WithDeadline(context.Background(), stopBy)
	defer cancelStop()
	if httpSrv != nil {
		// Handlers still writing (a stream's last event, a slow reader)
		// get what is left of the deadline, then their connections close.
		if err := httpSrv.Shutdown(sctx); err != nil {
			httpSrv.Close()
		}
	}
	stopServers(sctx, edge.GRPCServers(), log)
	if metricsSrv != nil {
		if err := metricsSrv.Shutdown(sctx); err != nil {
			metricsSrv.Close()
		}
	}
	closeWait = max(time.Until(stopBy), time.Millisecond)
	<-refreshDone
	log.Info("brokerd stopped", zap.Duration("stopping", time.Since(stopping)))
	return runErr
}

// stopBound is how long a stop may take past the shutdown grace: for calls
// ended at the grace to answer, servers to close and device calls to
// return.
const stopBound = 3 * time.Second

// stoppedDuringStart reports, and logs, a stop (SIGTERM) that came during
// a start step. Whatever the step returned then (its context's error
// mostly) is the stop's doing, not a failure: Run returns nil and main
// exits 0, as from any other clean stop.
func stoppedDuringStart(ctx context.Context, log *zap.Logger) bool {
	if ctx.Err() == nil {
		return false
	}
	log.Info("stopped during start")
	return true
}

// schedCloser is the scheduler's close, as closeRuntime needs it.
type schedCloser interface {
	// CloseWithin stops the scheduler and waits up to d for its device
	// calls; false: some still run.
	CloseWithin(d time.Duration) bool
}

// closeRuntime closes the scheduler, then the models (nil: not opened),
// and returns within about wait whatever they do, so the process exits
// within the shutdown grace plus stopBound.
//
// The scheduler goes first: a replica's close takes the lock its running
// device call holds, so closing models under a running call either waits
// for it or frees its buffers. When device calls still run after wait,
// the models are left open: one is stuck, the process is exiting and the
// kernel frees its memory. models.Close also waits for a load in
// progress (it holds the lifecycle lock while it reads and warms up), so
// it is given only what is left of wait.
func closeRuntime(sched schedCloser, models io.Closer, wait time.Duration, log *zap.Logger) {
	deadline := time.Now().Add(wait)
	if !sched.CloseWithin(wait) {
		log.Error("exiting with device calls still running: models left open")
		return
	}
	if models == nil {
		return
	}
	closed := make(chan error, 1)
	go func() { closed <- models.Close() }()
	t := time.NewTimer(max(time.Until(deadline), time.Millisecond))
	defer t.Stop()
	select {
	case err := <-closed:
		if err != nil {
			log.Warn("closing models", zap.Error(err))
		}
	case <-t.C:
		log.Error("exiting before the models closed: a load or unload still holds them")
	}
}

// listeners are brokerd's open sockets: the Unix socket always, the others
// when their settings are on.
type listeners struct {
	sock, tcp, metrics, health, http net.Listener
	addrs                            Addresses
	stateLock                        *os.File // held while brokerd runs: one daemon per state dir
}

// openListeners opens every listener the settings ask for; on an error the
// ones already open are closed.
func openListeners(cfg config.Config) (_ *listeners, err error) {
	l := &listeners{addrs: Addresses{Socket: cfg.Socket}}
	defer func() {
		if err != nil {
			l.close()
		}
	}()
	if l.sock, err = listenUnix(cfg.Socket); err != nil {
		return nil, err
	}
	// Two daemons on different sockets must not share a state dir (the
	// device registry, the model repository by default).
	if l.stateLock, err = lockStateDir(cfg.StateDir); err != nil {
		return nil, err
	}
	tcp := func(addr, setting string) (net.Listener, string, error) {
		if addr == "" {
			return nil, "", nil
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, "", listenError(setting, addr, err)
		}
		return ln, ln.Addr().String(), nil
	}
	if l.tcp, l.addrs.TCP, err = tcp(cfg.Listen, "listen"); err != nil {
		return nil, err
	}
	if l.metrics, l.addrs.Metrics, err = tcp(cfg.MetricsListen, "metrics-listen"); err != nil {
		return nil, err
	}
	// Kubelet gRPC probes speak plaintext to a TCP port, which the TLS (or
	// loopback-only) listener cannot serve; this one carries health alone.
	if l.health, l.addrs.Health, err = tcp(cfg.HealthListen, "health-listen"); err != nil {
		return nil, err
	}
	if l.http, l.addrs.HTTP, err = tcp(cfg.HTTPListen, "http-listen"); err != nil {
		return nil, err
	}
	return l, nil
}

// listenError says why the listener of setting could not open on addr and
// which setting to change, as one line that the daemon prints as it does a
// bad setting's: "--http-listen 127.0.0.1:11434: address already in use
// (another Ollama?); set --http-listen / BROKERD_HTTP_LISTEN to another
// address, or empty to turn it off".
func listenError(setting, addr string, err error) error {
	why := err.Error()
	var se *os.SyscallError
	if errors.As(err, &se) {
		why = se.Err.Error() // not "listen tcp ADDR: bind: ", which the line says otherwise
	}
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		if _, port, _ := net.SplitHostPort(addr); port == "11434" {
			why += " (another Ollama?)"
		} else {
			why += " (another brokerd, or another program, listens there)"
		}
	case errors.Is(err, syscall.EACCES):
		why += " (a port below 1024 needs root or CAP_NET_BIND_SERVICE)"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		why += " (no interface of this host has that address)"
	}
	change := "--" + setting
	if env := config.EnvName(setting); env != "" {
		change += " / " + env
	}
	return config.Invalid(fmt.Errorf("--%s %s: %s; set %s to another address, or empty to turn it off", setting, addr, why, change))
}

// limit bounds every listener's connections (see connlimit.go): the
// socket, TCP and HTTP listeners by the settings and one shared pool of
// descriptors, metrics and health by small limits of their own.
func (l *listeners) limit(cfg config.Config, cm *connMetrics, log *zap.Logger) {
	nofile := raiseFileLimit()
	maxConns, perClient := connectionLimits(cfg.MaxConnections, cfg.MaxConnectionsPerClient, nofile)
	pool := newConnPool(descriptorBudget(nofile))
	l.sock = newLimitListener(l.sock, "socket", maxConns, perClient, pool, cm, log)
	bound := func(ln net.Listener, name string, total, perClient int, pool *connPool) net.Listener {
		if ln == nil {
			return nil
		}
		return newLimitListener(ln, name, total, perClient, pool, cm, log)
	}
	l.tcp = bound(l.tcp, "tcp", maxConns, perClient, pool)
	l.http = bound(l.http, "http", maxConns, perClient, pool)
	l.metrics = bound(l.metrics, "metrics", sideConns, sideConnsPerClient, nil)
	l.health = bound(l.health, "health", sideConns, sideConnsPerClient, nil)
	log.Info("connection limits", zap.Uint64("descriptors", nofile), zap.Int("shared", pool.max),
		zap.Int("per_listener", maxConns), zap.Int("per_client", perClient),
		zap.Int("metrics_health", sideConns), zap.Int("metrics_health_per_client", sideConnsPerClient),
		zap.Duration("idle", time.Duration(cfg.MaxConnectionIdle)))
}

func (l *listeners) close() {
	for _, ln := range []net.Listener{l.sock, l.tcp, l.metrics, l.health, l.http} {
		if ln != nil {
			ln.Close()
		}
	}
	if l.stateLock != nil {
		l.stateLock.Close()
	}
}

// discover probes the runtimes (recording them in pol) and detects the
// host's devices, keeping stable IDs in the state dir's registry. The
// returned func closes NVML.
func discover(ctx context.Context, cfg config.Config, opts Options, pol *daemonPolicy, getenv func(string) string, log *zap.Logger) (*detect.Inventory, func(), error) {
	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		return nil, nil, fmt.Errorf("state-dir: %w", err)
	}
	registry, err := detect.OpenRegistry(cfg.StateDir, log)
	if err != nil {
		return nil, nil, fmt.Errorf("device registry: %w", err)
	}

	pol.Runtimes = probe.Probe(ctx, probe.Options{PJRT: pol.pjrt})
	for _, rt := range pol.Runtimes {
		log.Info("runtime probed", zap.String("runtime", rt.Name), zap.Bool("available", rt.Available),
			zap.String("version", rt.Version), zap.String("reason", rt.Reason), zap.Int("plugins", len(rt.Plugins)))
	}

	roots := detect.Roots{Sys: cfg.Sysfs, Proc: cfg.Procfs, Dev: cfg.Devfs}
	cpu := detect.NewCPUDetector(roots)
	nv := detect.NewNVMLDetector(roots, cfg.NVMLLibrary)
	if opts.NVML != nil {
		nv = detect.NewNVIDIADetector(opts.NVML, roots)
	}
	closeNVML := func() {
		if err := nv.Close(); err != nil {
			log.Warn("closing NVML", zap.Error(err))
		}
	}
	inv := detect.NewInventory(detect.InventoryOptions{
		Detectors: []detect.Detector{cpu, nv, detect.NewTPUDetector(roots, getenv),
			detect.NewAMDDetector(roots), detect.NewCoralDetector(roots)},
		Refreshers: []detect.Refresher{cpu, nv},
		Registry:   registry,
		Runtimes:   server.RuntimeStatuses(pol.Runtimes),
		Memory:     pol.Memory,
		Costs:      pol.Costs,
		Logger:     log,
	})
	if err := inv.Discover(ctx); err != nil {
		closeNVML()
		return nil, nil, fmt.Errorf("device discovery: %w", err)
	}
	for _, n := range inv.Notes() {
		log.Info("detection note", zap.String("note", n))
	}
	return inv, closeNVML, nil
}

// newMetricsServer serves /metrics from reg, /healthz, and with pprof the
// heap, goroutine, mutex and block profiles. Keep-alive connections idle
// for idle are closed: a scraper keeps one between scrapes, but idle ones
// held open would fill the listener's few slots.
func newMetricsServer(reg *prometheus.Registry, withPprof bool, idle time.Duration) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	if withPprof {
		// No CPU profile: its SIGPROF lands on OpenMP worker threads inside
		// oneDNN and was seen to crash brokerd under load. Use perf for CPU
		// profiles.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
	}
	return &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idle}
}

func serveGRPC(s *grpc.Server, l net.Listener, name string) error {
	if err := s.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("%s listener: %w", name, err)
	}
	return nil
}

// stopServers lets in-flight calls finish until ctx ends, then cuts the
// rest and returns within cutWait. Stop closes every connection and
// cancels the calls' contexts, but GracefulStop (grpc-go) still waits for
// every handler to return, and one that does not look at its context (a
// LoadModel reading a large model) would keep the process alive for as
// long as it runs: past cutWait the stop goes on without it.
func stopServers(ctx context.Context, servers []*grpc.Server, log *zap.Logger) {
	done := make(chan struct{})
	go func() {
		for _, s := range servers {
			s.GracefulStop()
		}
		close(done)
	}()
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	log.Warn("stop deadline passed: cancelling the calls still in flight")
	for _, s := range servers {
		s.Stop()
	}
	t := time.NewTimer(cutWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		log.Error("exiting with calls whose handlers have not returned")
	}
}

// cutWait is how long the stop waits, after cutting them, for the calls
// that outlived its deadline to return: their contexts are cancelled and
// their connections closed, so those that can return do so at once.
const cutWait = 100 * time.Millisecond

// daemonPolicy is the configuration parsed into the types the packages use.
type daemonPolicy struct {
	server.Policy
	pjrt   pjrt.Options
	dtypes map[detect.Type]runtime.DType // compute type per device type
}

func policyFromConfig(cfg config.Config, getenv func(string) string) (daemonPolicy, error) {
	var p daemonPolicy
	prefer, err := detect.ParsePrefer(cfg.Prefer)
	if err != nil {
		return p, fmt.Errorf("prefer: %w", err)
	}
	p.Select = detect.Policy{Prefer: prefer, AllowTPU: cfg.AllowTPU}
	p.Factors = detect.Factors{TPU: cfg.TPUBatchFactor, GPU: cfg.GPUBatchFactor, CPU: cfg.CPUBatchFactor}
	if p.Memory, err = detect.ParseMemoryStrategy(cfg.MemoryStrategy); err != nil {
		return p, fmt.Errorf("memory-strategy: %w", err)
	}
	p.Costs = detect.DefaultCostTable()
	if cfg.Costs != "" {
		if p.Costs, err = detect.ParseCostOverrides(cfg.Costs); err != nil {
			return p, fmt.Errorf("costs (BROKERD_COSTS): %w", err)
		}
	}
	plugins, err := pjrt.ParsePluginSpec(cfg.PJRTPlugins)
	if err != nil {
		return p, fmt.Errorf("pjrt-plugin: %w", err)
	}
	p.pjrt = pjrt.Options{Plugins: plugins, Getenv: getenv}
	if err := p.pjrt.Validate(); err != nil {
		return p, err
	}
	dtypes, err := config.ComputeDTypes(cfg.ComputeDType)
	if err != nil {
		return p, fmt.Errorf("compute-dtype: %w", err)
	}
	p.dtypes = map[detect.Type]runtime.DType{}
	for t, dt := range dtypes {
		p.dtypes[detect.Type(t)] = runtime.F32
		if dt == "bf16" {
			p.dtypes[detect.Type(t)] = runtime.BF16
		}
	}
	return p, nil
}
