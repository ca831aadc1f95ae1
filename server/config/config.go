// Package config loads brokerd's settings: flags over environment over a YAML
// file (--config) over defaults. Every setting has one flag; many also have an
// environment variable and all of them a YAML key (the flag name).
package config

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/brokerd/brokerd/server/endpoint"
)

// Config is brokerd's complete configuration. JSON tags are the YAML keys.
type Config struct {
	Socket        string `json:"socket"`
	Listen        string `json:"listen"`
	InsecureTCP   bool   `json:"insecure-tcp"`
	TLSCert       string `json:"tls-cert"`
	TLSKey        string `json:"tls-key"`
	TLSClientCA   string `json:"tls-client-ca"`
	MetricsListen string `json:"metrics-listen"`
	HealthListen  string `json:"health-listen"`
	// HTTPListen serves the Ollama and OpenAI HTTP APIs; APIKeysFile holds
	// the bearer tokens they require (one per line). Without keys the
	// listener needs HTTPAllowUnauthenticated: it reaches the data plane,
	// and whoever reaches its address (on loopback every local user, past
	// the socket's permissions) may then use it.
	HTTPListen               string `json:"http-listen"`
	APIKeysFile              string `json:"api-keys-file"`
	HTTPAllowUnauthenticated bool   `json:"http-allow-unauthenticated"`
	// HTTPBodyTimeout bounds the time an HTTP request's body may take to
	// arrive (its headers get 10 s, or this when shorter).
	HTTPBodyTimeout Duration `json:"http-body-timeout"`
	// HTTPCORSOrigins are the browser origins (scheme://host[:port], or
	// "*" for any) the HTTP APIs answer besides loopback ones, which are
	// always allowed.
	HTTPCORSOrigins List `json:"http-cors-origins"`
	// ResponsesStoreBytes bounds the memory of the Responses API's stored
	// responses (store true), which previous_response_id continues; the
	// least recently used go first. 0: none are kept.
	ResponsesStoreBytes int64 `json:"responses-store-bytes"`
	// Connection limits per listener (0: derived from the descriptor
	// limit) and the idle time after which a connection is closed.
	MaxConnections          int      `json:"max-connections"`
	MaxConnectionsPerClient int      `json:"max-connections-per-client"`
	MaxConnectionIdle       Duration `json:"max-connection-idle"`
	// MaxConcurrentStreams bounds the calls one gRPC connection runs at
	// once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS).
	MaxConcurrentStreams int `json:"max-concurrent-streams"`
	// MaxInflightBytes bounds the bytes held for calls being served (0:
	// derived from the memory limit); GoMemoryLimit is the Go runtime's
	// memory limit (0: derived, -1: none).
	MaxInflightBytes int64 `json:"max-inflight-bytes"`
	// MaxContext caps generator models' context length in tokens.
	MaxContext    int    `json:"max-context"`
	GoMemoryLimit int64  `json:"go-memory-limit"`
	StateDir      string `json:"state-dir"`
	LogLevel      string `json:"log-level"`
	LogFormat     string `json:"log-format"`

	Prefer         string `json:"prefer"`
	AllowTPU       bool   `json:"allow-tpu"`
	TPUBatchFactor int    `json:"tpu-batch-factor"`
	GPUBatchFactor int    `json:"gpu-batch-factor"`
	CPUBatchFactor int    `json:"cpu-batch-factor"`
	MemoryStrategy string `json:"memory-strategy"`
	Costs          string `json:"costs"`

	Sysfs       string `json:"sysfs"`
	Procfs      string `json:"procfs"`
	Devfs       string `json:"devfs"`
	NVMLLibrary string `json:"nvml-library"`
	PJRTPlugins string `json:"pjrt-plugin"`
	// ComputeDType is the type each device type's models compute in:
	// "cpu=f32,gpu=f32,tpu=bf16" (see ComputeDTypes).
	ComputeDType string `json:"compute-dtype"`
	// CPUAMXRelaid relays block-quantized weights by 16 rows on CPUs with
	// AMX as on those without (onednn.Options.AMXRelaid): experimental,
	// off until measured there.
	CPUAMXRelaid bool `json:"cpu-amx-relaid"`
	// KVCacheDType is generators' KV cache type: auto, f32, bf16, f16, q8_0
	// or q4_0 (see KVCacheDTypes).
	KVCacheDType string `json:"kv-cache-dtype"`
	// SpeculativeTokens is the most tokens a generator's decoding sequence
	// guesses per step by prompt lookup (speculative decoding; 0: off);
	// SpeculativeMaxRunning the most sequences a replica runs while it
	// guesses (scheduler.GenOptions.SpecTokens, SpecMaxRunning).
	SpeculativeTokens     int      `json:"speculative-tokens"`
	SpeculativeMaxRunning int      `json:"speculative-max-running"`
	Telemetry             Duration `json:"telemetry-interval"`

	MaxMessageBytes    int      `json:"max-message-bytes"`
	MaxItemsPerRequest int      `json:"max-items-per-request"`
	MaxItemBytes       int      `json:"max-item-bytes"`
	MaxQueueItems      int      `json:"max-queue-items"`
	MaxQueueDelay      Duration `json:"max-queue-delay"`
	BatchTimeout       Duration `json:"batch-timeout"`
	MaxBatch           int      `json:"max-batch"`
	MaxBatchTokens     int      `json:"max-batch-tokens"`
	Pprof              bool     `json:"pprof"`
	ShutdownGrace      Duration `json:"shutdown-grace"`

	ModelRepo  string `json:"model-repo"`
	LoadModels string `json:"load-models"`
	// OllamaModels is Ollama's model store (manifests/ and blobs/), read
	// only: "" or "off" for none (see OllamaModelsDir); by default
	// ~/.ollama/models when it is a directory.
	OllamaModels string `json:"ollama-models"`

	// Who may administer brokerd (see SECURITY.md). Root and brokerd's own
	// uid are admins whatever these say.
	AdminUIDs       List `json:"admin-uids"`
	AdminGroups     List `json:"admin-groups"`
	AdminIdentities List `json:"admin-identities"`
}

