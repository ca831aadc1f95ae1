package repo

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHostileRepository: model files are data, not trusted: sizes far
// beyond the weights on disk, files that are devices, FIFOs or links out of
// the repository must give a clear error for that model (List stays
// prompt; nothing huge is allocated), never hang or kill brokerd.
func TestHostileRepository(t *testing.T) {
	outside := t.TempDir() // a model directory outside the repository
	newBERTFixture(9).write(t, filepath.Join(outside, "1"))
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) // dir: the version directory, holding a good BERT
		want  string
	}{
		{"num_hidden_layers 1e7", func(t *testing.T, dir string) { editConfig(t, dir, "num_hidden_layers", 10_000_000) }, "num_hidden_layers"},
		{"hidden_size 1e9", func(t *testing.T, dir string) { editConfig(t, dir, "hidden_size", 1_000_000_000) }, "hidden_size"},
		{"vocab_size 1e12", func(t *testing.T, dir string) { editConfig(t, dir, "vocab_size", 1_000_000_000_000) }, "vocab_size"},
		{"heads beyond hidden", func(t *testing.T, dir string) { editConfig(t, dir, "num_attention_heads", 1<<30) }, "num_attention_heads"},
		{"weights link to /dev/zero", func(t *testing.T, dir string) { relink(t, "/dev/zero", filepath.Join(dir, FileWeights)) }, "outside the repository"},
		{"tokenizer link to /dev/zero", func(t *testing.T, dir string) { relink(t, "/dev/zero", filepath.Join(dir, FileTokenizer)) }, "outside the repository"},
		{"weights a character device", func(t *testing.T, dir string) { zeroDevice(t, filepath.Join(dir, FileWeights)) }, "regular file"},
		{"tokenizer a character device", func(t *testing.T, dir string) { zeroDevice(t, filepath.Join(dir, FileTokenizer)) }, "regular file"},
		{"config.json a FIFO", func(t *testing.T, dir string) { fifo(t, filepath.Join(dir, FileConfig)) }, "regular file"},
		{"brokerd.json a FIFO", func(t *testing.T, dir string) { fifo(t, filepath.Join(dir, FileBrokerd)) }, "regular file"},
		{"config.json links outside", func(t *testing.T, dir string) {
			relink(t, filepath.Join(outside, "1", FileConfig), filepath.Join(dir, FileConfig))
		}, "outside the repository"},
		{"config.json of 100 MiB", func(t *testing.T, dir string) {
			f, err := os.OpenFile(filepath.Join(dir, FileConfig), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Truncate(100 << 20); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}, "larger than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "m", "1")
			newBERTFixture(9).write(t, dir)
			tc.setup(t, dir)
			r := openRepo(t, root)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			done := make(chan []Entry, 1)
			go func() { done <- r.List() }()
			var entries []Entry
			select {
			case entries = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("List did not return")
			}
			if len(entries) != 1 || entries[0].Errs[1] == nil || !strings.Contains(entries[0].Errs[1].Error(), tc.want) {
				t.Fatalf("List: %+v, want version 1's error to say %q", entries, tc.want)
			}
			_, err := r.Load(context.Background(), "m", 1)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load: %v, want ErrInvalid saying %q", err, tc.want)
			}
			runtime.ReadMemStats(&after)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
				t.Errorf("inspecting the model allocated %d MiB", grew>>20)
			}
		})
	}
}

// TestModelDirectoryLinkedOutside: a model directory that is a link out of
// the repository is neither loaded nor hidden: List names it with the
// reason, and Load refuses it.
func TestModelDirectoryLinkedOutside(t *testing.T) {
	outside := t.TempDir()
	newBERTFixture(9).write(t, filepath.Join(outside, "1"))
	root := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "evil")); err != nil {
		t.Fatal(err)
	}
	newBERTFixture(8).write(t, filepath.Join(root, "real", "1"))
	if err := os.Symlink("real", filepath.Join(root, "alias")); err != nil { // inside: fine
		t.Fatal(err)
	}
	r := openRepo(t, root)
	byName := map[string]Entry{}
	for _, e := range r.List() {
		byName[e.Name] = e
	}
	if e, ok := byName["evil"]; !ok || e.Err == nil || !strings.Contains(e.Err.Error(), "outside the repository") {
		t.Errorf("List shows the outside link as %+v", e)
	}
	if _, err := r.Load(context.Background(), "evil", 0); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "outside the repository") {
		t.Errorf("Load of a link out of the repository: %v", err)
	}
	if _, err := r.Load(context.Background(), "alias", 0); err != nil {
		t.Errorf("a link inside the repository: %v", err)
	}
}

func editConfig(t *testing.T, dir, key string, v any) {
	t.Helper()
	f := newBERTFixture(9)
	f.config[key] = v
	writeFile(t, filepath.Join(dir, FileConfig), f.config)
}

func relink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

func fifo(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
}

// zeroDevice makes path a character device like /dev/zero (as root).
func zeroDevice(t *testing.T, path string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making a device node needs root")
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := syscall.Mknod(path, syscall.S_IFCHR|0o600, 1<<8|5); err != nil {
		t.Skipf("mknod: %v", err)
	}
}
