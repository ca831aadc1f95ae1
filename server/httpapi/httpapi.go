// Package httpapi serves brokerd's HTTP edge: the Ollama API (/api/...) and
// the OpenAI API (/v1/...), so applications written for either change only
// their base URL.
//
// It is a translation, not a second implementation: every endpoint calls
// the broker.v1 service in process (Encode, ListModels, and generation's
// transport-neutral RunGenerate and RunChat), so validation, limits,
// scheduling and metrics are those of gRPC; errors keep their gRPC status
// and take their HTTP code from the error table that made it
// (server/internal/errtable: a full queue is 429 with Retry-After, a
// draining brokerd 503).
package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/server/internal/errtable"
)

// Backend is the part of broker.v1 the HTTP APIs translate onto (the
// server's BrokerService). Generation is its transport-neutral API:
// RunGenerate and RunChat hand send each response's deltas and results
// as they are ready, and stop the call's sequences when ctx ends (a
// client that disconnects).
type Backend interface {
	Encode(ctx context.Context, req *brokerv1.EncodeRequest) (*brokerv1.EncodeResponse, error)
	RunGenerate(ctx context.Context, req *brokerv1.GenerateRequest, send func([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult) error) error
	RunChat(ctx context.Context, req *brokerv1.ChatRequest, send func([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult) error) error
	ListModels(ctx context.Context, req *brokerv1.ListModelsRequest) (*brokerv1.ListModelsResponse, error)
	Tokenize(ctx context.Context, req *brokerv1.TokenizeRequest) (*brokerv1.TokenizeResponse, error)
	Detokenize(ctx context.Context, req *brokerv1.DetokenizeRequest) (*brokerv1.DetokenizeResponse, error)
}

// Options configure the handler.
type Options struct {
	// APIKeys, when not empty, are the bearer tokens a request must carry
	// (Authorization: Bearer KEY); others get 401.
	APIKeys []string
	// Version is reported by /api/version.
	Version string
	// MaxBodyBytes bounds a request body (the gRPC message limit).
	MaxBodyBytes int64
	Registerer   prometheus.Registerer
	// Admit, when set, charges a request's bytes to the daemon's in-flight
	// budget (the gRPC interceptors' own) until it is answered: its
	// overhead when it arrives, then twice the bytes of its body as they
	// are read, never what it only declares. Its error is answered as is
	// (429 with Retry-After when the budget is full).
	Admit func(route string, n int64) (release func(), err error)
	// BodyTimeout bounds the time a request's body may take to arrive
	// (0: a minute); a body still arriving then is answered 408 and its
	// connection closed.
	BodyTimeout time.Duration
	// WriteTimeout bounds each write of a response (0: a minute): a client
	// that takes none of it for that long loses its connection, and its
	// call ends.
	WriteTimeout time.Duration
	Logger       *zap.Logger
	// Now is the clock of created_at and created fields (tests fix it).
	Now func() time.Time
	// CORSOrigins are the browser origins ("*": any) that may call the
	// APIs besides loopback ones and the API's own (--http-cors-origins).
	CORSOrigins []string
	// ResponseStoreBytes bounds the Responses API's stored responses
	// (--responses-store-bytes; 0: none are kept).
	ResponseStoreBytes int64
}

// Handler is the HTTP edge.
type Handler struct {
	b     Backend
	opts  Options
	store *responseStore
	mux   *http.ServeMux
	log   *zap.Logger
	reqs  *prometheus.CounterVec
	dur   *prometheus.HistogramVec
}

// New returns the handler of the Ollama and OpenAI routes.
func New(b Backend, opts Options) *Handler {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 64 << 20
	}
	if opts.BodyTimeout <= 0 {
		opts.BodyTimeout = time.Minute
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = time.Minute
	}
	h := &Handler{b: b, opts: opts, mux: http.NewServeMux(), log: opts.Logger.Named("http"), store: newResponseStore(opts.ResponseStoreBytes)}
	h.reqs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "brokerd", Subsystem: "http", Name: "requests_total",
		Help: "HTTP API requests by route and status code.",
	}, []string{"route", "code"})
	h.dur = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "brokerd", Subsystem: "http", Name: "request_seconds",
		Help: "Time to answer an HTTP API request (streams: until their end), by route.", Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
	}, []string{"route"})
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(h.reqs, h.dur)
		opts.Registerer.MustRegister(h.store.collectors()...)
	}
	routes := map[string]http.HandlerFunc{
		"POST /api/generate":                 h.ollamaGenerate,
		"POST /api/chat":                     h.ollamaChat,
		"POST /api/embed":                    h.ollamaEmbed,
		"POST /api/embeddings":               h.ollamaEmbeddings,
		"GET /api/tags":                      h.ollamaTags,
		"POST /api/show":                     h.ollamaShow,
		"GET /api/ps":                        h.ollamaPS,
		"GET /api/version":                   h.ollamaVersion,
		"POST /v1/chat/completions":          h.openaiChat,
		"POST /v1/completions":               h.openaiCompletions,
		"POST /v1/embeddings":                h.openaiEmbeddings,
		"GET /v1/models":                     h.openaiModels,
		"GET /v1/models/{model...}":          h.openaiModelByID,
		"POST /v1/responses":                 h.openaiResponses,
		"GET /v1/responses/{id}":             h.getResponse,
		"DELETE /v1/responses/{id}":          h.deleteResponse,
		"POST /v1/responses/{id}/cancel":     h.cancelResponse,
		"GET /v1/responses/{id}/input_items": h.responseInputItems,
		"POST /v1/responses/input_tokens":    h.responseInputTokens,
		"POST /tokenize":                     h.vllmTokenize,
		"POST /detokenize":                   h.vllmDetokenize,
	}
	patterns := make([]string, 0, len(routes))
	for pattern, fn := range routes {
		route := pattern
		patterns = append(patterns, pattern)
		h.mux.Handle(pattern, h.instrument(route, fn))
	}
	// Ollama's store routes, whatever the method, say what to do instead;
	// a path no route serves is answered in the API's error shape.
	for path, msg := range ollamaUnsupported {
		h.mux.Handle(path, h.instrument(strings.TrimSuffix(path, "/"), h.unsupportedRoute(msg)))
	}
	h.mux.Handle("/", h.instrument("unmatched", h.notFound(routeMethods(patterns))))
	// Ollama answers its root with a liveness line that clients probe.
	h.mux.Handle("GET /{$}", h.instrument("GET /", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "brokerd is running")
	}))
	return h
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w = newPacedWriter(w, h.opts.WriteTimeout)
	if h.cors(w, r) {
		return
	}
	h.mux.ServeHTTP(w, r)
}

