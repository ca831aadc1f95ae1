package server

import (
	"compress/flate"
	"io"
	"sync"

	"google.golang.org/grpc/encoding"
	// gzip registers itself: requests compressed with gzip are accepted,
	// and a server answers in the compression its client asked with.
	_ "google.golang.org/grpc/encoding/gzip"
)

// deflateName is the grpc-encoding of raw DEFLATE (RFC 1951), which
// grpc-go does not ship and some clients (grpcio's Deflate) send.
const deflateName = "deflate"

func init() { encoding.RegisterCompressor(&deflateCompressor{}) }

// deflateCompressor is encoding.Compressor over compress/flate, with pooled
// writers (a flate.Writer holds ~600 KiB).
type deflateCompressor struct {
	writers sync.Pool
}

type deflateWriter struct {
	*flate.Writer
	pool *sync.Pool
}

func (w *deflateWriter) Close() error {
	defer w.pool.Put(w)
	return w.Writer.Close()
}

func (c *deflateCompressor) Compress(w io.Writer) (io.WriteCloser, error) {
	if dw, ok := c.writers.Get().(*deflateWriter); ok {
		dw.Reset(w)
		return dw, nil
	}
	fw, err := flate.NewWriter(w, flate.DefaultCompression)
	if err != nil {
		return nil, err
	}
	return &deflateWriter{Writer: fw, pool: &c.writers}, nil
}

func (c *deflateCompressor) Decompress(r io.Reader) (io.Reader, error) {
	return flate.NewReader(r), nil
}

func (c *deflateCompressor) Name() string { return deflateName }
