package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// ErrAlreadyRunning means another brokerd serves the socket path.
var ErrAlreadyRunning = errors.New("another brokerd is already running")

// socketListener is a Unix socket listener plus the lock that makes it ours.
type socketListener struct {
	net.Listener
	lock *os.File
}

// Close closes the listener (which unlinks the socket) and releases the lock.
func (l *socketListener) Close() error {
	err := l.Listener.Close()
	if l.lock != nil {
		l.lock.Close()
	}
	return err
}

// listenUnix listens on path with mode 0660. A stale socket file (nobody
// accepting on it) is replaced; a live brokerd on the same path, or one holding
// the path's lock file, makes this fail with ErrAlreadyRunning. The lock
// (path + ".lock", flock) closes the race between two brokerds starting at once.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("socket lock: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w on %s (its lock %s is held)", ErrAlreadyRunning, path, path+".lock")
		}
		return nil, fmt.Errorf("socket lock %s: %w", path+".lock", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			lock.Close()
			return nil, fmt.Errorf("%s exists and is not a socket; refusing to replace it", path)
		}
		// Holding the lock means no brokerd owns it, but another program might:
		// only a socket nobody accepts on is stale.
		if c, err := net.DialTimeout("unix", path, 500*time.Millisecond); err == nil {
			c.Close()
			lock.Close()
			return nil, fmt.Errorf("%w: a server is accepting on %s", ErrAlreadyRunning, path)
		}
		if err := os.Remove(path); err != nil {
			lock.Close()
			return nil, fmt.Errorf("removing stale socket: %w", err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		lock.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	return &socketListener{Listener: l, lock: lock}, nil
}

// lockStateDir takes dir's lock file (dir/brokerd.lock, flock) for as long
// as the returned file is open; another brokerd holding it is
// ErrAlreadyRunning.
func lockStateDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("state-dir: %w", err)
	}
	path := filepath.Join(dir, "brokerd.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state-dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w with state-dir %s (its lock %s is held); give each brokerd its own --state-dir", ErrAlreadyRunning, dir, path)
		}
		return nil, fmt.Errorf("state-dir lock %s: %w", path, err)
	}
	return f, nil
}
