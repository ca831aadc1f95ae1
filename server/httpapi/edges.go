package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The edges of the two APIs: routes brokerd does not serve, OpenAI's error
// codes, the model kinds each route serves, the version, keep_alive and
// CORS.

// ollamaUnsupported are the Ollama routes that manage a model store, which
// brokerd does not: each says what to do instead.
var ollamaUnsupported = map[string]string{
	"/api/pull": "brokerd does not download models: put the model in brokerd's repository (--model-repo) " +
		"or pull it into Ollama's store with `ollama pull NAME` (brokerd reads it, --ollama-models), then `brokerctl load NAME`",
	"/api/push": "brokerd does not push models to a registry: push from Ollama's store with `ollama push NAME`",
	"/api/create": "brokerd does not create models from a Modelfile: create it with `ollama create NAME` (into Ollama's store, which brokerd reads) " +
		"or put its files in brokerd's repository (--model-repo), then `brokerctl load NAME`",
	"/api/copy": "brokerd does not copy models: copy it with `ollama cp SRC DST` or copy its directory in brokerd's repository (--model-repo), then `brokerctl load DST`",
	"/api/delete": "brokerd does not delete models: `brokerctl unload NAME` frees the memory it holds; " +
		"remove its files from brokerd's repository, or from Ollama's store with `ollama rm NAME`",
	"/api/blobs/": "brokerd does not take model blobs (`ollama create` uploads them): create the model with Ollama " +
		"or put its files in brokerd's repository (--model-repo), then `brokerctl load NAME`",
}

// served lists the routes for the message of a request no route matches.
const served = "brokerd serves the Ollama API (POST /api/generate, /api/chat, /api/embed, /api/embeddings, /api/show; " +
	"GET /api/tags, /api/ps, /api/version) and the OpenAI API (POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings; " +
	"GET /v1/models, /v1/responses/{id}), and vLLM's POST /tokenize and /detokenize"

// unsupportedRoute answers an Ollama store route with what to do instead.
func (h *Handler) unsupportedRoute(msg string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, &httpError{code: http.StatusNotImplemented, err: status.Error(codes.Unimplemented, msg)})
	}
}

// notFound answers a request no route matches: 405 with Allow when the
// path is served with other methods, else 404, in the API's shape.
func (h *Handler) notFound(methods map[string][]string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		path := r.URL.Path
		allowed := methods[path]
		if strings.HasPrefix(path, "/v1/models/") {
			allowed = methods["/v1/models/"]
		}
		if len(allowed) > 0 {
			w.Header().Set("Allow", strings.Join(allowed, ", "))
			h.fail(w, r, &httpError{code: http.StatusMethodNotAllowed, err: status.Errorf(codes.InvalidArgument,
				"%s %s is not served: %s takes %s", r.Method, path, path, strings.Join(allowed, " or "))})
			return
		}
		msg := fmt.Sprintf("no route %s %s: %s", r.Method, path, served)
		if strings.HasPrefix(path, "/v1/") {
			// OpenAI's own answer to an unknown path.
			msg = fmt.Sprintf("Invalid URL (%s %s): %s", r.Method, path, served)
		}
		h.fail(w, r, &httpError{code: http.StatusNotFound, oaCode: "unknown_url", err: status.Error(codes.NotFound, msg)})
	}
}

// routeMethods maps each served path to its methods ("/v1/models/" for
// the models under it).
func routeMethods(patterns []string) map[string][]string {
	out := map[string][]string{}
	for _, p := range patterns {
		method, path, ok := strings.Cut(p, " ")
		if !ok {
			continue
		}
		if i := strings.IndexByte(path, '{'); i >= 0 {
			path = path[:i]
		}
		out[path] = append(out[path], method)
	}
	for _, m := range out {
		sort.Strings(m)
	}
	return out
}