// Duration is a time.Duration that reads "5s" from YAML.
type Duration time.Duration

// UnmarshalJSON accepts a Go duration string or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if v, err := time.ParseDuration(s); err == nil {
		*d = Duration(v)
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return fmt.Errorf("invalid duration %s: want e.g. \"5s\"", b)
	}
	*d = Duration(f * float64(time.Second))
	return nil
}

// MarshalJSON writes the duration as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return []byte(strconv.Quote(time.Duration(d).String())), nil
}

// Set implements flag.Value.
func (d *Duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

func (d *Duration) String() string { return time.Duration(*d).String() }

// Defaults returns the built-in settings for a process with the given
// effective uid and environment.
func Defaults(euid int, getenv func(string) string) Config {
	state := "/var/lib/brokerd"
	if euid != 0 {
		base := getenv("XDG_STATE_HOME")
		if base == "" {
			if home := getenv("HOME"); home != "" {
				base = filepath.Join(home, ".local", "state")
			} else {
				base = os.TempDir()
			}
		}
		state = filepath.Join(base, "brokerd")
	}
	return Config{
		Socket:               endpoint.DefaultSocketPath(euid, getenv),
		MetricsListen:        "127.0.0.1:9464",
		StateDir:             state,
		LogLevel:             "info",
		LogFormat:            "json",
		Prefer:               "auto",
		AllowTPU:             true,
		TPUBatchFactor:       128,
		GPUBatchFactor:       4,
		CPUBatchFactor:       1,
		MemoryStrategy:       "balanced",
		ComputeDType:         DefaultComputeDType,
		KVCacheDType:         defaultKVCacheDType(getenv),
		Sysfs:                "/sys",
		Procfs:               "/proc",
		Devfs:                "/dev",
		Telemetry:            Duration(5 * time.Second),
		MaxMessageBytes:      64 << 20,
		ResponsesStoreBytes:  64 << 20,
		MaxItemsPerRequest:   4096,
		MaxItemBytes:         1 << 20,
		MaxQueueItems:        65536,
		MaxBatchTokens:       16384,
		ShutdownGrace:        Duration(30 * time.Second),
		BatchTimeout:         Duration(2 * time.Minute), // scheduler.DefaultBatchTimeout
		MaxConnectionIdle:    Duration(5 * time.Minute),
		MaxConcurrentStreams: 100,
		HTTPBodyTimeout:      Duration(time.Minute),
		MaxContext:           8192,
		OllamaModels:         defaultOllamaModels(getenv),

		// speculative-tokens is off (0).
		SpeculativeMaxRunning: DefaultSpeculativeMaxRunning,
	}
}

// defaultOllamaModels is Ollama's own default store, ~/.ollama/models,
// when it is a directory ("" otherwise: no Ollama store).
func defaultOllamaModels(getenv func(string) string) string {
	home := getenv("HOME")
	if home == "" {
		return ""
	}
	p := filepath.Join(home, ".ollama", "models")
	if st, err := os.Stat(p); err != nil || !st.IsDir() {
		return ""
	}
	return p
}

// defaultKVCacheDType is auto unless Ollama's OLLAMA_KV_CACHE_TYPE names a
// type (f16, q8_0, q4_0; any case, as Ollama reads it): a user moving from
// Ollama keeps the cache they chose there. It is a default, so the config
// file, BROKERD_KV_CACHE_DTYPE and the flag win; a value brokerd lacks fails
// Validate, naming both variables, where Ollama would warn and use f16.
func defaultKVCacheDType(getenv func(string) string) string {
	if v := strings.TrimSpace(getenv(fallbackEnvNames["kv-cache-dtype"])); v != "" {
		return strings.ToLower(v)
	}
	return "auto"
}

// fallbackEnvNames are Ollama's variables that set a flag's default when
// brokerd's own variable is unset.
var fallbackEnvNames = map[string]string{
	"kv-cache-dtype": "OLLAMA_KV_CACHE_TYPE",
}

// OllamaModelsOff turns the Ollama store off, whatever the default.
const OllamaModelsOff = "off"

// EnvName is the environment variable that sets the flag name ("" if
// none), for messages that say which setting to change.
func EnvName(flag string) string { return envNames[flag] }

// envNames maps flag names to the environment variables that set them.
var envNames = map[string]string{
	"socket":                     "BROKERD_SOCKET",
	"listen":                     "BROKERD_LISTEN",
	"insecure-tcp":               "BROKERD_INSECURE_TCP",
	"tls-cert":                   "BROKERD_TLS_CERT",
	"tls-key":                    "BROKERD_TLS_KEY",
	"tls-client-ca":              "BROKERD_TLS_CLIENT_CA",
	"metrics-listen":             "BROKERD_METRICS_LISTEN",
	"health-listen":              "BROKERD_HEALTH_LISTEN",
	"state-dir":                  "BROKERD_STATE_DIR",
	"log-level":                  "BROKERD_LOG_LEVEL",
	"log-format":                 "BROKERD_LOG_FORMAT",
	"prefer":                     "COMPUTE_PREFER",
	"allow-tpu":                  "COMPUTE_ALLOW_TPU",
	"tpu-batch-factor":           "COMPUTE_TPU_BATCH_FACTOR",
	"gpu-batch-factor":           "COMPUTE_GPU_BATCH_FACTOR",
	"cpu-batch-factor":           "COMPUTE_CPU_BATCH_FACTOR",
	"memory-strategy":            "BROKERD_MEMORY_STRATEGY",
	"costs":                      "BROKERD_COSTS",
	"nvml-library":               "BROKERD_NVML_LIBRARY",
	"pjrt-plugin":                "BROKERD_PJRT_PLUGINS",
	"compute-dtype":              "BROKERD_COMPUTE_DTYPE",
	"cpu-amx-relaid":             "BROKERD_CPU_AMX_RELAID",
	"kv-cache-dtype":             "BROKERD_KV_CACHE_DTYPE",
	"speculative-tokens":         "BROKERD_SPECULATIVE_TOKENS",
	"speculative-max-running":    "BROKERD_SPECULATIVE_MAX_RUNNING",
	"telemetry-interval":         "BROKERD_TELEMETRY_INTERVAL",
	"max-message-bytes":          "BROKERD_MAX_MESSAGE_BYTES",
	"max-items-per-request":      "BROKERD_MAX_ITEMS_PER_REQUEST",
	"max-item-bytes":             "BROKERD_MAX_ITEM_BYTES",
	"max-queue-items":            "BROKERD_MAX_QUEUE_ITEMS",
	"max-queue-delay":            "BROKERD_MAX_QUEUE_DELAY",
	"batch-timeout":              "BROKERD_BATCH_TIMEOUT",
	"max-batch":                  "BROKERD_MAX_BATCH",
	"pprof":                      "BROKERD_PPROF",
	"max-batch-tokens":           "BROKERD_MAX_BATCH_TOKENS",
	"model-repo":                 "BROKERD_MODEL_REPO",
	"load-models":                "BROKERD_LOAD_MODELS",
	"ollama-models":              "OLLAMA_MODELS",
	"shutdown-grace":             "BROKERD_SHUTDOWN_GRACE",
	"http-listen":                "BROKERD_HTTP_LISTEN",
	"max-connections":            "BROKERD_MAX_CONNECTIONS",
	"max-connections-per-client": "BROKERD_MAX_CONNECTIONS_PER_CLIENT",
	"max-connection-idle":        "BROKERD_MAX_CONNECTION_IDLE",
	"max-concurrent-streams":     "BROKERD_MAX_CONCURRENT_STREAMS",
	"max-inflight-bytes":         "BROKERD_MAX_INFLIGHT_BYTES",
	"max-context":                "BROKERD_MAX_CONTEXT",
	"go-memory-limit":            "BROKERD_GO_MEMORY_LIMIT",
	"api-keys-file":              "BROKERD_API_KEYS_FILE",
	"http-allow-unauthenticated": "BROKERD_HTTP_ALLOW_UNAUTHENTICATED",
	"http-body-timeout":          "BROKERD_HTTP_BODY_TIMEOUT",
	"http-cors-origins":          "BROKERD_HTTP_CORS_ORIGINS",
	"responses-store-bytes":      "BROKERD_RESPONSES_STORE_BYTES",
	"admin-uids":                 "BROKERD_ADMIN_UIDS",
	"admin-groups":               "BROKERD_ADMIN_GROUPS",
	"admin-identities":           "BROKERD_ADMIN_IDENTITIES",
	"config":                     "BROKERD_CONFIG",
}

// bind registers every setting as a flag writing into c.
func bind(fs *flag.FlagSet, c *Config, configPath *string) {
	fs.StringVar(configPath, "config", "", "YAML settings file (keys are the flag names)")
	fs.StringVar(&c.Socket, "socket", c.Socket, "Unix socket path")
	fs.StringVar(&c.Listen, "listen", c.Listen, "TCP listen address HOST:PORT (off when empty)")
	fs.BoolVar(&c.InsecureTCP, "insecure-tcp", c.InsecureTCP, "allow TCP without TLS (loopback addresses only)")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "TLS certificate for the TCP listener")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "TLS private key for the TCP listener")
	fs.StringVar(&c.TLSClientCA, "tls-client-ca", c.TLSClientCA, "CA bundle; when set, TCP clients must present a certificate it signed")
	fs.StringVar(&c.MetricsListen, "metrics-listen", c.MetricsListen, "Prometheus /metrics listen address (off when empty)")
	fs.StringVar(&c.HealthListen, "health-listen", c.HealthListen, "plaintext TCP HOST:PORT serving only grpc.health.v1, for Kubernetes gRPC probes (off when empty)")
	fs.StringVar(&c.HTTPListen, "http-listen", c.HTTPListen, "HOST:PORT of the Ollama- and OpenAI-compatible HTTP APIs (off when empty); plaintext on loopback only, elsewhere it needs --tls-cert/--tls-key")
	fs.IntVar(&c.MaxConnections, "max-connections", c.MaxConnections, "most open connections per listener (socket, TCP, HTTP); 0: the descriptor limit less a reserve, so metrics and health always answer")
	fs.IntVar(&c.MaxConnectionsPerClient, "max-connections-per-client", c.MaxConnectionsPerClient, "most open connections of one client (uid on the socket, IP on TCP) per listener; 0: a quarter of max-connections")
	fs.Var(&c.MaxConnectionIdle, "max-connection-idle", "close a connection idle (no call in flight) for this long")
	fs.IntVar(&c.MaxConcurrentStreams, "max-concurrent-streams", c.MaxConcurrentStreams, "most calls one gRPC connection (socket or TCP) runs at once; a client asks for more by opening more connections, within max-connections-per-client")
	fs.IntVar(&c.MaxContext, "max-context", c.MaxContext, "most tokens (prompt and output) of a generator model's sequence, below its max_position_embeddings; each replica's KV cache holds at least one such sequence")
	fs.Int64Var(&c.MaxInflightBytes, "max-inflight-bytes", c.MaxInflightBytes, "bytes the calls being served may hold (twice each request's size); beyond it calls get RESOURCE_EXHAUSTED; 0: a quarter of the Go memory limit")
	fs.Int64Var(&c.GoMemoryLimit, "go-memory-limit", c.GoMemoryLimit, "Go runtime memory limit in bytes; 0: three quarters of the memory brokerd may use (the cgroup limit, else the host's); -1: none; GOMEMLIMIT wins")
	fs.StringVar(&c.APIKeysFile, "api-keys-file", c.APIKeysFile, "file of API keys, one per line, that HTTP API requests must carry as Authorization: Bearer KEY; --http-listen needs it or --http-allow-unauthenticated")
	fs.BoolVar(&c.HTTPAllowUnauthenticated, "http-allow-unauthenticated", c.HTTPAllowUnauthenticated, "serve --http-listen without API keys: every user who can reach its address (on loopback, every local user, whatever the socket's permissions) may use the data plane")
	fs.Var(&c.HTTPBodyTimeout, "http-body-timeout", "most time an HTTP API request's body may take to arrive (its headers: 10s, or this when shorter); a request still sending then is answered 408 and its connection closed")
	fs.Var(&c.HTTPCORSOrigins, "http-cors-origins", "browser origins, comma-separated (scheme://host[:port], or * for any), whose pages may call the HTTP APIs besides loopback origins (http://localhost:PORT, http://127.0.0.1:PORT, ...), which always may")
	fs.Int64Var(&c.ResponsesStoreBytes, "responses-store-bytes", c.ResponsesStoreBytes, "memory for the Responses API's stored responses (store true: GET /v1/responses/{id}, previous_response_id), the least recently used dropped first; 0 keeps none")
	fs.StringVar(&c.StateDir, "state-dir", c.StateDir, "directory for the device registry and models")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "json or console")
	fs.StringVar(&c.Prefer, "prefer", c.Prefer, "device preference: auto, cpu, gpu or tpu")
	fs.BoolVar(&c.AllowTPU, "allow-tpu", c.AllowTPU, "allow routing work to TPUs")
	fs.IntVar(&c.TPUBatchFactor, "tpu-batch-factor", c.TPUBatchFactor, "TPU max batch = base × factor (rounded to a power of two)")
	fs.IntVar(&c.GPUBatchFactor, "gpu-batch-factor", c.GPUBatchFactor, "GPU max batch = base × factor")
	fs.IntVar(&c.CPUBatchFactor, "cpu-batch-factor", c.CPUBatchFactor, "CPU max batch = base × factor")
	fs.StringVar(&c.MemoryStrategy, "memory-strategy", c.MemoryStrategy, "conservative (0.60), balanced (0.75), aggressive (0.90) or a fraction of device memory")
	fs.StringVar(&c.Costs, "costs", c.Costs, "device cost overrides in $/hour, e.g. gpu=0.9,tpu=3.1")
	fs.StringVar(&c.Sysfs, "sysfs", c.Sysfs, "sysfs root for detection")
	fs.StringVar(&c.Procfs, "procfs", c.Procfs, "procfs root for detection (and for a socket client's groups on kernels before 4.13)")
	fs.StringVar(&c.Devfs, "devfs", c.Devfs, "devfs root for detection")
	fs.StringVar(&c.NVMLLibrary, "nvml-library", c.NVMLLibrary, "path to libnvidia-ml.so.1 (default: the loader's search)")
	fs.StringVar(&c.PJRTPlugins, "pjrt-plugin", c.PJRTPlugins, "PJRT plugins as name=path pairs, e.g. tpu=/path/libtpu.so,cuda=/path/xla_cuda_plugin.so")
	fs.StringVar(&c.ComputeDType, "compute-dtype", c.ComputeDType, "compute type per device type as type=dtype pairs (f32 or bf16), e.g. gpu=bf16; types not named keep "+DefaultComputeDType+"; a device that cannot run bf16 falls back to f32 with a warning")
	fs.StringVar(&c.KVCacheDType, "kv-cache-dtype", c.KVCacheDType, "generators' KV cache type: auto (bf16 where the CPU keeps a GGUF model's matrices block-quantized or computes in bf16, f32 otherwise), f32, bf16, f16 (llama.cpp's and Ollama's default; bf16's memory), q8_0 or q4_0 (ggml's blocks, 17/32 and 9/32 of bf16's memory, q4_0 at a visible cost in accuracy); f16 and the blocks on the CPU only, other devices keep auto's)")
	fs.IntVar(&c.SpeculativeTokens, "speculative-tokens", c.SpeculativeTokens, "speculative decoding by prompt lookup: the most tokens a generator's decoding sequence guesses per step from its own prompt and output, verified in the same step (the same tokens as without, up to rounding at a near tie; helps one or few streams whose output quotes their input); 0: off")
	fs.IntVar(&c.SpeculativeMaxRunning, "speculative-max-running", c.SpeculativeMaxRunning, "a generator replica guesses tokens (speculative-tokens) only while it runs at most this many sequences: above, rejected guesses cost more compute than they save")
	fs.BoolVar(&c.CPUAMXRelaid, "cpu-amx-relaid", c.CPUAMXRelaid, "experimental: on a CPU with AMX, relay block-quantized GGUF weights by 16 rows for the VNNI kernels as on CPUs without it (prefill decodes AMX panels from them); for comparisons")
	fs.Var(&c.Telemetry, "telemetry-interval", "device telemetry refresh interval")
	fs.IntVar(&c.MaxMessageBytes, "max-message-bytes", c.MaxMessageBytes, "largest gRPC message accepted or sent")
	fs.Var(&c.ShutdownGrace, "shutdown-grace", "how long a stop waits for in-flight calls")
	fs.IntVar(&c.MaxItemsPerRequest, "max-items-per-request", c.MaxItemsPerRequest, "most items one Encode request may carry")
	fs.IntVar(&c.MaxItemBytes, "max-item-bytes", c.MaxItemBytes, "largest item accepted, in bytes")
	fs.IntVar(&c.MaxQueueItems, "max-queue-items", c.MaxQueueItems, "most items queued over all models; beyond it calls get RESOURCE_EXHAUSTED")
	fs.Var(&c.MaxQueueDelay, "max-queue-delay", "how long the oldest queued item may wait for its batch to fill once a device is free")
	fs.Var(&c.BatchTimeout, "batch-timeout", "longest one batch may run on a device; past it the batch's items are retried elsewhere or fail, and the device's replica is marked unhealthy")
	fs.IntVar(&c.MaxBatch, "max-batch", c.MaxBatch, "cap on every batch plan's max batch (0: the plan's own)")
	fs.IntVar(&c.MaxBatchTokens, "max-batch-tokens", c.MaxBatchTokens, "most tokens in one batch of a text model whose config sets no bound")
	fs.StringVar(&c.ModelRepo, "model-repo", c.ModelRepo, "model repository: DIR/NAME/VERSION/ (default <state-dir>/models)")
	fs.StringVar(&c.LoadModels, "load-models", c.LoadModels, "models to load at start: comma-separated names, or all")
	fs.StringVar(&c.OllamaModels, "ollama-models", c.OllamaModels, "Ollama's model store (the directory holding manifests/ and blobs/), served read-only under Ollama's names (qwen2.5:0.5b); off: none. Default: ~/.ollama/models when it exists")
	fs.Var(&c.AdminUIDs, "admin-uids", "users (uids or names) who may administer brokerd over the Unix socket (load, unload, cordon, drain), besides root and brokerd's own user")
	fs.Var(&c.AdminGroups, "admin-groups", "groups (gids or names) whose members may administer brokerd over the Unix socket; a caller's primary and supplementary groups count")
	fs.Var(&c.AdminIdentities, "admin-identities", "client certificate names that may administer brokerd over mutual TLS: uri:, dns:, email:, ip: (SANs) or cn: (subject CN), or a bare name matching any")
	fs.BoolVar(&c.Pprof, "pprof", c.Pprof, "serve Go's heap, goroutine, mutex and block profiles at /debug/pprof on the metrics listener (keep that listener private)")
}

