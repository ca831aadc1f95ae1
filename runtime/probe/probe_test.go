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
		{
			name: "a PJRT plugin lacking functions",
			pjrt: func(t *testing.T) pjrt.Options {
				return pjrt.Options{
					Plugins:      map[string]string{"tpu": buildPlugin(t, "SHORT_TABLE")},
					SitePackages: []string{},
					Getenv:       func(string) string { return "" },
				}
			},
			wantReason: "PJRT plugin lacks a required function: PJRT_Client_Create",
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
			if tt.wantPJRT && (len(p.Plugins) != 1 || !p.Plugins[0].Loaded || p.Plugins[0].APIVersion == "") {
				t.Errorf("pjrt Plugins = %+v, want one loaded with its API version", p.Plugins)
			}
		})
	}
}

// fakePlugin is a PJRT plugin built with runtime/pjrt's pjrt_c_api.h whose
// function table is complete: every slot holds a function that aborts, as
// Probe only checks the table and calls none of them.
// SHORT_TABLE cuts struct_size before PJRT_Client_Create, as a plugin
// older than the adapter would.
const fakePlugin = `#include <stdlib.h>
#include <string.h>
#include "pjrt_c_api.h"
static PJRT_Error* unimplemented(void* args) { abort(); }
static PJRT_Api api;
const PJRT_Api* GetPjrtApi(void) {
	memset(&api, 0, sizeof api);
	api.struct_size = PJRT_Api_STRUCT_SIZE;
	api.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
	api.pjrt_api_version.major_version = PJRT_API_MAJOR;
	api.pjrt_api_version.minor_version = PJRT_API_MINOR;
	// The functions follow the version, one pointer each.
	void** fn = (void**)&api.PJRT_Error_Destroy;
	void** end = (void**)((char*)&api + sizeof api);
	for (; fn < end; fn++) *fn = (void*)unimplemented;
#ifdef SHORT_TABLE
	api.struct_size = offsetof(PJRT_Api, PJRT_Client_Create);
#endif
	return &api;
}
`

// buildPlugin compiles fakePlugin with the given macros into a libtpu.so.
func buildPlugin(t *testing.T, defines ...string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("gcc not found, cannot build a test plugin: %v", err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "plugin.c")
	if err := os.WriteFile(src, []byte(fakePlugin), 0o644); err != nil {
		t.Fatal(err)
	}
	header, err := filepath.Abs(filepath.Join("..", "pjrt"))
	if err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libtpu.so")
	args := []string{"-shared", "-fPIC", "-I" + header, "-o", lib, src}
	for _, d := range defines {
		args = append(args, "-D"+d)
	}
	if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return lib
}
