package pjrt

import (
	"errors"
	"maps"
	"strings"
	"testing"
)

func TestParsePluginSpec(t *testing.T) {
	tests := []struct {
		name    string
		spec    string
		want    map[string]string
		wantErr string // substring; empty means no error
	}{
		{name: "empty", spec: "", want: map[string]string{}},
		{name: "blank", spec: "  ", want: map[string]string{}},
		{name: "one", spec: "tpu=/usr/lib/libtpu.so", want: map[string]string{"tpu": "/usr/lib/libtpu.so"}},
		{
			name: "two with spaces and case",
			spec: " TPU = /a/libtpu.so , cuda=/b/../c/xla_cuda_plugin.so",
			want: map[string]string{"tpu": "/a/libtpu.so", "cuda": "/c/xla_cuda_plugin.so"},
		},
		{name: "path with equals", spec: "cpu=/opt/a=b/p.so", want: map[string]string{"cpu": "/opt/a=b/p.so"}},
		{name: "no equals", spec: "tpu", wantErr: `entry 1 "tpu": want name=path`},
		{name: "empty name", spec: "=/a.so", wantErr: "empty plugin name"},
		{name: "empty path", spec: "tpu=", wantErr: "empty path"},
		{name: "relative path", spec: "tpu=libtpu.so", wantErr: `path "libtpu.so" is not absolute`},
		{name: "bad name", spec: "t/pu=/a.so", wantErr: `plugin name "t/pu"`},
		{name: "empty entry", spec: "tpu=/a.so,,cuda=/b.so", wantErr: "entry 2 \"\": empty entry"},
		{name: "trailing comma", spec: "tpu=/a.so,", wantErr: "entry 2"},
		{name: "duplicate", spec: "tpu=/a.so,TPU=/b.so", wantErr: `plugin "tpu" given twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePluginSpec(tt.spec)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("ParsePluginSpec(%q) = %v, want error containing %q", tt.spec, got, tt.wantErr)
				}
				if !errors.Is(err, ErrBadPluginSpec) {
					t.Errorf("error %v does not wrap ErrBadPluginSpec", err)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error = %q, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePluginSpec(%q): %v", tt.spec, err)
			}
			if !maps.Equal(got, tt.want) {
				t.Errorf("ParsePluginSpec(%q) = %v, want %v", tt.spec, got, tt.want)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		env     map[string]string
		wantErr string
	}{
		{name: "nothing set"},
		{name: "good", opts: Options{Plugins: map[string]string{"tpu": "/a.so"}}, env: map[string]string{EnvPlugins: "cuda=/b.so"}},
		{name: "bad env", env: map[string]string{EnvPlugins: "cuda"}, wantErr: "BROKERD_PJRT_PLUGINS: bad PJRT plugin spec"},
		{name: "bad flag name", opts: Options{Plugins: map[string]string{"a b": "/a.so"}}, wantErr: "--pjrt-plugin"},
		{name: "relative flag path", opts: Options{Plugins: map[string]string{"tpu": "a.so"}}, wantErr: "not absolute"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.Getenv = fakeEnv(tt.env)
			err := tt.opts.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestPlatformAndDeviceType(t *testing.T) {
	tests := []struct {
		name, platform, deviceType string
	}{
		{"tpu", "tpu", "tpu"},
		{"cuda", "cuda", "gpu"},
		{"gpu", "cuda", "gpu"},
		{"cpu", "cpu", "cpu"},
		{"rocm", "rocm", ""},
		{"metal", "metal", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Platform(tt.name)
			if p != tt.platform {
				t.Errorf("Platform(%q) = %q, want %q", tt.name, p, tt.platform)
			}
			if dt := deviceType(p); dt != tt.deviceType {
				t.Errorf("deviceType(%q) = %q, want %q", p, dt, tt.deviceType)
			}
		})
	}
}

func TestNameFromFile(t *testing.T) {
	tests := map[string]string{
		"libtpu.so":                "tpu",
		"xla_cuda_plugin.so":       "cuda",
		"pjrt_c_api_cpu_plugin.so": "cpu",
		"pjrt_c_api_gpu_plugin.so": "gpu",
		"libtpu.so.1":              "tpu",
		"pjrt_plugin_rocm.so":      "rocm",
		"My Plugin.so":             "my_plugin",
		"lib.so":                   "plugin",
	}
	for file, want := range tests {
		t.Run(file, func(t *testing.T) {
			if got := nameFromFile(file); got != want {
				t.Errorf("nameFromFile(%q) = %q, want %q", file, got, want)
			}
		})
	}
}

// fakeEnv returns a Getenv over m, so no test reads the host's environment.
func fakeEnv(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}
