package config

import (
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestLoadPrecedence(t *testing.T) {
	dir := t.TempDir()
	yamlPath := filepath.Join(dir, "brokerd.yaml")
	if err := os.WriteFile(yamlPath, []byte("prefer: gpu\ntpu-batch-factor: 64\nlog-level: debug\ntelemetry-interval: 2s\nsocket: /yaml.sock\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kvYAML := filepath.Join(dir, "kv.yaml")
	if err := os.WriteFile(kvYAML, []byte("kv-cache-dtype: f32\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	specYAML := filepath.Join(dir, "spec.yaml")
	if err := os.WriteFile(specYAML, []byte("speculative-tokens: 3\nspeculative-max-running: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := func(tokens, maxRunning int) func(t *testing.T, c Config) {
		return func(t *testing.T, c Config) {
			if c.SpeculativeTokens != tokens || c.SpeculativeMaxRunning != maxRunning {
				t.Errorf("speculative-tokens %d, speculative-max-running %d; want %d, %d", c.SpeculativeTokens, c.SpeculativeMaxRunning, tokens, maxRunning)
			}
		}
	}
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(t *testing.T, c Config)
	}{
		{"defaults", nil, map[string]string{"XDG_RUNTIME_DIR": "/run/user/1000"}, func(t *testing.T, c Config) {
			if c.Prefer != "auto" || !c.AllowTPU || c.TPUBatchFactor != 128 || c.GPUBatchFactor != 4 || c.CPUBatchFactor != 1 {
				t.Errorf("policy defaults wrong: %+v", c)
			}
			if c.Socket != "/run/user/1000/brokerd.sock" || c.MetricsListen != "127.0.0.1:9464" || c.Listen != "" {
				t.Errorf("listener defaults wrong: %+v", c)
			}
			if c.Sysfs != "/sys" || c.Procfs != "/proc" || c.Devfs != "/dev" || c.MemoryStrategy != "balanced" {
				t.Errorf("detection defaults wrong: %+v", c)
			}
		}},
		{"yaml over defaults", []string{"--config", yamlPath}, nil, func(t *testing.T, c Config) {
			if c.Prefer != "gpu" || c.TPUBatchFactor != 64 || c.LogLevel != "debug" || c.Telemetry != Duration(2*time.Second) || c.Socket != "/yaml.sock" {
				t.Errorf("yaml not applied: %+v", c)
			}
		}},
		{"env over yaml", []string{"--config", yamlPath}, map[string]string{"COMPUTE_PREFER": "cpu", "COMPUTE_TPU_BATCH_FACTOR": "32", "COMPUTE_ALLOW_TPU": "false"}, func(t *testing.T, c Config) {
			if c.Prefer != "cpu" || c.TPUBatchFactor != 32 || c.AllowTPU {
				t.Errorf("env not applied: %+v", c)
			}
			if c.LogLevel != "debug" {
				t.Errorf("yaml lost: %+v", c)
			}
		}},
		{"flags over env", []string{"--config", yamlPath, "--prefer", "tpu", "--tpu-batch-factor=16", "--allow-tpu=true"}, map[string]string{"COMPUTE_PREFER": "cpu", "COMPUTE_ALLOW_TPU": "false"}, func(t *testing.T, c Config) {
			if c.Prefer != "tpu" || c.TPUBatchFactor != 16 || !c.AllowTPU {
				t.Errorf("flags not applied: %+v", c)
			}
		}},
		{"config from env", nil, map[string]string{"BROKERD_CONFIG": yamlPath}, func(t *testing.T, c Config) {
			if c.Prefer != "gpu" {
				t.Errorf("BROKERD_CONFIG not read: %+v", c)
			}
		}},
		{"roots", []string{"--sysfs", "/t/sys", "--procfs", "/t/proc", "--devfs", "/t/dev"}, nil, func(t *testing.T, c Config) {
			if c.Sysfs != "/t/sys" || c.Procfs != "/t/proc" || c.Devfs != "/t/dev" {
				t.Errorf("roots: %+v", c)
			}
		}},
		{"insecure tcp on loopback", []string{"--listen", "127.0.0.1:7000", "--insecure-tcp"}, nil, func(t *testing.T, c Config) {
			if c.Listen != "127.0.0.1:7000" || !c.InsecureTCP {
				t.Errorf("tcp: %+v", c)
			}
		}},
		{"memory fraction", []string{"--memory-strategy", "0.5"}, nil, func(t *testing.T, c Config) {
			if c.MemoryStrategy != "0.5" {
				t.Errorf("memory strategy: %+v", c)
			}
		}},
		{"model repository defaults", []string{"--state-dir", "/t/state"}, nil, func(t *testing.T, c Config) {
			if c.ModelRepoDir() != "/t/state/models" || c.LoadModels != "" || c.MaxBatchTokens != 16384 {
				t.Errorf("models: repo %s, load %q, tokens %d", c.ModelRepoDir(), c.LoadModels, c.MaxBatchTokens)
			}
		}},
		{"model settings", []string{"--model-repo", "/m", "--load-models", "a, b"}, map[string]string{"BROKERD_MAX_BATCH_TOKENS": "4096"}, func(t *testing.T, c Config) {
			if c.ModelRepoDir() != "/m" || c.LoadModels != "a, b" || c.MaxBatchTokens != 4096 {
				t.Errorf("models: repo %s, load %q, tokens %d", c.ModelRepoDir(), c.LoadModels, c.MaxBatchTokens)
			}
		}},
		{"compute dtype from env", nil, map[string]string{"BROKERD_COMPUTE_DTYPE": "gpu=bf16"}, func(t *testing.T, c Config) {
			if c.ComputeDType != "gpu=bf16" {
				t.Errorf("compute-dtype %q, want gpu=bf16", c.ComputeDType)
			}
		}},
		{"compute dtype default", nil, nil, func(t *testing.T, c Config) {
			if c.ComputeDType != "cpu=f32,gpu=f32,tpu=bf16" {
				t.Errorf("compute-dtype %q, want the default", c.ComputeDType)
			}
		}},
		{"kv cache dtype", nil, map[string]string{"BROKERD_KV_CACHE_DTYPE": "f32"}, func(t *testing.T, c Config) {
			if c.KVCacheDType != "f32" {
				t.Errorf("kv-cache-dtype %q, want f32", c.KVCacheDType)
			}
		}},
		{"kv cache dtype q8_0", []string{"--kv-cache-dtype", "q8_0"}, nil, func(t *testing.T, c Config) {
			if c.KVCacheDType != "q8_0" {
				t.Errorf("kv-cache-dtype %q, want q8_0", c.KVCacheDType)
			}
		}},
		{"kv cache dtype f16", nil, map[string]string{"BROKERD_KV_CACHE_DTYPE": "f16"}, func(t *testing.T, c Config) {
			if c.KVCacheDType != "f16" {
				t.Errorf("kv-cache-dtype %q, want f16", c.KVCacheDType)
			}
		}},
		{"kv cache dtype q4_0", []string{"--kv-cache-dtype=q4_0"}, nil, func(t *testing.T, c Config) {
			if c.KVCacheDType != "q4_0" {
				t.Errorf("kv-cache-dtype %q, want q4_0", c.KVCacheDType)
			}
		}},
		{"kv cache dtype from Ollama's variable", nil, map[string]string{"OLLAMA_KV_CACHE_TYPE": "Q8_0"}, func(t *testing.T, c Config) {
			if c.KVCacheDType != "q8_0" {
				t.Errorf("kv-cache-dtype %q, want q8_0", c.KVCacheDType)
			}
		}},
		{"brokerd's kv variable over Ollama's", nil, map[string]string{"OLLAMA_KV_CACHE_TYPE": "q4_0", "BROKERD_KV_CACHE_DTYPE": "f16"}, func(t *testing.T, c Config) {
			if c.KVCacheDType != "f16" {
				t.Errorf("kv-cache-dtype %q, want f16", c.KVCacheDType)
			}
		}},
		{"kv flag over Ollama's variable", []string{"--kv-cache-dtype=bf16"}, map[string]string{"OLLAMA_KV_CACHE_TYPE": "q4_0"}, func(t *testing.T, c Config) {
			if c.KVCacheDType != "bf16" {
				t.Errorf("kv-cache-dtype %q, want bf16", c.KVCacheDType)
			}
		}},
		{"kv config file over Ollama's variable", []string{"--config", kvYAML}, map[string]string{"OLLAMA_KV_CACHE_TYPE": "q4_0"}, func(t *testing.T, c Config) {
			if c.KVCacheDType != "f32" {
				t.Errorf("kv-cache-dtype %q, want f32", c.KVCacheDType)
			}
		}},
		{"kv cache dtype default", nil, nil, func(t *testing.T, c Config) {
			if c.KVCacheDType != "auto" {
				t.Errorf("kv-cache-dtype %q, want auto", c.KVCacheDType)
			}
		}},
		{"speculative decoding off by default", nil, nil, spec(0, 4)},
		{"speculative tokens flag", []string{"--speculative-tokens", "4"}, nil, spec(4, 4)},
		{"speculative settings from env", nil, map[string]string{"BROKERD_SPECULATIVE_TOKENS": "16", "BROKERD_SPECULATIVE_MAX_RUNNING": "1024"}, spec(16, 1024)},
		{"speculative settings from the config file", []string{"--config", specYAML}, nil, spec(3, 2)},
		{"speculative flags over env", []string{"--speculative-tokens=0", "--speculative-max-running=1"}, map[string]string{"BROKERD_SPECULATIVE_TOKENS": "8", "BROKERD_SPECULATIVE_MAX_RUNNING": "8"}, spec(0, 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.args, env(tt.env), 1000, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

func TestLoadRejectsBadSettings(t *testing.T) {
	dir := t.TempDir()
	badYAML := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badYAML, []byte("prefur: gpu\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string // substrings of the error
	}{
		{"bad prefer env", nil, map[string]string{"COMPUTE_PREFER": "fastest"}, []string{"COMPUTE_PREFER", "auto, cpu, gpu, tpu", "fastest"}},
		{"bad prefer flag", []string{"--prefer=npu"}, nil, []string{"prefer", "auto, cpu, gpu, tpu"}},
		{"bad allow-tpu env", nil, map[string]string{"COMPUTE_ALLOW_TPU": "maybe"}, []string{"COMPUTE_ALLOW_TPU"}},
		{"zero factor", []string{"--gpu-batch-factor=0"}, nil, []string{"gpu-batch-factor", "1 to 4096"}},
		{"bad memory strategy", []string{"--memory-strategy=greedy"}, nil, []string{"memory-strategy", "conservative, balanced, aggressive"}},
		{"fraction above one", []string{"--memory-strategy=1.5"}, nil, []string{"memory-strategy"}},
		{"tcp without tls", []string{"--listen=127.0.0.1:7000"}, nil, []string{"TCP without TLS is refused"}},
		{"insecure tcp off loopback", []string{"--listen=0.0.0.0:7000", "--insecure-tcp"}, nil, []string{"only on a loopback"}},
		{"bad log level", []string{"--log-level=loud"}, nil, []string{"log-level", "debug, info, warn, error"}},
		{"unknown yaml key", []string{"--config", badYAML}, nil, []string{"prefur"}},
		{"missing config file", []string{"--config", filepath.Join(dir, "nope.yaml")}, nil, []string{"config file"}},
		{"unknown flag", []string{"--nope"}, nil, []string{"nope"}},
		{"positional", []string{"serve"}, nil, []string{"unexpected argument"}},
		{"half tls", []string{"--tls-cert=/c.pem"}, nil, []string{"tls-cert and tls-key"}},
		{"bad metrics address", []string{"--metrics-listen=9464"}, nil, []string{"metrics-listen"}},
		{"zero batch tokens", []string{"--max-batch-tokens=0"}, nil, []string{"max-batch-tokens 0 is invalid"}},
		{"zero concurrent streams", []string{"--max-concurrent-streams=0"}, nil, []string{"max-concurrent-streams 0 is invalid"}},
		{"model name with a path", []string{"--load-models=a,../b"}, nil, []string{"load-models", "model names separated by commas"}},
		{"empty model name", nil, map[string]string{"BROKERD_LOAD_MODELS": "a,,b"}, []string{"load-models"}},
		{"bad compute dtype", []string{"--compute-dtype=gpu=fp16"}, nil, []string{"compute-dtype (BROKERD_COMPUTE_DTYPE)", `gpu="fp16"`, "f32, bf16"}},
		{"bad kv cache dtype", []string{"--kv-cache-dtype=fp8"}, nil, []string{"kv-cache-dtype (BROKERD_KV_CACHE_DTYPE, else OLLAMA_KV_CACHE_TYPE)", `"fp8"`, "auto, f32, bf16, f16, q8_0 or q4_0"}},
		{"bad kv cache dtype from Ollama's variable", nil, map[string]string{"OLLAMA_KV_CACHE_TYPE": "iq4_nl"}, []string{"OLLAMA_KV_CACHE_TYPE", `"iq4_nl"`, "auto, f32, bf16, f16, q8_0 or q4_0"}},
		{"negative speculative tokens", []string{"--speculative-tokens=-1"}, nil, []string{"speculative-tokens (BROKERD_SPECULATIVE_TOKENS) -1 is invalid", "0 (off) to 16"}},
		{"too many speculative tokens", nil, map[string]string{"BROKERD_SPECULATIVE_TOKENS": "17"}, []string{"BROKERD_SPECULATIVE_TOKENS", "17 is invalid", "0 (off) to 16"}},
		{"speculative tokens not a number", nil, map[string]string{"BROKERD_SPECULATIVE_TOKENS": "lots"}, []string{"BROKERD_SPECULATIVE_TOKENS"}},
		{"zero speculative max running", []string{"--speculative-max-running=0"}, nil, []string{"speculative-max-running (BROKERD_SPECULATIVE_MAX_RUNNING) 0 is invalid", "1 to 1024"}},
		{"speculative max running too large", nil, map[string]string{"BROKERD_SPECULATIVE_MAX_RUNNING": "1025"}, []string{"BROKERD_SPECULATIVE_MAX_RUNNING", "1025 is invalid"}},
		{"bad compute dtype env", nil, map[string]string{"BROKERD_COMPUTE_DTYPE": "npu=bf16"}, []string{"BROKERD_COMPUTE_DTYPE", `device type "npu"`, "cpu, gpu, tpu"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(tt.args, env(tt.env), 1000, io.Discard)
			if err == nil {
				t.Fatal("Load succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestComputeDTypes(t *testing.T) {
	tests := []struct {
		in      string
		want    map[string]string
		wantErr string
	}{
		{"", map[string]string{"cpu": "f32", "gpu": "f32", "tpu": "bf16"}, ""},
		{DefaultComputeDType, map[string]string{"cpu": "f32", "gpu": "f32", "tpu": "bf16"}, ""},
		{"gpu=bf16", map[string]string{"cpu": "f32", "gpu": "bf16", "tpu": "bf16"}, ""},
		{" GPU = BF16 , tpu=f32", map[string]string{"cpu": "f32", "gpu": "bf16", "tpu": "f32"}, ""},
		{"cpu=bf16", map[string]string{"cpu": "bf16", "gpu": "f32", "tpu": "bf16"}, ""},
		{"gpu", nil, `entry "gpu" is not type=dtype`},
		{"gpu=bf16,", nil, `entry "" is not type=dtype`},
		{"gpu=fp16", nil, `gpu="fp16": allowed dtypes are f32, bf16`},
		{"amd=bf16", nil, `device type "amd": allowed types are cpu, gpu, tpu`},
		{"gpu=bf16,gpu=f32", nil, "device type gpu given twice"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ComputeDTypes(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ComputeDTypes(%q) = %v, %v; want an error containing %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tt.want) {
				t.Errorf("ComputeDTypes(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

// TestSettingsFileErrors: a mistake in the settings file is one line in the
// file's own terms, never the YAML library's "error unmarshaling JSON".
func TestSettingsFileErrors(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"typo in a key", "max-batchh: 4\n", []string{`unknown setting "max-batchh"`, "brokerd -h"}},
		{"string for an integer", "max-batch: lots\n", []string{"setting max-batch: want an integer, got a string"}},
		{"list for a string", "prefer: [gpu]\n", []string{"setting prefer: want a string, got an array"}},
		{"string for a bool", "allow-tpu: [1]\n", []string{"setting allow-tpu: want true or false, got an array"}},
		{"bad duration", "max-queue-delay: soon\n", []string{`invalid duration "soon"`}},
		{"broken YAML", "prefer: gpu\n  socket: x\n", []string{"line 2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "brokerd.yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Load([]string{"--config", path}, env(nil), 1000, io.Discard)
			if err == nil {
				t.Fatal("Load succeeded, want an error")
			}
			msg := err.Error()
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
			for _, bad := range []string{"JSON", "unmarshal", "Go struct", "\n"} {
				if strings.Contains(msg, bad) {
					t.Errorf("error %q says %q", msg, bad)
				}
			}
		})
	}
}