// ErrHelp is returned when -h or --help was given; usage has been printed.
var ErrHelp = flag.ErrHelp

// InvalidError marks an error as a bad setting found after Load (one that
// needs the machine to judge, like an admin group that does not exist), so
// brokerd exits with the same code and one line as for the settings Load
// refuses.
type InvalidError struct{ Err error }

func (e *InvalidError) Error() string { return e.Err.Error() }
func (e *InvalidError) Unwrap() error { return e.Err }

// Invalid wraps err as an InvalidError (nil stays nil).
func Invalid(err error) error {
	if err == nil {
		return nil
	}
	return &InvalidError{Err: err}
}

// ErrVersion is returned when --version was given: the caller prints its
// version and exits.
var ErrVersion = errors.New("version requested")

// usageText lists every flag with its meaning, its environment variable and
// its default (the default for this process: the socket and state paths
// depend on the user).
func usageText(fs *flag.FlagSet) string {
	var b strings.Builder
	b.WriteString("usage: brokerd [flags]\n\nSettings come from flags, then environment variables, then the YAML file\nof --config, then the defaults shown.\n\nflags:\n")
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		if _, ok := f.Value.(*Duration); ok && name == "value" {
			name = "duration"
		}
		fmt.Fprintf(&b, "  --%s", f.Name)
		if name != "" {
			fmt.Fprintf(&b, " %s", strings.ToUpper(name))
		}
		fmt.Fprintf(&b, "\n      %s", usage)
		var notes []string
		if env := envNames[f.Name]; env != "" {
			if fb := fallbackEnvNames[f.Name]; fb != "" {
				env += ", else " + fb
			}
			notes = append(notes, "env "+env)
		}
		switch d := f.DefValue; {
		case d == "" || d == "0" || d == "0s" || d == "false":
			if f.Name != "version" && f.Name != "config" {
				notes = append(notes, "default off/empty")
			}
		default:
			notes = append(notes, "default "+d)
		}
		if len(notes) > 0 {
			fmt.Fprintf(&b, " (%s)", strings.Join(notes, "; "))
		}
		b.WriteString("\n")
	})
	return b.String()
}

