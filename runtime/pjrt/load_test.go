package pjrt

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime"
)

// fakePlugin is a PJRT plugin reduced to what the probe reads: GetPjrtApi and
// the head of PJRT_Api, laid out as in xla/pjrt/c/pjrt_c_api.h. Macros pick
// the version and the ways a plugin can be broken.
const fakePlugin = `
#include <stddef.h>
typedef struct { size_t struct_size; void* extension_start; int major_version; int minor_version; } Version;
typedef struct { size_t struct_size; void* extension_start; Version pjrt_api_version; void* fns[8]; } Api;
#ifndef MAJOR
#define MAJOR 0
#endif
#ifndef MINOR
#define MINOR 54
#endif
#ifndef API_SIZE
#define API_SIZE sizeof(Api)
#endif
#ifndef VERSION_SIZE
#define VERSION_SIZE sizeof(Version)
#endif
static const Api api = { API_SIZE, NULL, { VERSION_SIZE, NULL, MAJOR, MINOR }, { NULL } };
const Api* GetPjrtApi(void) {
#ifdef RETURN_NULL
	return NULL;
#else
	return &api;
#endif
}
`

const notAPlugin = `int brokerd_not_pjrt(void) { return 1; }`

// buildLib compiles C source into a shared library at dir/name, skipping the
// test when no C compiler is installed. defines are NAME or NAME=VALUE macros,
// or compiler flags starting with "-".
func buildLib(t *testing.T, dir, name, src string, defines ...string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("gcc not found, cannot build a test plugin: %v", err)
	}
	c := filepath.Join(t.TempDir(), "src.c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"-shared", "-fPIC", "-o", out, c}
	for _, d := range defines {
		if strings.HasPrefix(d, "-") { // a compiler flag, such as -I
			args = append(args, d)
			continue
		}
		args = append(args, "-D"+d)
	}
	if b, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %v: %v\n%s", args, err, b)
	}
	return out
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name        string
		setup       func(t *testing.T, dir string) string // returns the path to load
		wantVersion string
		wantErr     error
		wantMsg     string // substring of the error
	}{
		{
			name:    "missing file",
			setup:   func(t *testing.T, dir string) string { return filepath.Join(dir, "libtpu.so") },
			wantErr: ErrNotFound,
			wantMsg: "file not found",
		},
		{
			name:    "directory",
			setup:   func(t *testing.T, dir string) string { return dir },
			wantMsg: "is a directory",
		},
		{
			name: "text file named libtpu.so",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "libtpu.so")
				writeFile(t, p, "this is not an ELF file\n")
				return p
			},
			wantErr: ErrDlopen,
			wantMsg: "/libtpu.so: ", // dlerror's text names the file, then why
		},
		{
			name:    "library without GetPjrtApi",
			setup:   func(t *testing.T, dir string) string { return buildLib(t, dir, "libfoo.so", notAPlugin) },
			wantErr: ErrNotPlugin,
			wantMsg: "no GetPjrtApi symbol: not a PJRT plugin",
		},
		{
			name:    "GetPjrtApi returns NULL",
			setup:   func(t *testing.T, dir string) string { return buildLib(t, dir, "libtpu.so", fakePlugin, "RETURN_NULL") },
			wantErr: ErrNullAPI,
			wantMsg: "GetPjrtApi returned NULL",
		},
		{
			name:    "PJRT_Api too small",
			setup:   func(t *testing.T, dir string) string { return buildLib(t, dir, "libtpu.so", fakePlugin, "API_SIZE=16") },
			wantErr: ErrBadAPI,
			wantMsg: "struct_size 16",
		},
		{
			name: "PJRT_Api_Version too small",
			setup: func(t *testing.T, dir string) string {
				return buildLib(t, dir, "libtpu.so", fakePlugin, "VERSION_SIZE=8")
			},
			wantErr: ErrBadAPI,
			wantMsg: "PJRT_Api_Version struct_size 8",
		},
		{
			name:        "plugin 0.54",
			setup:       func(t *testing.T, dir string) string { return buildLib(t, dir, "libtpu.so", fakePlugin) },
			wantVersion: "0.54",
		},
		{
			name: "plugin 1.3 through a link",
			setup: func(t *testing.T, dir string) string {
				real := buildLib(t, dir, "real/xla_cuda_plugin.so", fakePlugin, "MAJOR=1", "MINOR=3")
				link := filepath.Join(dir, "xla_cuda_plugin.so")
				if err := os.Symlink(real, link); err != nil {
					t.Fatal(err)
				}
				return link
			},
			wantVersion: "1.3",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.setup(t, t.TempDir())
			lib, err := load(path)
			if tt.wantVersion != "" {
				if err != nil {
					t.Fatalf("load: %v", err)
				}
				if lib.APIVersion != tt.wantVersion {
					t.Errorf("APIVersion = %q, want %q", lib.APIVersion, tt.wantVersion)
				}
				if lib.handle == nil || lib.api == nil {
					t.Errorf("library %+v lacks its handle or API table", lib)
				}
				return
			}
			if err == nil {
				t.Fatalf("load(%s) = %+v, want an error", path, lib)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error %v is not %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error = %q, want it to contain %q", err, tt.wantMsg)
			}
		})
	}
}

