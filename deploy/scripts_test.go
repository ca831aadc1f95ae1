package deploy

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runCmd runs a command in dir with only the given environment (plus PATH
// and HOME) and returns its stdout; a failure fails the test.
func runCmd(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	out, stderr, err := runCmdErr(dir, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, out, stderr)
	}
	return out
}

func runCmdErr(dir string, env []string, name string, args ...string) (stdout, stderr string, err error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// shellScripts are every shell script under deploy/.
func shellScripts(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("gce/*.sh")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 4 {
		t.Fatalf("found %v, want the GCE scripts, their startup script and common.sh", files)
	}
	return files
}

func TestShellcheck(t *testing.T) {
	if _, err := exec.LookPath("shellcheck"); err != nil {
		// make test installs it (DEB_DEPS); outside make, say why nothing ran.
		t.Skip("shellcheck not installed (apt-get install shellcheck, or make deps)")
	}
	for _, f := range shellScripts(t) {
		t.Run(f, func(t *testing.T) {
			// -x follows the sourced common.sh; every severity counts.
			runCmd(t, ".", nil, "shellcheck", "-x", "--severity=style", f)
		})
	}
	t.Run("catches a bug", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "bad.sh")
		if err := os.WriteFile(bad, []byte("#!/usr/bin/env bash\nrm -rf $DIR/\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if _, _, err := runCmdErr(".", nil, "shellcheck", bad); err == nil {
			t.Error("shellcheck passed an unquoted variable")
		}
	})
}

func TestGCEScriptsDryRun(t *testing.T) {
	here, err := filepath.Abs("gce")
	if err != nil {
		t.Fatal(err)
	}
	startup := here + "/startup.sh"
	base := []string{"PROJECT=my-proj", "ZONE=us-east5-b", "BROKERD_TARBALL=gs://bkt/brokerd.tar.gz"}
	tests := []struct {
		name   string
		script string
		env    []string
		want   []string
	}{
		{
			name: "gpu defaults", script: "gce-gpu-vm.sh", env: base,
			want: []string{
				`gcloud compute instances create brokerd-gpu --project=my-proj --zone=us-east5-b --machine-type=g2-standard-8 --maintenance-policy=TERMINATE --image-family=debian-12 --image-project=debian-cloud --boot-disk-size=200GB --scopes=cloud-platform --metadata-from-file=startup-script=` + startup + ` --metadata=brokerd-tarball=gs://bkt/brokerd.tar.gz\,brokerd-plugin=cuda\,pjrt-pip=jax-cuda12-plugin\[with_cuda\]`,
				`gcloud compute instances describe brokerd-gpu --project=my-proj --zone=us-east5-b --format=value\(status\)`,
			},
		},
		{
			name: "gpu overrides", script: "gce-gpu-vm.sh",
			env: append([]string{"VM_NAME=h100-a", "MACHINE_TYPE=a3-highgpu-8g", "PJRT_PIP=jax-cuda12-plugin==0.6.2"}, base...),
			want: []string{
				`gcloud compute instances create h100-a --project=my-proj --zone=us-east5-b --machine-type=a3-highgpu-8g --maintenance-policy=TERMINATE --image-family=debian-12 --image-project=debian-cloud --boot-disk-size=200GB --scopes=cloud-platform --metadata-from-file=startup-script=` + startup + ` --metadata=brokerd-tarball=gs://bkt/brokerd.tar.gz\,brokerd-plugin=cuda\,pjrt-pip=jax-cuda12-plugin==0.6.2`,
				`gcloud compute instances describe h100-a --project=my-proj --zone=us-east5-b --format=value\(status\)`,
			},
		},
		{
			name: "tpu defaults", script: "gce-tpu-vm.sh", env: base,
			want: []string{
				`gcloud compute tpus tpu-vm create brokerd-tpu --project=my-proj --zone=us-east5-b --accelerator-type=v6e-4 --version=v2-alpha-tpuv6e --metadata-from-file=startup-script=` + startup + ` --metadata=brokerd-tarball=gs://bkt/brokerd.tar.gz\,brokerd-plugin=tpu\,pjrt-pip=libtpu`,
				`gcloud compute tpus tpu-vm describe brokerd-tpu --project=my-proj --zone=us-east5-b --format=value\(state\)`,
			},
		},
		{
			name: "tpu overrides", script: "gce-tpu-vm.sh",
			env: append([]string{"TPU_NAME=t1", "ACCELERATOR_TYPE=v5litepod-8", "TPU_VERSION=v2-alpha-tpuv5-lite"}, base...),
			want: []string{
				`gcloud compute tpus tpu-vm create t1 --project=my-proj --zone=us-east5-b --accelerator-type=v5litepod-8 --version=v2-alpha-tpuv5-lite --metadata-from-file=startup-script=` + startup + ` --metadata=brokerd-tarball=gs://bkt/brokerd.tar.gz\,brokerd-plugin=tpu\,pjrt-pip=libtpu`,
				`gcloud compute tpus tpu-vm describe t1 --project=my-proj --zone=us-east5-b --format=value\(state\)`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := runCmd(t, ".", tt.env, "bash", filepath.Join("gce", tt.script), "--dry-run")
			if got := strings.Split(strings.TrimRight(out, "\n"), "\n"); strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("dry run printed:\n%s\nwant:\n%s", out, strings.Join(tt.want, "\n"))
			}
		})
	}
}

// TestGCEScriptsRefuse checks the up-front checks: nothing runs (not even a
// dry run) until every required variable is given, and all missing ones are
// named at once.
func TestGCEScriptsRefuse(t *testing.T) {
	tests := []struct {
		name, script string
		env          []string
		args         []string
		wantCode     int
		wantStderr   string
	}{
		{"gpu nothing set", "gce-gpu-vm.sh", nil, []string{"--dry-run"}, 2,
			"gce-gpu-vm.sh: required variable(s) not set: PROJECT ZONE BROKERD_TARBALL"},
		{"tpu zone missing", "gce-tpu-vm.sh", []string{"PROJECT=p", "BROKERD_TARBALL=gs://b/t"}, []string{"--dry-run"}, 2,
			"gce-tpu-vm.sh: required variable(s) not set: ZONE"},
		{"empty counts as missing", "gce-gpu-vm.sh", []string{"PROJECT=", "ZONE=z", "BROKERD_TARBALL=gs://b/t"}, []string{"--dry-run"}, 2,
			"required variable(s) not set: PROJECT"},
		{"comma in metadata", "gce-gpu-vm.sh", []string{"PROJECT=p", "ZONE=z", "BROKERD_TARBALL=gs://b/t", "PJRT_PIP=a,b"}, []string{"--dry-run"}, 2,
			"PJRT_PIP must not contain a comma"},
		{"unknown flag", "gce-tpu-vm.sh", nil, []string{"--dryrun"}, 2, "unknown argument: --dryrun"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, stderr, err := runCmdErr(".", tt.env, "bash", append([]string{filepath.Join("gce", tt.script)}, tt.args...)...)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tt.wantCode {
				t.Fatalf("exit %v, want %d; stderr:\n%s", err, tt.wantCode, stderr)
			}
			if out != "" {
				t.Errorf("printed commands although it refused:\n%s", out)
			}
			if !strings.Contains(stderr, tt.wantStderr) {
				t.Errorf("stderr %q does not contain %q", stderr, tt.wantStderr)
			}
		})
	}
}
