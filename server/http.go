package server

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/brokerd/brokerd/server/config"
	"github.com/brokerd/brokerd/server/httpapi"
)

// newHTTPServer serves the Ollama and OpenAI APIs (server/httpapi) over the
// broker service, with TLS when a certificate is configured.
func newHTTPServer(cfg config.Config, broker *BrokerService, budget *byteBudget, version string, reg prometheus.Registerer, log *zap.Logger) (*http.Server, error) {
	var keys []string
	if cfg.APIKeysFile != "" {
		var err error
		if keys, err = readAPIKeys(cfg.APIKeysFile); err != nil {
			return nil, err
		}
	}
	h := httpapi.New(broker, httpapi.Options{
		APIKeys: keys, Version: version, MaxBodyBytes: int64(cfg.MaxMessageBytes), Registerer: reg, Logger: log,
		Admit: budget.acquire, BodyTimeout: time.Duration(cfg.HTTPBodyTimeout), CORSOrigins: cfg.HTTPCORSOrigins,
		ResponseStoreBytes: cfg.ResponsesStoreBytes,
	})
	// No ReadTimeout: it would also cut a stream's watch for a client that
	// leaves. The handler bounds each body instead (--http-body-timeout);
	// a connection that sends no request is closed at ReadHeaderTimeout,
	// one idle between requests at IdleTimeout.
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: min(10*time.Second, time.Duration(cfg.HTTPBodyTimeout)),
		IdleTimeout:       time.Duration(cfg.MaxConnectionIdle),
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          zap.NewStdLog(log.Named("http")),
	}
	if cfg.TLSCert != "" {
		tc, err := tlsConfig(cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA)
		if err != nil {
			return nil, err
		}
		srv.TLSConfig = tc
	}
	log.Info("HTTP APIs (Ollama, OpenAI) enabled", zap.Bool("tls", srv.TLSConfig != nil), zap.Int("api_keys", len(keys)))
	return srv, nil
}

// readAPIKeys reads one key per line; blank lines and # comments are
// skipped. A file without a key is a mistake, not "no keys needed".
func readAPIKeys(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("api-keys-file: %w", err)
	}
	defer f.Close()
	var keys []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k := strings.TrimSpace(sc.Text())
		if k == "" || strings.HasPrefix(k, "#") {
			continue
		}
		keys = append(keys, k)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("api-keys-file %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("api-keys-file %s holds no key (one per line; # starts a comment)", path)
	}
	return keys, nil
}