// TestLoadCached checks that a second load of a path reuses the first: the
// file is replaced by garbage in between, which a second dlopen would reject.
func TestLoadCached(t *testing.T) {
	dir := t.TempDir()
	path := buildLib(t, dir, "libtpu.so", fakePlugin, "MINOR=61")
	first, err := load(path)
	if err != nil {
		t.Fatalf("first load: %v", err)
	}
	// Remove before writing: the loaded library maps the old inode, which
	// must not change under it.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, "garbage")
	second, err := load(path)
	if err != nil {
		t.Fatalf("second load: %v", err)
	}
	if first != second {
		t.Errorf("second load returned %p, want the cached %p", second, first)
	}

	// A failed dlopen is not cached: once a real plugin is there, it loads.
	bad := filepath.Join(dir, "later", "libtpu.so")
	writeFile(t, bad, "garbage")
	if _, err := load(bad); !errors.Is(err, ErrDlopen) {
		t.Fatalf("load of garbage = %v, want ErrDlopen", err)
	}
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	buildLib(t, dir, "later/libtpu.so", fakePlugin, "MINOR=62")
	lib, err := load(bad)
	if err != nil {
		t.Fatalf("load after the plugin appeared: %v", err)
	}
	if lib.APIVersion != "0.62" {
		t.Errorf("APIVersion = %q, want 0.62", lib.APIVersion)
	}
}