// Load resolves the configuration from args (without the program name), the
// environment and the YAML file named by --config or BROKERD_CONFIG.
func Load(args []string, getenv func(string) string, euid int, usage io.Writer) (Config, error) {
	// First pass: learn which flags were given, and --config. It binds a
	// copy of the defaults, so -h shows them.
	scratch := Defaults(euid, getenv)
	var configPath string
	var version bool
	fs := flag.NewFlagSet("brokerd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	bind(fs, &scratch, &configPath)
	fs.BoolVar(&version, "version", false, "print brokerd's version (with Go's and oneDNN's) and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(usage, usageText(fs))
			return Config{}, err
		}
		return Config{}, fmt.Errorf("%w (brokerd -h lists the flags)", err)
	}
	if version {
		return Config{}, ErrVersion
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q: brokerd takes only flags", fs.Arg(0))
	}
	given := map[string]string{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = f.Value.String() })
	if configPath == "" {
		configPath = getenv(envNames["config"])
	}

	cfg := Defaults(euid, getenv)
	if configPath != "" {
		b, err := os.ReadFile(configPath)
		if err != nil {
			return Config{}, fmt.Errorf("config file: %w", err)
		}
		if err := yaml.UnmarshalStrict(b, &cfg); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", configPath, yamlError(err))
		}
	}

	// Second pass: environment, then the flags that were given, over cfg.
	var ignored string
	set := flag.NewFlagSet("brokerd", flag.ContinueOnError)
	set.SetOutput(io.Discard)
	bind(set, &cfg, &ignored)
	var errs []error
	set.VisitAll(func(f *flag.Flag) {
		env := envNames[f.Name]
		if env == "" || f.Name == "config" {
			return
		}
		if v := getenv(env); v != "" {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", env, v, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	for name, v := range given {
		if name == "config" {
			continue
		}
		if err := set.Set(name, v); err != nil {
			return Config{}, fmt.Errorf("--%s=%q: %w", name, v, err)
		}
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// Validate checks every setting and names the bad one with its allowed values.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	switch c.Prefer {
	case "auto", "cpu", "gpu", "tpu":
	default:
		bad("prefer (COMPUTE_PREFER) %q is invalid: allowed values are auto, cpu, gpu, tpu", c.Prefer)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"tpu-batch-factor (COMPUTE_TPU_BATCH_FACTOR)", c.TPUBatchFactor}, {"gpu-batch-factor (COMPUTE_GPU_BATCH_FACTOR)", c.GPUBatchFactor}, {"cpu-batch-factor (COMPUTE_CPU_BATCH_FACTOR)", c.CPUBatchFactor}} {
		if f.v < 1 || f.v > 4096 {
			bad("%s %d is invalid: allowed values are 1 to 4096", f.name, f.v)
		}
	}
	if _, err := MemoryFraction(c.MemoryStrategy); err != nil {
		bad("memory-strategy: %v", err)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log-level %q is invalid: allowed values are debug, info, warn, error", c.LogLevel)
	}
	switch c.LogFormat {
	case "json", "console":
	default:
		bad("log-format %q is invalid: allowed values are json, console", c.LogFormat)
	}
	if c.Socket == "" && c.Listen == "" {
		bad("socket: both --socket and --listen are empty: brokerd needs somewhere to listen")
	}
	if c.Listen != "" {
		if err := checkTCP(c); err != nil {
			errs = append(errs, err)
		}
	}
	if c.HTTPListen != "" {
		host, _, err := net.SplitHostPort(c.HTTPListen)
		switch {
		case err != nil:
			bad("http-listen %q is invalid: want HOST:PORT", c.HTTPListen)
		case c.TLSCert == "" && !IsLoopback(host):
			bad("http-listen %s: plaintext HTTP is allowed only on a loopback address; give --tls-cert and --tls-key to serve it elsewhere", c.HTTPListen)
		}
	}
	if err := c.CheckHTTPAccess(); err != nil {
		errs = append(errs, err)
	}
	for _, o := range c.HTTPCORSOrigins {
		if err := CheckOrigin(o); err != nil {
			errs = append(errs, err)
		}
	}
	if c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			bad("metrics-listen %q is invalid: want HOST:PORT", c.MetricsListen)
		}
	}
	if c.HealthListen != "" {
		if _, _, err := net.SplitHostPort(c.HealthListen); err != nil {
			bad("health-listen %q is invalid: want HOST:PORT", c.HealthListen)
		}
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		bad("tls-cert and tls-key must be given together")
	}
	if c.TLSClientCA != "" && c.TLSCert == "" {
		bad("tls-client-ca needs tls-cert and tls-key")
	}
	if c.StateDir == "" {
		bad("state-dir must not be empty")
	}
	if c.Telemetry < Duration(100*time.Millisecond) {
		bad("telemetry-interval %s is invalid: at least 100ms", time.Duration(c.Telemetry))
	}
	if c.MaxMessageBytes < 1<<20 || c.MaxMessageBytes > 2<<30-1 {
		bad("max-message-bytes %d is invalid: allowed values are 1 MiB to 2 GiB", c.MaxMessageBytes)
	}
	if c.MaxItemsPerRequest < 1 {
		bad("max-items-per-request %d is invalid: at least 1", c.MaxItemsPerRequest)
	}
	if c.MaxItemBytes < 1 || c.MaxItemBytes > c.MaxMessageBytes {
		bad("max-item-bytes %d is invalid: 1 to max-message-bytes (%d)", c.MaxItemBytes, c.MaxMessageBytes)
	}
	if c.MaxQueueItems < 1 {
		bad("max-queue-items %d is invalid: at least 1", c.MaxQueueItems)
	}
	if c.MaxQueueDelay < 0 {
		bad("max-queue-delay must not be negative")
	}
	if c.MaxConnections < 0 || c.MaxConnectionsPerClient < 0 {
		bad("max-connections %d and max-connections-per-client %d must not be negative (0: derived)", c.MaxConnections, c.MaxConnectionsPerClient)
	}
	if c.MaxContext < 16 || c.MaxContext > 1<<20 {
		bad("max-context %d is invalid: 16 to %d tokens", c.MaxContext, 1<<20)
	}
	if c.ResponsesStoreBytes < 0 {
		bad("responses-store-bytes %d must not be negative (0 keeps no responses)", c.ResponsesStoreBytes)
	}
	if c.MaxInflightBytes < 0 || c.GoMemoryLimit < -1 {
		bad("max-inflight-bytes %d must not be negative, go-memory-limit %d must be -1 (none), 0 (derived) or bytes", c.MaxInflightBytes, c.GoMemoryLimit)
	}
	if c.HTTPBodyTimeout <= 0 {
		bad("http-body-timeout %v is invalid: more than 0", time.Duration(c.HTTPBodyTimeout))
	}
	if c.MaxConcurrentStreams < 1 || c.MaxConcurrentStreams > 1<<20 {
		bad("max-concurrent-streams %d is invalid: 1 to %d", c.MaxConcurrentStreams, 1<<20)
	}
	if c.MaxConnectionIdle <= 0 {
		bad("max-connection-idle %v is invalid: more than 0", time.Duration(c.MaxConnectionIdle))
	}
	if c.BatchTimeout <= 0 {
		bad("batch-timeout %v is invalid: more than 0", time.Duration(c.BatchTimeout))
	}
	if c.MaxBatch < 0 {
		bad("max-batch %d is invalid: 0 (the plan's own) or more", c.MaxBatch)
	}
	if c.MaxBatchTokens < 1 {
		bad("max-batch-tokens %d is invalid: at least 1", c.MaxBatchTokens)
	}
	if !slices.Contains(KVCacheDTypes, c.KVCacheDType) {
		bad("kv-cache-dtype (BROKERD_KV_CACHE_DTYPE, else OLLAMA_KV_CACHE_TYPE): %q: want auto, f32, bf16, f16, q8_0 or q4_0", c.KVCacheDType)
	}
	if c.SpeculativeTokens < 0 || c.SpeculativeTokens > MaxSpeculativeTokens {
		bad("speculative-tokens (BROKERD_SPECULATIVE_TOKENS) %d is invalid: 0 (off) to %d", c.SpeculativeTokens, MaxSpeculativeTokens)
	}
	if c.SpeculativeMaxRunning < 1 || c.SpeculativeMaxRunning > MaxSpeculativeMaxRunning {
		bad("speculative-max-running (BROKERD_SPECULATIVE_MAX_RUNNING) %d is invalid: 1 to %d sequences", c.SpeculativeMaxRunning, MaxSpeculativeMaxRunning)
	}
	if _, err := ComputeDTypes(c.ComputeDType); err != nil {
		bad("compute-dtype (BROKERD_COMPUTE_DTYPE): %v", err)
	}
	if c.LoadModels != "" && c.LoadModels != "all" {
		for _, n := range strings.Split(c.LoadModels, ",") {
			if n = strings.TrimSpace(n); n == "" || strings.ContainsAny(n, `/\@`) || n == "." || n == ".." {
				bad("load-models %q is invalid: want all, or model names separated by commas", c.LoadModels)
				break
			}
		}
	}
	if c.ShutdownGrace < 0 {
		bad("shutdown-grace must not be negative")
	}
	if d := c.OllamaModels; d != "" && d != OllamaModelsOff && (strings.ContainsRune(d, 0) || strings.TrimSpace(d) == "") {
		bad("ollama-models (OLLAMA_MODELS) %q is invalid: want Ollama's model directory (holding manifests/ and blobs/), or off", d)
	}
	errs = append(errs, c.validateAdmins()...)
	return errors.Join(errs...)
}