// pacedWriter gives each write of a response its own deadline, so a client
// that keeps its connection open and reads nothing cannot hold its call
// (the model's gate, its in-flight bytes) forever: the write fails, which
// cancels the request's context. The server has no WriteTimeout, which
// would cut a long stream that is being read (net/http clears the deadline
// after each request).
type pacedWriter struct {
	http.ResponseWriter
	ctl     *http.ResponseController
	timeout time.Duration
}

func newPacedWriter(w http.ResponseWriter, timeout time.Duration) *pacedWriter {
	p := &pacedWriter{ResponseWriter: w, ctl: http.NewResponseController(w), timeout: timeout}
	p.extend()
	return p
}

func (p *pacedWriter) extend() { _ = p.ctl.SetWriteDeadline(time.Now().Add(p.timeout)) }

func (p *pacedWriter) WriteHeader(code int) {
	p.extend()
	p.ResponseWriter.WriteHeader(code)
}

func (p *pacedWriter) Write(b []byte) (int, error) {
	p.extend()
	return p.ResponseWriter.Write(b)
}

func (p *pacedWriter) Flush() { _ = p.FlushError() }

// FlushError is what http.ResponseController.Flush calls.
func (p *pacedWriter) FlushError() error {
	p.extend()
	return p.ctl.Flush()
}

func (p *pacedWriter) Unwrap() http.ResponseWriter { return p.ResponseWriter }

