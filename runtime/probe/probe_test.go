package probe

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime/pjrt"
)

func TestProbe(t *testing.T) {
	tests := []struct {
		name       string
		pjrt       func(t *testing.T) pjrt.Options
		wantPJRT   bool
		wantReason string
	}{
		{
			name: "no PJRT plugin",
			pjrt: func(t *testing.T) pjrt.Options {
				return pjrt.Options{SitePackages: []string{}, Getenv: func(string) string { return "" }}
			},
			wantReason: "no PJRT plugin found",
		},
		{
			name: "a PJRT plugin",
			pjrt: func(t *testing.T) pjrt.Options {
				return pjrt.Options{
					Plugins:      map[string]string{"tpu": buildPlugin(t)},
					SitePackages: []string{},
					Getenv:       func(string) string { return "" },
				}
			},
			wantPJRT: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			infos := Probe(context.Background(), Options{PJRT: tt.pjrt(t)})
			if len(infos) != 2 || infos[0].Name != "onednn" || infos[1].Name != "pjrt" {
				t.Fatalf("Probe = %+v, want onednn then pjrt", infos)
			}
			if !infos[0].Available {
				t.Errorf("onednn unavailable: %s", infos[0].Reason)
			}
			p := infos[1]
			if p.Available != tt.wantPJRT {
				t.Errorf("pjrt Available = %v, want %v (reason %q)", p.Available, tt.wantPJRT, p.Reason)
			}
			if !strings.Contains(p.Reason, tt.wantReason) || (tt.wantReason == "") != (p.Reason == "") {
				t.Errorf("pjrt Reason = %q, want %q", p.Reason, tt.wantReason)
			}
		})
	}
}

// buildPlugin compiles a minimal PJRT plugin: GetPjrtApi returning the head
// of a PJRT_Api for version 0.54.
func buildPlugin(t *testing.T) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("gcc not found, cannot build a test plugin: %v", err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "plugin.c")
	code := `#include <stddef.h>
typedef struct { size_t s; void* e; int major, minor; } V;
typedef struct { size_t s; void* e; V v; } A;
static const A api = { sizeof(A), NULL, { sizeof(V), NULL, 0, 54 } };
const A* GetPjrtApi(void) { return &api; }
`
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libtpu.so")
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return lib
}