// CheckHTTPAccess refuses an HTTP listener that would be open to whoever
// reaches it without saying so. The HTTP APIs reach the data plane, which on
// the socket only its owner and group may use: served without API keys on
// loopback, they would give every local user what the socket's 0660 mode
// refuses. So --http-listen needs --api-keys-file, or
// --http-allow-unauthenticated to say that everyone who can reach the
// address may use it (SECURITY.md, "Who can reach brokerd").
func (c Config) CheckHTTPAccess() error {
	switch {
	case c.HTTPListen == "":
		return nil
	case c.APIKeysFile != "" && c.HTTPAllowUnauthenticated:
		return fmt.Errorf("http-listen %s: api-keys-file and http-allow-unauthenticated contradict each other: give one (keys, or no keys for everyone who can reach the address)", c.HTTPListen)
	case c.APIKeysFile == "" && !c.HTTPAllowUnauthenticated:
		return fmt.Errorf("http-listen %s without api-keys-file would let every user who can reach that address use the data plane (on loopback: every local user, whatever the socket's permissions): give --api-keys-file FILE (BROKERD_API_KEYS_FILE) to require keys, or --http-allow-unauthenticated (BROKERD_HTTP_ALLOW_UNAUTHENTICATED) to allow that", c.HTTPListen)
	}
	return nil
}