// statusWriter records the status code for the metrics.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// requestOverhead is what a request is charged besides its body, as the
// gRPC edge charges a call.
const requestOverhead = 4 << 10

// chargeStep is how many bytes of a body may be read before they are
// charged to the in-flight budget (twice, for the decoded request and what
// is built from it): charges come after the bytes, never before, and a
// body is refused once what it has read does not fit.
const chargeStep = 4 << 10

// instrument checks the API key, bounds the body in size and time, charges
// it to the in-flight budget as it is read, and records metrics.
func (h *Handler) instrument(route string, fn http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			code := sw.code
			if code == 0 {
				code = http.StatusOK
			}
			h.reqs.WithLabelValues(route, strconv.Itoa(code)).Inc()
			h.dur.WithLabelValues(route).Observe(time.Since(start).Seconds())
		}()
		var body *meteredBody
		if r.Body != nil && r.Body != http.NoBody {
			// The deadline holds from here, whatever answers the request:
			// a body left unread is read (and dropped) after the answer
			// while the connection is kept.
			body = &meteredBody{src: http.MaxBytesReader(sw, r.Body, h.opts.MaxBodyBytes), ctl: http.NewResponseController(w),
				route: route, admit: h.opts.Admit, timeout: h.opts.BodyTimeout}
			body.setDeadline(time.Now().Add(h.opts.BodyTimeout))
			defer body.release()
			r.Body = body
		}
		if r.ContentLength > h.opts.MaxBodyBytes {
			// Refused before a byte of it is read: this costs nothing.
			h.fail(sw, r, &httpError{code: http.StatusRequestEntityTooLarge, err: status.Errorf(codes.InvalidArgument,
				"the request body of %d bytes is larger than %d bytes (--max-message-bytes)", r.ContentLength, h.opts.MaxBodyBytes)})
			return
		}
		client, ok := h.authorized(r)
		if !ok {
			sw.Header().Set("WWW-Authenticate", `Bearer realm="brokerd"`)
			h.fail(sw, r, status.Error(codes.Unauthenticated, "a valid API key is required: Authorization: Bearer KEY"))
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), clientKey{}, client))
		if h.opts.Admit != nil {
			release, err := h.opts.Admit(route, requestOverhead)
			if err != nil {
				h.fail(sw, r, err)
				return
			}
			defer release()
		}
		fn(sw, r)
	})
}

// meteredBody is a request body charged to the in-flight budget as it is
// read, and read within a deadline.
type meteredBody struct {
	src     io.ReadCloser // the size-bounded body
	ctl     *http.ResponseController
	route   string
	admit   func(route string, n int64) (release func(), err error)
	timeout time.Duration

	read     int64 // bytes read
	unpaid   int64 // bytes read and not yet charged
	releases []func()
	err      error // a refusal of the budget, returned from then on
}

func (b *meteredBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.src.Read(p)
	b.read += int64(n)
	b.unpaid += int64(n)
	if b.admit != nil && b.unpaid > 0 && (b.unpaid >= chargeStep || err != nil) {
		release, aerr := b.admit(b.route, 2*b.unpaid)
		if aerr != nil {
			b.err = aerr
			return 0, aerr
		}
		b.releases = append(b.releases, release)
		b.unpaid = 0
	}
	switch {
	case errors.Is(err, io.EOF):
		// Read whole: the rest of the call (a stream, maybe) has no
		// deadline, and the server's watch for a client that leaves
		// must not see one.
		b.setDeadline(time.Time{})
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = &httpError{code: http.StatusRequestTimeout, err: status.Errorf(codes.DeadlineExceeded,
			"the request body did not arrive within %v (--http-body-timeout): %d bytes came", b.timeout, b.read)}
	}
	return n, err
}

func (b *meteredBody) Close() error { return b.src.Close() }

// setDeadline sets the connection's read deadline (zero: none), where the
// ResponseWriter can.
func (b *meteredBody) setDeadline(t time.Time) {
	_ = b.ctl.SetReadDeadline(t) // http.ErrNotSupported: a writer without a connection (tests)
}

