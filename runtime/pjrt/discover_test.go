package pjrt

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestDiscover(t *testing.T) {
	venv := "$ROOT/venv/lib/python3*/site-packages"
	user := "$ROOT/home/.local/lib/python3*/site-packages"
	system := "$ROOT/usr/lib/python3*/dist-packages"
	tests := []struct {
		name         string
		files        []string          // regular files to create
		dirs         []string          // directories to create
		links        map[string]string // symbolic link → target
		plugins      map[string]string // Options.Plugins
		env          map[string]string
		site         []string
		want         []Candidate
		wantSearched []string // checked when set
		wantErr      string
	}{
		{
			name: "nothing found",
			dirs: []string{"$ROOT/venv/lib/python3.11/site-packages"},
			site: []string{venv, system},
			wantSearched: []string{
				"BROKERD_PJRT_PLUGINS (unset)", "PJRT_PLUGIN_LIBRARY_PATH (unset)", "TPU_LIBRARY_PATH (unset)",
				"$ROOT/venv/lib/python3.11/site-packages", system,
			},
		},
		{
			name:    "explicit plugins, sorted by name",
			files:   []string{"$ROOT/a/libtpu.so", "$ROOT/b/x.so"},
			plugins: map[string]string{"tpu": "$ROOT/a/libtpu.so", "cuda": "$ROOT/b/x.so"},
			want: []Candidate{
				{"cuda", "$ROOT/b/x.so", SourceFlag},
				{"tpu", "$ROOT/a/libtpu.so", SourceFlag},
			},
			wantSearched: []string{
				"--pjrt-plugin", "BROKERD_PJRT_PLUGINS (unset)", "PJRT_PLUGIN_LIBRARY_PATH (unset)", "TPU_LIBRARY_PATH (unset)",
			},
		},
		{
			name:    "explicit missing file still wins",
			files:   []string{"$ROOT/venv/lib/python3.11/site-packages/libtpu/libtpu.so", "$ROOT/t/libtpu.so"},
			plugins: map[string]string{"tpu": "$ROOT/missing/libtpu.so"},
			env:     map[string]string{EnvTPULibrary: "$ROOT/t/libtpu.so"},
			site:    []string{venv},
			want:    []Candidate{{"tpu", "$ROOT/missing/libtpu.so", SourceFlag}},
		},
		{
			name: "env spec",
			env:  map[string]string{EnvPlugins: "cuda=$ROOT/c.so"},
			want: []Candidate{{"cuda", "$ROOT/c.so", SourceEnvPlugins}},
		},
		{
			name:    "flag over env for the same name",
			plugins: map[string]string{"tpu": "$ROOT/flag.so"},
			env:     map[string]string{EnvPlugins: "tpu=$ROOT/env.so,cpu=$ROOT/cpu.so"},
			want: []Candidate{
				{"tpu", "$ROOT/flag.so", SourceFlag},
				{"cpu", "$ROOT/cpu.so", SourceEnvPlugins},
			},
		},
		{
			name:  "library path is a file",
			files: []string{"$ROOT/p/pjrt_c_api_cpu_plugin.so"},
			env:   map[string]string{EnvPluginLibrary: "$ROOT/p/pjrt_c_api_cpu_plugin.so"},
			want:  []Candidate{{"cpu", "$ROOT/p/pjrt_c_api_cpu_plugin.so", SourcePluginLibrary}},
		},
		{
			name:  "library path is a directory",
			files: []string{"$ROOT/d/xla_cuda_plugin.so", "$ROOT/d/libtpu.so", "$ROOT/d/README.md"},
			dirs:  []string{"$ROOT/d/sub.so"},
			env:   map[string]string{EnvPluginLibrary: "$ROOT/d"},
			want: []Candidate{
				{"tpu", "$ROOT/d/libtpu.so", SourcePluginLibrary},
				{"cuda", "$ROOT/d/xla_cuda_plugin.so", SourcePluginLibrary},
			},
		},
		{
			name:  "library path list with a missing entry",
			files: []string{"$ROOT/d/pjrt_c_api_cpu_plugin.so"},
			env:   map[string]string{EnvPluginLibrary: "$ROOT/gone/libtpu.so:$ROOT/d"},
			want: []Candidate{
				{"tpu", "$ROOT/gone/libtpu.so", SourcePluginLibrary},
				{"cpu", "$ROOT/d/pjrt_c_api_cpu_plugin.so", SourcePluginLibrary},
			},
		},
		{
			name:  "TPU_LIBRARY_PATH names tpu whatever the file is called",
			files: []string{"$ROOT/x/libtpu-nightly.so"},
			env:   map[string]string{EnvTPULibrary: "$ROOT/x/libtpu-nightly.so"},
			want:  []Candidate{{"tpu", "$ROOT/x/libtpu-nightly.so", SourceTPULibrary}},
		},
		{
			name:  "TPU_LIBRARY_PATH over site-packages",
			files: []string{"$ROOT/x/libtpu.so", "$ROOT/venv/lib/python3.11/site-packages/libtpu/libtpu.so"},
			env:   map[string]string{EnvTPULibrary: "$ROOT/x/libtpu.so"},
			site:  []string{venv},
			want:  []Candidate{{"tpu", "$ROOT/x/libtpu.so", SourceTPULibrary}},
		},
		{
			name: "site-packages layouts",
			files: []string{
				"$ROOT/venv/lib/python3.11/site-packages/libtpu/libtpu.so",
				"$ROOT/usr/lib/python3/dist-packages/jax_plugins/xla_cuda12/xla_cuda_plugin.so",
				"$ROOT/usr/lib/python3/dist-packages/jax_plugins/xla_cuda12/other.so",
				"$ROOT/usr/lib/python3/dist-packages/jax_plugins/xla_rocm6/xla_rocm_plugin.so",
			},
			dirs: []string{"$ROOT/home/.local/lib/python3.11/site-packages/libtpu"},
			site: []string{venv, user, system},
			want: []Candidate{
				{"tpu", "$ROOT/venv/lib/python3.11/site-packages/libtpu/libtpu.so", SourceSitePackages},
				{"cuda", "$ROOT/usr/lib/python3/dist-packages/jax_plugins/xla_cuda12/xla_cuda_plugin.so", SourceSitePackages},
			},
			wantSearched: []string{
				"BROKERD_PJRT_PLUGINS (unset)", "PJRT_PLUGIN_LIBRARY_PATH (unset)", "TPU_LIBRARY_PATH (unset)",
				"$ROOT/venv/lib/python3.11/site-packages",
				"$ROOT/home/.local/lib/python3.11/site-packages",
				"$ROOT/usr/lib/python3/dist-packages",
			},
		},
		{
			name: "first site-packages directory wins",
			files: []string{
				"$ROOT/home/.local/lib/python3.11/site-packages/libtpu/libtpu.so",
				"$ROOT/venv/lib/python3.12/site-packages/libtpu/libtpu.so",
				"$ROOT/home/.local/lib/python3.11/site-packages/jax_plugins/xla_cuda12/xla_cuda_plugin.so",
			},
			site: []string{venv, user},
			want: []Candidate{
				{"tpu", "$ROOT/venv/lib/python3.12/site-packages/libtpu/libtpu.so", SourceSitePackages},
				{"cuda", "$ROOT/home/.local/lib/python3.11/site-packages/jax_plugins/xla_cuda12/xla_cuda_plugin.so", SourceSitePackages},
			},
		},
		{
			name:  "same file through a link is listed once",
			files: []string{"$ROOT/real/libtpu.so"},
			links: map[string]string{"$ROOT/link/pjrt_c_api_cpu_plugin.so": "$ROOT/real/libtpu.so"},
			env: map[string]string{
				EnvPluginLibrary: "$ROOT/link/pjrt_c_api_cpu_plugin.so",
				EnvTPULibrary:    "$ROOT/real/libtpu.so",
			},
			want: []Candidate{{"cpu", "$ROOT/link/pjrt_c_api_cpu_plugin.so", SourcePluginLibrary}},
		},
		{
			name:    "same file under two names is listed once",
			files:   []string{"$ROOT/real/libtpu.so", "$ROOT/venv/lib/python3.11/site-packages/jax_plugins/xla_cuda12/xla_cuda_plugin.so"},
			links:   map[string]string{"$ROOT/real/libcuda-link.so": "$ROOT/venv/lib/python3.11/site-packages/jax_plugins/xla_cuda12/xla_cuda_plugin.so"},
			plugins: map[string]string{"accel": "$ROOT/real/libtpu.so"},
			env: map[string]string{
				EnvTPULibrary:    "$ROOT/real/libtpu.so",
				EnvPluginLibrary: "$ROOT/real/libcuda-link.so",
			},
			site: []string{venv},
			want: []Candidate{
				{"accel", "$ROOT/real/libtpu.so", SourceFlag},
				{"cuda-link", "$ROOT/real/libcuda-link.so", SourcePluginLibrary},
			},
		},
		{
			name:    "malformed env spec",
			env:     map[string]string{EnvPlugins: "tpu:/a.so"},
			wantErr: `BROKERD_PJRT_PLUGINS: bad PJRT plugin spec: entry 1 "tpu:/a.so": want name=path`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			r := func(s string) string { return strings.ReplaceAll(s, "$ROOT", root) }
			for _, f := range tt.files {
				writeFile(t, r(f), "not a library")
			}
			for _, d := range tt.dirs {
				if err := os.MkdirAll(r(d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for link, target := range tt.links {
				if err := os.MkdirAll(filepath.Dir(r(link)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(r(target), r(link)); err != nil {
					t.Fatal(err)
				}
			}
			opts := Options{Plugins: map[string]string{}, SitePackages: []string{}}
			for k, v := range tt.plugins {
				opts.Plugins[k] = r(v)
			}
			env := map[string]string{}
			for k, v := range tt.env {
				env[k] = r(v)
			}
			opts.Getenv = fakeEnv(env)
			for _, s := range tt.site {
				opts.SitePackages = append(opts.SitePackages, r(s))
			}

			got, err := Discover(opts)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("Discover error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			var want []Candidate
			for _, c := range tt.want {
				want = append(want, Candidate{Name: c.Name, Path: r(c.Path), Source: c.Source})
			}
			if !slices.Equal(got.Plugins, want) {
				t.Errorf("Plugins:\n got %v\nwant %v", got.Plugins, want)
			}
			if tt.wantSearched != nil {
				var wantSearched []string
				for _, s := range tt.wantSearched {
					wantSearched = append(wantSearched, r(s))
				}
				if !slices.Equal(got.Searched, wantSearched) {
					t.Errorf("Searched:\n got %q\nwant %q", got.Searched, wantSearched)
				}
			}
		})
	}
}

func TestDefaultSitePackages(t *testing.T) {
	system := []string{
		"/opt/conda/lib/python3*/site-packages",
		"/usr/local/lib/python3*/site-packages",
		"/usr/local/lib/python3*/dist-packages",
		"/usr/lib/python3*/dist-packages",
	}
	tests := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{name: "no HOME, no venv", want: system},
		{
			name: "HOME and VIRTUAL_ENV first",
			env:  map[string]string{"HOME": "/home/u", "VIRTUAL_ENV": "/srv/venv"},
			want: append([]string{
				"/srv/venv/lib/python3*/site-packages",
				"/home/u/.local/lib/python3*/site-packages",
			}, system...),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DefaultSitePackages(fakeEnv(tt.env)); !slices.Equal(got, tt.want) {
				t.Errorf("DefaultSitePackages:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

// TestDiscoverDefaultSitePackages checks that nil SitePackages searches the
// defaults, through a user site under a fake HOME (searched before the
// system's directories, so the host cannot change the first result).
func TestDiscoverDefaultSitePackages(t *testing.T) {
	home := t.TempDir()
	lib := filepath.Join(home, ".local/lib/python3.12/site-packages/libtpu/libtpu.so")
	writeFile(t, lib, "not a library")
	got, err := Discover(Options{Getenv: fakeEnv(map[string]string{"HOME": home})})
	if err != nil {
		t.Fatal(err)
	}
	want := Candidate{Name: "tpu", Path: lib, Source: SourceSitePackages}
	if len(got.Plugins) == 0 || got.Plugins[0] != want {
		t.Fatalf("Plugins = %v, want %v first", got.Plugins, want)
	}
	if !slices.Contains(got.Searched, "/usr/lib/python3*/dist-packages") && !slices.ContainsFunc(got.Searched, func(s string) bool {
		return strings.HasPrefix(s, "/usr/lib/python3")
	}) {
		t.Errorf("Searched %q does not cover /usr/lib/python3*/dist-packages", got.Searched)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