// yamlError says what is wrong with a settings file in its own terms (the
// setting's name, what it wants, the line) instead of the YAML library's,
// which reports everything as "error unmarshaling JSON".
func yamlError(err error) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) && typeErr.Field != "" {
		return fmt.Errorf("setting %s: want %s, got %s", typeErr.Field, kindName(typeErr.Type.Kind().String()), article(typeErr.Value))
	}
	var synErr *json.SyntaxError
	if errors.As(err, &synErr) {
		return fmt.Errorf("not valid YAML: %v", synErr)
	}
	msg := err.Error()
	if _, name, ok := strings.Cut(msg, `unknown field "`); ok {
		name = strings.TrimSuffix(name, `"`)
		return fmt.Errorf("unknown setting %q (brokerd -h lists the settings; a file uses the flag names as keys)", name)
	}
	for _, prefix := range []string{"error converting YAML to JSON: ", "error unmarshaling JSON: ", "while decoding JSON: ", "yaml: ", "json: "} {
		msg = strings.TrimPrefix(msg, prefix)
	}
	return errors.New(msg)
}

// kindName describes a Go kind the way a settings file would see it.
func kindName(kind string) string {
	switch {
	case strings.HasPrefix(kind, "int"), strings.HasPrefix(kind, "uint"):
		return "an integer"
	case strings.HasPrefix(kind, "float"):
		return "a number"
	case kind == "bool":
		return "true or false"
	case kind == "string":
		return "a string"
	case kind == "slice":
		return "a list"
	}
	return "a " + kind
}

