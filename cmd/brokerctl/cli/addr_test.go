package cli

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestAddrAtHTTPPort: --addr pointed at an HTTP/1.1 server (brokerd's
// --http-listen) is told so in one line, not "is brokerd running?".
func TestAddrAtHTTPPort(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, tt := range []struct {
		cmd  string
		args []string
	}{
		{"health", []string{"--addr", addr, "health"}},
		{"devices", []string{"devices", "--addr", addr}},
	} {
		r := runMain(t, map[string]string{}, tt.args...)
		want := "brokerctl: " + tt.cmd + ": address " + addr + " answered HTTP/1.1, not gRPC: it is brokerd's HTTP API (--http-listen); "
		if r.code != ExitError || !strings.HasPrefix(r.stderr, want) || strings.Count(r.stderr, "\n") != 1 ||
			!strings.Contains(r.stderr, "gRPC address (--listen)") || !strings.HasSuffix(r.stderr, "(UNAVAILABLE)\n") {
			t.Errorf("brokerctl %s: got %v\nwant exit 1 and one line starting %q", strings.Join(tt.args, " "), r, want)
		}
	}
}