func TestProbe(t *testing.T) {
	type setup struct {
		plugins map[string]string
		env     map[string]string
		site    []string
	}
	tests := []struct {
		name        string
		setup       func(t *testing.T, dir string) setup
		ctx         func() context.Context
		wantAvail   bool
		wantTypes   []string
		wantPlugins []runtime.PluginInfo // Error compared by substring
		wantReason  string               // substring
	}{
		{
			name: "nothing found",
			setup: func(t *testing.T, dir string) setup {
				return setup{site: []string{filepath.Join(dir, "lib/python3*/site-packages")}}
			},
			wantReason: "no PJRT plugin found (searched: BROKERD_PJRT_PLUGINS (unset), PJRT_PLUGIN_LIBRARY_PATH (unset), TPU_LIBRARY_PATH (unset), ",
		},
		{
			name: "malformed env",
			setup: func(t *testing.T, dir string) setup {
				return setup{env: map[string]string{EnvPlugins: "tpu"}}
			},
			wantReason: "BROKERD_PJRT_PLUGINS: bad PJRT plugin spec",
		},
		{
			name: "only failures",
			setup: func(t *testing.T, dir string) setup {
				text := filepath.Join(dir, "text/libtpu.so")
				writeFile(t, text, "text")
				return setup{
					plugins: map[string]string{"cuda": filepath.Join(dir, "missing.so"), "tpu": text},
					env:     map[string]string{EnvPluginLibrary: buildLib(t, dir, "pjrt_c_api_cpu_plugin.so", notAPlugin)},
				}
			},
			wantPlugins: []runtime.PluginInfo{
				{Name: "cuda", Path: "missing.so", Platform: "cuda", Error: "file not found"},
				{Name: "tpu", Path: "text/libtpu.so", Platform: "tpu", Error: "dlopen failed: "},
				{Name: "cpu", Path: "pjrt_c_api_cpu_plugin.so", Platform: "cpu", Error: "no GetPjrtApi symbol: not a PJRT plugin"},
			},
			wantReason: "no PJRT plugin loaded: cuda (",
		},
		{
			name: "tpu plugin from site-packages",
			setup: func(t *testing.T, dir string) setup {
				buildFakePlugin(t, dir, "lib/python3.11/site-packages/libtpu/libtpu.so", "MINOR=54")
				return setup{site: []string{filepath.Join(dir, "lib/python3*/site-packages")}}
			},
			wantAvail: true,
			wantTypes: []string{"tpu"},
			wantPlugins: []runtime.PluginInfo{
				{Name: "tpu", Path: "lib/python3.11/site-packages/libtpu/libtpu.so", Platform: "tpu", APIVersion: "0.54", Loaded: true},
			},
		},
		{
			name: "a working cuda plugin beside a broken tpu one",
			setup: func(t *testing.T, dir string) setup {
				return setup{env: map[string]string{
					EnvTPULibrary:    filepath.Join(dir, "nope/libtpu.so"),
					EnvPluginLibrary: buildFakePlugin(t, dir, "jax/xla_cuda_plugin.so", "MINOR=67"),
				}}
			},
			wantAvail: true,
			wantTypes: []string{"gpu"},
			wantPlugins: []runtime.PluginInfo{
				{Name: "cuda", Path: "jax/xla_cuda_plugin.so", Platform: "cuda", APIVersion: "0.67", Loaded: true},
				{Name: "tpu", Path: "nope/libtpu.so", Platform: "tpu", Error: "file not found"},
			},
		},
		{
			name: "gpu name maps to cuda",
			setup: func(t *testing.T, dir string) setup {
				return setup{plugins: map[string]string{"gpu": buildFakePlugin(t, dir, "p.so", "MINOR=54")}}
			},
			wantAvail: true,
			wantTypes: []string{"gpu"},
			wantPlugins: []runtime.PluginInfo{
				{Name: "gpu", Path: "p.so", Platform: "cuda", APIVersion: "0.54", Loaded: true},
			},
		},
		{
			// The version loads, but the adapter would crash calling the
			// functions the table lacks: not loaded, and why.
			name: "plugin with no function table",
			setup: func(t *testing.T, dir string) setup {
				return setup{plugins: map[string]string{"tpu": buildLib(t, dir, "libtpu.so", fakePlugin)}}
			},
			wantPlugins: []runtime.PluginInfo{
				{Name: "tpu", Path: "libtpu.so", Platform: "tpu", Error: "PJRT plugin lacks a required function: PJRT_Error_Destroy (PJRT C API 0.54)"},
			},
			wantReason: "no PJRT plugin loaded: tpu (",
		},
		{
			name: "table too short beside a complete plugin",
			setup: func(t *testing.T, dir string) setup {
				return setup{plugins: map[string]string{
					"tpu":  buildFakePlugin(t, dir, "libtpu.so", "SHORT_TABLE"),
					"cuda": buildFakePlugin(t, dir, "xla_cuda_plugin.so"),
				}}
			},
			wantAvail: true,
			wantTypes: []string{"gpu"},
			wantPlugins: []runtime.PluginInfo{
				{Name: "cuda", Path: "xla_cuda_plugin.so", Platform: "cuda", APIVersion: "0.67", Loaded: true},
				{Name: "tpu", Path: "libtpu.so", Platform: "tpu", Error: "lacks a required function: PJRT_Client_Create (PJRT C API 0.67)"},
			},
		},
		{
			name: "NULL function pointers",
			setup: func(t *testing.T, dir string) setup {
				return setup{plugins: map[string]string{"cuda": buildFakePlugin(t, dir, "xla_cuda_plugin.so", "NULL_TABLE", "MINOR=60")}}
			},
			wantPlugins: []runtime.PluginInfo{
				{Name: "cuda", Path: "xla_cuda_plugin.so", Platform: "cuda", Error: "lacks a required function: PJRT_Error_Destroy (PJRT C API 0.60)"},
			},
			wantReason: "lacks a required function: PJRT_Error_Destroy",
		},
		{
			name: "cancelled",
			setup: func(t *testing.T, dir string) setup {
				return setup{plugins: map[string]string{"tpu": buildLib(t, dir, "libtpu.so", fakePlugin)}}
			},
			ctx: func() context.Context {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx
			},
			wantPlugins: []runtime.PluginInfo{
				{Name: "tpu", Path: "libtpu.so", Platform: "tpu", Error: "not loaded: context canceled"},
			},
			wantReason: "no PJRT plugin loaded: tpu (",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s := tt.setup(t, dir)
			ctx := context.Background()
			if tt.ctx != nil {
				ctx = tt.ctx()
			}
			if s.site == nil {
				s.site = []string{}
			}
			info := Probe(ctx, Options{Plugins: s.plugins, SitePackages: s.site, Getenv: fakeEnv(s.env)})

			if info.Name != Name {
				t.Errorf("Name = %q, want %q", info.Name, Name)
			}
			if info.Available != tt.wantAvail {
				t.Errorf("Available = %v, want %v (reason %q)", info.Available, tt.wantAvail, info.Reason)
			}
			if !slices.Equal(info.DeviceTypes, tt.wantTypes) {
				t.Errorf("DeviceTypes = %v, want %v", info.DeviceTypes, tt.wantTypes)
			}
			if tt.wantReason == "" && info.Reason != "" || !strings.Contains(info.Reason, tt.wantReason) {
				t.Errorf("Reason = %q, want it to contain %q", info.Reason, tt.wantReason)
			}
			if len(info.Plugins) != len(tt.wantPlugins) {
				t.Fatalf("Plugins = %+v, want %d", info.Plugins, len(tt.wantPlugins))
			}
			for i, want := range tt.wantPlugins {
				got := info.Plugins[i]
				want.Path = filepath.Join(dir, want.Path)
				wantErr := want.Error
				gotErr := got.Error
				got.Error, want.Error = "", ""
				if got != want {
					t.Errorf("Plugins[%d] = %+v, want %+v", i, got, want)
				}
				if (wantErr == "") != (gotErr == "") || !strings.Contains(gotErr, wantErr) {
					t.Errorf("Plugins[%d].Error = %q, want it to contain %q", i, gotErr, wantErr)
				}
			}
		})
	}
}

// TestLoadConcurrent loads one plugin from many goroutines: all must get the
// one library the first dlopen produced.
func TestLoadConcurrent(t *testing.T) {
	path := buildLib(t, t.TempDir(), "libtpu.so", fakePlugin, "MINOR=63")
	const n = 8
	libs := make(chan *library, n)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			lib, err := load(path)
			libs <- lib
			errs <- err
		}()
	}
	var first *library
	for i := 0; i < n; i++ {
		lib, err := <-libs, <-errs
		if err != nil {
			t.Fatalf("load: %v", err)
		}
		if first == nil {
			first = lib
		}
		if lib != first {
			t.Errorf("got library %p and %p for one path", first, lib)
		}
	}
	if first.APIVersion != "0.63" {
		t.Errorf("APIVersion = %q, want 0.63", first.APIVersion)
	}
}