// release gives back what the body was charged.
func (b *meteredBody) release() {
	for _, r := range b.releases {
		r()
	}
	b.releases = nil
}

// httpError is answered with its own HTTP code (the status's message and
// gRPC code in the body).
type httpError struct {
	code int
	err  error
	// param and oaCode, when set, are OpenAI's error param and code.
	param, oaCode string
}

func (e *httpError) Error() string              { return e.err.Error() }
func (e *httpError) GRPCStatus() *status.Status { return status.Convert(e.err) }

func (h *Handler) authorized(r *http.Request) (client string, ok bool) {
	if len(h.opts.APIKeys) == 0 {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			host = r.RemoteAddr
		}
		return "ip:" + host, true
	}
	// The scheme is case-insensitive (RFC 7235 section 2.1): "bearer KEY"
	// is the same credential as "Bearer KEY".
	scheme, key, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	key = strings.TrimLeft(key, " ")
	for _, k := range h.opts.APIKeys {
		if subtle.ConstantTimeCompare([]byte(k), []byte(key)) == 1 {
			sum := sha256.Sum256([]byte(k))
			return "key:" + hex.EncodeToString(sum[:6]), true
		}
	}
	return "", false
}

// clientKey is the context key of the caller's name (ClientFrom).
type clientKey struct{}

// ClientFrom names an HTTP API caller for fairness between clients: its
// API key ("key:" and a hash of it: the apps behind one address are as
// many clients as keys) or, without keys, its address ("ip:HOST", as a
// TCP gRPC caller). ok is false outside an HTTP API request.
func ClientFrom(ctx context.Context) (client string, ok bool) {
	client, ok = ctx.Value(clientKey{}).(string)
	return client, ok
}

// limitKey marks a call whose max_tokens is a limit rather than a demand
// (MaxTokensIsLimit).
type limitKey struct{}

// MaxTokensIsLimit says a call's max_tokens past the room its prompt
// leaves in the context ends the output at the context's end instead of
// refusing the call: Ollama's num_predict, which Ollama's runners bound
// by the context, where OpenAI and vLLM answer 400.
func MaxTokensIsLimit(ctx context.Context) bool {
	v, _ := ctx.Value(limitKey{}).(bool)
	return v
}

func withMaxTokensLimit(ctx context.Context) context.Context {
	return context.WithValue(ctx, limitKey{}, true)
}

// decode reads a JSON body into v; a bad body is INVALID_ARGUMENT, one
// the in-flight budget refuses or that is too slow to arrive keeps its
// own error. What decoding will build is charged before it is built
// (decodedCost).
func decode(r *http.Request, v any) error {
	body, err := io.ReadAll(r.Body)
	if err == nil {
		err = chargeDecoding(r, decodedCost(body))
	}
	if err == nil {
		// As json.Decoder reads a body: the first value, whatever follows.
		err = json.NewDecoder(bytes.NewReader(body)).Decode(v)
	}
	if err != nil {
		var tooBig *http.MaxBytesError
		var he *httpError
		if errors.As(err, &tooBig) {
			return status.Errorf(codes.InvalidArgument, "the request body is larger than %d bytes", tooBig.Limit)
		}
		if errors.As(err, &he) {
			return he
		}
		if _, ok := status.FromError(err); ok {
			return err
		}
		return status.Errorf(codes.InvalidArgument, "the request body is not valid JSON for this endpoint: %v", err)
	}
	return nil
}

// Decoded JSON costs more than its bytes: each object becomes a Go struct
// or map, each element a slot of a slice grown by appends. A body of `{},`
// in a messages array builds some 250 bytes per byte sent. The body paid
// twice its bytes as it came (meteredBody); what its structure will build
// is charged too, counted before anything is decoded.
const (
	// jsonCompositeCost is an object or array: the largest struct a
	// request's arrays hold (a chat message), allocated and in its slot.
	jsonCompositeCost = 1 << 10
	// jsonValueCost is any element or member: its slot or map entry and a
	// string's header, with the slack of growing.
	jsonValueCost = 96
)

