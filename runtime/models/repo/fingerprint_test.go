package repo

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestFingerprint(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "scorer", "1")
	newMLPFixture(1).write(t, dir)
	r := openRepo(t, root)
	fp := func() string {
		t.Helper()
		s, err := r.Fingerprint("scorer", 1)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := fp()
	if again := fp(); again != first {
		t.Fatalf("unchanged files: %s then %s", first, again)
	}
	l, err := r.Load(context.Background(), "scorer", 1)
	if err != nil {
		t.Fatal(err)
	}
	if l.Fingerprint != first {
		t.Errorf("Loaded.Fingerprint %s, want %s", l.Fingerprint, first)
	}

	// Every kind of change shows: rewritten weights (same size), a new
	// file, a removed one.
	changes := []struct {
		name   string
		change func()
	}{
		{"weights rewritten", func() { newMLPFixture(2).write(t, dir) }},
		{"file added", func() { writeFile(t, filepath.Join(dir, "notes.txt"), "x") }},
		{"file removed", func() {
			if err := os.Remove(filepath.Join(dir, "notes.txt")); err != nil {
				t.Fatal(err)
			}
		}},
	}
	prev := first
	for _, c := range changes {
		time.Sleep(5 * time.Millisecond) // a distinct modification time
		c.change()
		if now := fp(); now == prev {
			t.Errorf("%s: fingerprint unchanged", c.name)
		} else {
			prev = now
		}
	}

	for _, bad := range []struct {
		name    string
		version int64
		want    error
	}{
		{"nope", 1, ErrNotFound},
		{"scorer", 9, ErrNotFound},
		{"../scorer", 1, ErrInvalid},
	} {
		if _, err := r.Fingerprint(bad.name, bad.version); !errors.Is(err, bad.want) {
			t.Errorf("Fingerprint(%q, %d): %v, want %v", bad.name, bad.version, err, bad.want)
		}
	}
}
