package ollama

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// verifyStore writes a model whose GGUF blob is n pseudo-random bytes.
func verifyStore(t *testing.T, n int) (*store, *Store, Model) {
	t.Helper()
	s := newStore(t)
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	s.manifest("registry.ollama.ai/library/m/latest", layer{}, s.blob(MediaModel, b))
	st := s.open(Limits{})
	m, err := st.Lookup("m")
	if err != nil {
		t.Fatal(err)
	}
	return s, st, m
}

type progressLog struct {
	mu    sync.Mutex
	calls [][2]int64
}

func (p *progressLog) f(done, total int64) {
	p.mu.Lock()
	p.calls = append(p.calls, [2]int64{done, total})
	p.mu.Unlock()
}

func (p *progressLog) starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.calls {
		if c[0] == 0 {
			n++
		}
	}
	return n
}

// TestVerify: the blob's sha256 is streamed with progress from 0 to its
// size, once: a second call neither reads nor reports.
func TestVerify(t *testing.T) {
	defer func(old int64) { progressEvery = old }(progressEvery)
	progressEvery = 1 << 20
	const n = 5<<20 + 123
	_, st, m := verifyStore(t, n)
	var p progressLog
	if err := st.Verify(context.Background(), m, p.f); err != nil {
		t.Fatal(err)
	}
	if len(p.calls) < 6 || p.calls[0] != [2]int64{0, n} || p.calls[len(p.calls)-1] != [2]int64{n, n} {
		t.Errorf("progress %v", p.calls)
	}
	for i := 1; i < len(p.calls); i++ {
		if p.calls[i][0] <= p.calls[i-1][0] || p.calls[i][1] != n {
			t.Errorf("progress not increasing: %v", p.calls)
		}
	}
	if !st.Verified(m) {
		t.Error("not remembered as verified")
	}
	var again progressLog
	if err := st.Verify(context.Background(), m, again.f); err != nil || len(again.calls) != 0 {
		t.Errorf("second Verify: %v, progress %v", err, again.calls)
	}
	// A blob rewritten (a new modification time) is read again.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(m.Path, later, later); err != nil {
		t.Fatal(err)
	}
	if st.Verified(m) {
		t.Error("a touched blob still counts as verified")
	}
	var third progressLog
	if err := st.Verify(context.Background(), m, third.f); err != nil || third.starts() != 1 {
		t.Errorf("Verify after a touch: %v, progress %v", err, third.calls)
	}
	// A model's own error is Verify's.
	bad := m
	bad.Err = errors.New("broken")
	if err := st.Verify(context.Background(), bad, nil); err != bad.Err {
		t.Errorf("Verify of a model with an error: %v", err)
	}
	if err := st.Verify(context.Background(), Model{Name: "x"}, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("Verify of no blob: %v", err)
	}
}

// TestVerifyBad: a blob whose bytes are not its digest's is ErrCorrupt,
// one shorter than stated ErrInvalid; neither is remembered, and the
// error names the blob, not the store.
func TestVerifyBad(t *testing.T) {
	ctx := context.Background()
	t.Run("wrong digest", func(t *testing.T) {
		s, st, m := verifyStore(t, 3<<20)
		b, err := os.ReadFile(m.Path)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 1
		if err := os.WriteFile(m.Path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			err := st.Verify(ctx, m, nil)
			checkModelError(t, s, err, ErrCorrupt, "blobs/sha256-"+m.Digest[7:]+" has sha256:")
		}
		if st.Verified(m) {
			t.Error("a corrupt blob is remembered as verified")
		}
	})
	t.Run("digest of other bytes", func(t *testing.T) {
		s := newStore(t)
		real := []byte("the real GGUF")
		d := digestOf([]byte("another GGUF!"))
		if err := os.WriteFile(s.blobPath(d), real, 0o644); err != nil {
			t.Fatal(err)
		}
		s.manifest("registry.ollama.ai/library/m/latest", layer{}, layer{MediaType: MediaModel, Digest: d, Size: int64(len(real))})
		st := s.open(Limits{})
		m, err := st.Lookup("m")
		if err != nil {
			t.Fatal(err)
		}
		checkModelError(t, s, st.Verify(ctx, m, nil), ErrCorrupt, "not the manifest's digest")
	})
	t.Run("truncated", func(t *testing.T) {
		s, st, m := verifyStore(t, 1<<20)
		if err := os.Truncate(m.Path, 1<<19); err != nil {
			t.Fatal(err)
		}
		checkModelError(t, s, st.Verify(ctx, m, nil), ErrInvalid, "is 524288 bytes, the manifest says 1048576 (truncated?)")
		// And listed so from then on.
		l, err := st.Lookup("m")
		checkModelError(t, s, err, ErrInvalid, "(a partial download?)")
		if l.Name != "m:latest" {
			t.Errorf("model %+v", l)
		}
	})
	t.Run("removed", func(t *testing.T) {
		s, st, m := verifyStore(t, 10)
		if err := os.Remove(m.Path); err != nil {
			t.Fatal(err)
		}
		checkModelError(t, s, st.Verify(ctx, m, nil), ErrInvalid, "is missing")
	})
	t.Run("replaced by a link out", func(t *testing.T) {
		s, st, m := verifyStore(t, 10)
		b, _ := os.ReadFile(m.Path)
		out := filepath.Join(t.TempDir(), "x")
		if err := os.WriteFile(out, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(m.Path); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(out, m.Path); err != nil {
			t.Fatal(err)
		}
		checkModelError(t, s, st.Verify(ctx, m, nil), ErrInvalid, "links outside the store")
	})
}

// TestVerifyContext: a cancelled verification returns the context's
// error, remembers nothing, and a later one starts over.
func TestVerifyContext(t *testing.T) {
	_, st, m := verifyStore(t, 4<<20)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := st.Verify(ctx, m, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Verify: %v", err)
	}
	// Cancelled from progress, mid-file.
	ctx, cancel = context.WithCancel(context.Background())
	defer func(old int64) { progressEvery = old }(progressEvery)
	progressEvery = 1 << 20
	err := st.Verify(ctx, m, func(done, total int64) {
		if done > 0 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || st.Verified(m) {
		t.Errorf("Verify cancelled midway: %v, verified %v", err, st.Verified(m))
	}
	if err := st.Verify(context.Background(), m, nil); err != nil || !st.Verified(m) {
		t.Errorf("Verify after a cancelled one: %v", err)
	}
}

// TestVerifyConcurrent: concurrent calls for one blob read it once.
func TestVerifyConcurrent(t *testing.T) {
	_, st, m := verifyStore(t, 8<<20)
	var p progressLog
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := st.Verify(context.Background(), m, p.f); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if failed.Load() != 0 || p.starts() != 1 {
		t.Errorf("%d failed, %d reads", failed.Load(), p.starts())
	}
	// A failure is every waiter's.
	s3, st3, m3 := verifyStore(t, 4<<20)
	if err := os.WriteFile(m3.Path, make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = st3.Verify(context.Background(), m3, nil) }()
	}
	wg.Wait()
	for _, err := range errs {
		checkModelError(t, s3, err, ErrCorrupt, "m:latest: blobs/sha256-")
	}
	// A waiter whose context ends stops waiting.
	_, st2, m2 := verifyStore(t, 8<<20)
	started := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- st2.Verify(context.Background(), m2, func(d, _ int64) {
			if d == 0 {
				close(started)
				<-release
			}
		})
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := st2.Verify(ctx, m2, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiter: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Error(err)
	}
}