// openaiCode is the error code OpenAI gives for an error of this status
// (nil where OpenAI gives none).
func openaiCode(err error, st *status.Status) *string {
	if he := (*httpError)(nil); errors.As(err, &he) && he.oaCode != "" {
		return &he.oaCode
	}
	var c string
	switch st.Code() {
	case codes.Unauthenticated:
		c = "invalid_api_key"
	case codes.ResourceExhausted:
		c = "rate_limit_exceeded"
	case codes.NotFound:
		c = "model_not_found"
	case codes.InvalidArgument, codes.OutOfRange:
		if contextExceeded(st.Message()) {
			c = "context_length_exceeded"
		}
	case codes.Unavailable:
		// OpenAI names none for a 503; the status's own name, as before.
		c = "unavailable"
	case codes.DeadlineExceeded:
		c = "timeout"
	}
	if c == "" {
		return nil
	}
	return &c
}

// contextExceeded reports whether a message is brokerd's refusal of a
// prompt longer than the model's context.
func contextExceeded(msg string) bool {
	// The server's check of prompt and max_tokens, and the engine's own.
	return strings.Contains(msg, "the model's context") || strings.Contains(msg, "tokens, the context of")
}

func openaiParam(err error) *string {
	if he := (*httpError)(nil); errors.As(err, &he) && he.param != "" {
		return &he.param
	}
	return nil
}

// paramError is a 400 about one request field, with OpenAI's param and
// code.
func paramError(param, code, format string, a ...any) error {
	return &httpError{code: http.StatusBadRequest, param: param, oaCode: code, err: status.Errorf(codes.InvalidArgument, format, a...)}
}

// isGenerator and isEmbedder say which routes serve a model of a kind: the
// completion routes generators, the embedding routes encoders.
func isGenerator(kind string) bool {
	return strings.Contains(kind, "llm") || strings.HasSuffix(kind, "ForCausalLM")
}

func isEmbedder(kind string) bool {
	return kind == "bert" || strings.HasSuffix(kind, "encoder")
}

// routeKind is what a route asks of its model.
type routeKind int

const (
	wantGenerator routeKind = iota
	wantEmbedder
)

// explainKind replaces a refusal of a model of the wrong kind with what the
// HTTP caller can do instead (the broker's own message names its gRPC
// methods, and one not loaded would be said to need loading, which would
// not help); other errors are returned as they are.
func (h *Handler) explainKind(ctx context.Context, err error, name string, want routeKind, openai bool) error {
	if c := status.Code(err); c != codes.InvalidArgument && c != codes.FailedPrecondition {
		return err
	}
	m, ferr := h.findModel(ctx, name)
	if ferr != nil {
		return err
	}
	kind := m.GetKind()
	gen, emb := "/api/generate or /api/chat", "/api/embed"
	if openai {
		gen, emb = "/v1/chat/completions or /v1/completions", "/v1/embeddings"
	}
	var msg string
	switch {
	case want == wantEmbedder && isGenerator(kind):
		msg = fmt.Sprintf("model %s is a generator (LLM) and gives no embeddings: use it with %s, and an embedding model (kind bert) with %s", name, gen, emb)
	case want == wantGenerator && isEmbedder(kind):
		msg = fmt.Sprintf("model %s is an embedding model (kind %s) and does not generate text: use it with %s, and a generator (LLM) with %s", name, kind, emb, gen)
	case want == wantEmbedder && !isEmbedder(kind), want == wantGenerator && !isGenerator(kind):
		msg = fmt.Sprintf("model %s is a %s model: it takes tensors through brokerd's gRPC or KServe v2 API, not the Ollama or OpenAI routes", name, kind)
	default:
		return err
	}
	return status.Error(codes.InvalidArgument, msg)
}