func article(jsonType string) string {
	if jsonType == "" {
		return "something else"
	}
	if strings.ContainsRune("aeiou", rune(jsonType[0])) {
		return "an " + jsonType
	}
	return "a " + jsonType
}

// checkTCP enforces: TCP without TLS only with --insecure-tcp, and then only
// on a loopback address.
func checkTCP(c Config) error {
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return fmt.Errorf("listen %q is invalid: want HOST:PORT", c.Listen)
	}
	if c.TLSCert != "" {
		return nil
	}
	if !c.InsecureTCP {
		return fmt.Errorf("listen %s: TCP without TLS is refused; give --tls-cert and --tls-key, or --insecure-tcp on a loopback address", c.Listen)
	}
	if !IsLoopback(host) {
		return fmt.Errorf("listen %s: --insecure-tcp is allowed only on a loopback address (127.0.0.1, ::1, localhost)", c.Listen)
	}
	return nil
}

// CheckOrigin accepts a --http-cors-origins entry: "*", or an origin as
// browsers send it (scheme://host[:port], no path).
func CheckOrigin(o string) error {
	if o == "*" {
		return nil
	}
	u, err := url.Parse(o)
	if err != nil || u.Scheme == "" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return fmt.Errorf("http-cors-origins %q is invalid: want an origin as browsers send it, SCHEME://HOST[:PORT] (e.g. https://app.example.com), or * for any", o)
	}
	return nil
}

