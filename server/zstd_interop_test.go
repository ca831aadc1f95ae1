package server

import (
	"bytes"
	"encoding/hex"
	"os/exec"
	"strings"
	"testing"
)

// TestLosslessCodesDecodeInPython decodes LOSSLESS codes of every length
// from 0 to 300 bytes, and a few large ones, with python-zstandard's
// one-shot ZstdDecompressor().decompress, which needs the content size in
// the frame header (short frames lacked it). Debian's python3-zstandard is
// installed by make deps.
func TestLosslessCodesDecodeInPython(t *testing.T) {
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import zstandard").Run(); err != nil {
		t.Skipf("%s has no zstandard module (make deps installs python3-zstandard): %v", py, err)
	}
	enc := newZstd()
	var in, want bytes.Buffer
	lengths := []int{}
	for n := 0; n <= 300; n++ {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 4096, 65537, 1<<20)
	for _, n := range lengths {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(i*31 + n) // some repetition, some variety
		}
		in.WriteString(hex.EncodeToString(enc.EncodeAll(data, nil)) + "\n")
		want.WriteString(hex.EncodeToString(data) + "\n")
	}
	cmd := exec.Command(py, "-c", `
import sys, zstandard
d = zstandard.ZstdDecompressor()
for line in sys.stdin:
    sys.stdout.write(d.decompress(bytes.fromhex(line.strip())).hex() + "\n")
`)
	cmd.Stdin = &in
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("python-zstandard could not decode a code: %v\n%s", err, stderr.String())
	}
	got, exp := strings.Split(out.String(), "\n"), strings.Split(want.String(), "\n")
	if len(got) != len(exp) {
		t.Fatalf("%d decoded, want %d", len(got), len(exp))
	}
	for i := range exp {
		if got[i] != exp[i] {
			t.Errorf("length %d: decoded differently", lengths[i])
		}
	}
}