// semverRE is semver.org's regular expression.
var semverRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
	`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// semanticVersion is the build's version as a semantic version, which
// clients compare: itself (less a leading v) when it is one, else
// 0.0.0-dev with the build's version (a commit) as build metadata.
func semanticVersion(v string) string {
	if s := strings.TrimPrefix(v, "v"); semverRE.MatchString(s) {
		return s
	}
	var ids []string
	for _, id := range strings.Split(v, ".") {
		id = strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '-' {
				return r
			}
			return '-'
		}, id)
		if id != "" {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 || v == "dev" {
		return "0.0.0-dev"
	}
	return "0.0.0-dev+" + strings.Join(ids, ".")
}

// checkKeepAlive checks keep_alive's form and refuses keep_alive 0 in a
// request with nothing to do, Ollama's "unload now": brokerd keeps a
// loaded model until an administrator unloads it, so answering as if it
// had unloaded would mislead. With work to do (a prompt, messages, input)
// the work is answered and the 0 is not acted on, as any other value
// (models do not expire): Ollama would answer, then unload, and clients
// that send 0 with every request to save memory must not fail.
func checkKeepAlive(raw json.RawMessage, model string, work bool) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var d time.Duration
	var n float64
	var s string
	switch {
	case json.Unmarshal(raw, &n) == nil:
		d = time.Duration(n * float64(time.Second))
	case json.Unmarshal(raw, &s) == nil:
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			d = time.Duration(f * float64(time.Second))
		} else if d, err = time.ParseDuration(s); err != nil {
			return status.Errorf(codes.InvalidArgument, `"keep_alive" %q is invalid: a duration ("5m") or a number of seconds`, s)
		}
	default:
		return status.Error(codes.InvalidArgument, `"keep_alive" must be a duration ("5m") or a number of seconds`)
	}
	if d != 0 || work {
		return nil
	}
	return status.Errorf(codes.InvalidArgument, `"keep_alive": 0 asks to unload the model, which brokerd does not do over this API: `+
		"a loaded model stays until an administrator runs `brokerctl unload %s`", modelName(model))
}

// cors answers a cross-origin request: loopback origins, the HTTP API's
// own origin and Options.CORSOrigins ("*": any) may call the APIs; others
// are refused with 403 before anything runs. It answers preflights and
// reports whether the request is done.
func (h *Handler) cors(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin != "" {
		w.Header().Add("Vary", "Origin")
		if !h.originAllowed(origin, r.Host) {
			h.fail(w, r, &httpError{code: http.StatusForbidden, err: status.Errorf(codes.PermissionDenied,
				"origin %s may not call brokerd's HTTP APIs: loopback origins may; add it to --http-cors-origins (BROKERD_HTTP_CORS_ORIGINS)", origin)})
			return true
		}
		w.Header().Set("Access-Control-Allow-Origin", origin)
		w.Header().Set("Access-Control-Expose-Headers", "Retry-After, WWW-Authenticate")
	}
	if r.Method != http.MethodOptions {
		return false
	}
	w.Header().Set("Allow", "GET, HEAD, POST, DELETE, OPTIONS")
	if origin != "" && r.Header.Get("Access-Control-Request-Method") != "" {
		// A preflight: no API key (browsers send none), nothing runs.
		w.Header().Set("Access-Control-Allow-Methods", "GET, HEAD, POST, DELETE, OPTIONS")
		hdrs := r.Header.Get("Access-Control-Request-Headers")
		if hdrs == "" {
			hdrs = "Authorization, Content-Type"
		}
		w.Header().Set("Access-Control-Allow-Headers", hdrs)
		w.Header().Set("Access-Control-Max-Age", "600")
	}
	w.WriteHeader(http.StatusNoContent)
	return true
}

func (h *Handler) originAllowed(origin, host string) bool {
	if slices.Contains(h.opts.CORSOrigins, "*") || slices.Contains(h.opts.CORSOrigins, strings.TrimSuffix(origin, "/")) {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if u.Host == host {
		return true // same origin
	}
	name := u.Hostname()
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	ip := net.ParseIP(name)
	return ip != nil && ip.IsLoopback()
}
