package daemon

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestListenUnix(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, path string) func()
		wantErr error
		wantMsg string
	}{
		{"fresh path", func(t *testing.T, path string) func() { return func() {} }, nil, ""},
		{"stale socket is replaced", func(t *testing.T, path string) func() {
			// A socket file nobody accepts on: listen, then close the fd
			// without unlinking, as a killed brokerd leaves it.
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			l.SetUnlinkOnClose(false)
			l.Close()
			if _, err := os.Stat(path); err != nil {
				t.Fatalf("stale socket not left behind: %v", err)
			}
			return func() {}
		}, nil, ""},
		{"live server refuses", func(t *testing.T, path string) func() {
			l, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			return func() { l.Close() }
		}, ErrAlreadyRunning, "accepting on"},
		{"live brokerd holding the lock refuses", func(t *testing.T, path string) func() {
			l, err := listenUnix(path)
			if err != nil {
				t.Fatal(err)
			}
			return func() { l.Close() }
		}, ErrAlreadyRunning, "lock"},
		{"regular file is not replaced", func(t *testing.T, path string) func() {
			if err := os.WriteFile(path, []byte("data"), 0o600); err != nil {
				t.Fatal(err)
			}
			return func() {}
		}, nil, "not a socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "sub", "brokerd.sock")
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			cleanup := tt.prepare(t, path)
			defer cleanup()
			l, err := listenUnix(path)
			if tt.wantErr == nil && tt.wantMsg == "" {
				if err != nil {
					t.Fatalf("listenUnix: %v", err)
				}
				defer l.Close()
				fi, err := os.Stat(path)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
					t.Errorf("socket mode = %v, want socket 0660", fi.Mode())
				}
				c, err := net.Dial("unix", path)
				if err != nil {
					t.Fatalf("dial new socket: %v", err)
				}
				c.Close()
				return
			}
			if err == nil {
				l.Close()
				t.Fatal("listenUnix succeeded, want an error")
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not mention %q", err, tt.wantMsg)
			}
		})
	}
}

func TestListenUnixCloseRemovesSocketAndLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "brokerd.sock")
	l, err := listenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("socket still there after Close: %v", err)
	}
	// The lock is released: a new listener can take it at once.
	lock, err := os.OpenFile(path+".lock", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Errorf("lock still held after Close: %v", err)
	}
}