// IsLoopback reports whether host is a loopback name or address.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// MemoryFraction resolves a memory strategy name or fraction.
func MemoryFraction(s string) (float64, error) {
	switch s {
	case "conservative":
		return 0.60, nil
	case "balanced", "":
		return 0.75, nil
	case "aggressive":
		return 0.90, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 || f > 1 {
		return 0, fmt.Errorf("%q is invalid: allowed values are conservative, balanced, aggressive, or a fraction in (0, 1]", s)
	}
	return f, nil
}

// The bounds of speculative-tokens and speculative-max-running (an engine
// verifies at most their product of guessed tokens a step, each a logits
// row of its step's workspace), and the latter's default
// (scheduler.DefaultSpecMaxRunning; config does not import the scheduler).
const (
	MaxSpeculativeTokens         = 16
	MaxSpeculativeMaxRunning     = 1024
	DefaultSpeculativeMaxRunning = 4
)

// KVCacheDTypes are the values kv-cache-dtype takes: auto (each engine's
// choice: bf16 where a device keeps the weights block-quantized or
// computes in bf16, else f32), f32, bf16, f16 (Ollama's
// OLLAMA_KV_CACHE_TYPE default) and q8_0 and q4_0 (ggml's blocks: 17/32 and
// 9/32 of bf16's memory, as OLLAMA_KV_CACHE_TYPE=q8_0 and q4_0); f16 and
// the blocks on the CPU only, other devices keep auto's.
var KVCacheDTypes = []string{"auto", "f32", "bf16", "f16", "q8_0", "q4_0"}

// DefaultComputeDType is the compute type of each device type unless
// compute-dtype names it. CPUs compute in f32: most lack bf16 instructions
// (oneDNN then has no bf16 kernel) and f32 is exact to the checkpoint. GPUs
// too, so results match the CPU's to fp32 accuracy unless asked otherwise.
// TPUs compute in bf16, the type their matrix units work in and what XLA
// users expect there.
const DefaultComputeDType = "cpu=f32,gpu=f32,tpu=bf16"

// computeTypes and computeDTypes are what compute-dtype accepts.
var (
	computeTypes  = []string{"cpu", "gpu", "tpu"}
	computeDTypes = []string{"f32", "bf16"}
)

// ComputeDTypes parses compute-dtype: comma-separated type=dtype pairs
// (types cpu, gpu, tpu; dtypes f32, bf16), each type at most once. It
// returns every type's dtype, DefaultComputeDType's for the types s does
// not name; an empty s gives the defaults.
func ComputeDTypes(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, pair := range strings.Split(DefaultComputeDType, ",") {
		t, dt, _ := strings.Cut(pair, "=")
		out[t] = dt
	}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	seen := map[string]bool{}
	for _, entry := range strings.Split(s, ",") {
		t, dt, ok := strings.Cut(entry, "=")
		t, dt = strings.ToLower(strings.TrimSpace(t)), strings.ToLower(strings.TrimSpace(dt))
		switch {
		case !ok:
			return nil, fmt.Errorf("%q is invalid: entry %q is not type=dtype (e.g. gpu=bf16,tpu=bf16)", s, strings.TrimSpace(entry))
		case !slices.Contains(computeTypes, t):
			return nil, fmt.Errorf("%q is invalid: device type %q: allowed types are %s", s, t, strings.Join(computeTypes, ", "))
		case !slices.Contains(computeDTypes, dt):
			return nil, fmt.Errorf("%q is invalid: %s=%q: allowed dtypes are %s", s, t, dt, strings.Join(computeDTypes, ", "))
		case seen[t]:
			return nil, fmt.Errorf("%q is invalid: device type %s given twice", s, t)
		}
		seen[t] = true
		out[t] = dt
	}
	return out, nil
}

// OllamaModelsDir is Ollama's model store to serve, "" for none
// (--ollama-models off or empty, or no ~/.ollama/models by default). Its
// existence is checked where it is opened (runtime/models/ollama.Open).
func (c Config) OllamaModelsDir() string {
	if c.OllamaModels == OllamaModelsOff {
		return ""
	}
	return c.OllamaModels
}

// ModelRepoDir is the model repository: --model-repo, or <state-dir>/models.
func (c Config) ModelRepoDir() string {
	if c.ModelRepo != "" {
		return c.ModelRepo
	}
	return filepath.Join(c.StateDir, "models")
}