// decodedCost is what decoding body builds besides its bytes. Strings are
// skipped whole (escapes honoured); a body that is not JSON costs what
// its brackets and commas would, and then fails to decode.
func decodedCost(body []byte) int64 {
	var composites, values int64
	in, esc := false, false
	for _, c := range body {
		switch {
		case in:
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				in = false
			}
		case c == '"':
			in = true
		case c == '{' || c == '[':
			composites++
			values++ // its first element, if any
		case c == ',':
			values++
		}
	}
	return composites*jsonCompositeCost + values*jsonValueCost
}

// chargeDecoding charges n bytes to the in-flight budget until the request
// is answered, with its body's charges.
func chargeDecoding(r *http.Request, n int64) error {
	b, ok := r.Body.(*meteredBody)
	if !ok || b.admit == nil || n == 0 {
		return nil
	}
	release, err := b.admit(b.route, n)
	if err != nil {
		return err
	}
	b.releases = append(b.releases, release)
	return nil
}

// retryAfter is a RESOURCE_EXHAUSTED status's RetryInfo delay in whole
// seconds (at least 1), or 0.
func retryAfter(st *status.Status) int {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return max(1, int(math.Ceil(ri.GetRetryDelay().AsDuration().Seconds())))
		}
	}
	return 0
}

// fail answers err in the shape of the route's API (OpenAI's error object
// under /v1, Ollama's {"error": ...} elsewhere).
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	st := status.Convert(err)
	code := errtable.HTTPStatus(st.Code())
	if he := (*httpError)(nil); errors.As(err, &he) && he.code != 0 {
		code = he.code
	}
	if code == http.StatusInternalServerError {
		h.log.Error("internal error", zap.String("path", r.URL.Path), zap.Error(err))
	}
	if s := retryAfter(st); s > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(s))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	var body any = map[string]string{"error": st.Message()}
	if strings.HasPrefix(r.URL.Path, "/v1/") {
		body = map[string]any{"error": openaiError{Message: st.Message(), Type: openaiErrorType(code), Param: openaiParam(err), Code: openaiCode(err, st)}}
	}
	_ = json.NewEncoder(w).Encode(body)
}

// writeJSON answers v with 200.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// modelName resolves an Ollama-style name: "name:latest" is the
// repository's "name"; another tag names another model (an Ollama store's
// qwen2.5:0.5b is served as qwen2.5:0.5b).
func modelName(s string) string {
	return strings.TrimSuffix(s, ":latest")
}

// event is one prompt's delta or result, in the order the stream gave them.
type event struct {
	delta  *brokerv1.GenerationDelta
	result *brokerv1.GenerationResult
}

// generate runs Generate and calls on for each delta and result.
func (h *Handler) generate(ctx context.Context, req *brokerv1.GenerateRequest, on func(event) error) error {
	return h.b.RunGenerate(ctx, req, forward(on))
}

// chat runs Chat and calls on for each delta and result.
func (h *Handler) chat(ctx context.Context, req *brokerv1.ChatRequest, on func(event) error) error {
	return h.b.RunChat(ctx, req, forward(on))
}

// forward hands on a response's deltas, then its results.
func forward(on func(event) error) func([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult) error {
	return func(ds []*brokerv1.GenerationDelta, rs []*brokerv1.GenerationResult) error {
		for _, d := range ds {
			if err := on(event{delta: d}); err != nil {
				return err
			}
		}
		for _, r := range rs {
			if err := on(event{result: r}); err != nil {
				return err
			}
		}
		return nil
	}
}

// finishName is a FinishReason as both APIs spell it. (A cancelled
// sequence ends its call with an error, never with a result.)
func finishName(f brokerv1.FinishReason) string {
	switch f {
	case brokerv1.FinishReason_FINISH_REASON_STOP:
		return "stop"
	case brokerv1.FinishReason_FINISH_REASON_LENGTH:
		return "length"
	case brokerv1.FinishReason_FINISH_REASON_DEADLINE:
		return "deadline"
	case brokerv1.FinishReason_FINISH_REASON_CONSTRAINT:
		// The structured-output constraint could not continue.
		return "constraint"
	}
	return "stop"
}
