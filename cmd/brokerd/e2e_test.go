package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The end-to-end tests build the real binaries, start brokerd on a temporary
// socket against a simulated TPU v4 host, and run every brokerctl command.

const testHost = "../../detect/testdata/hosts/tpu-v4"

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "brokerd-e2e-bin")
	if err != nil {
		panic(err)
	}
	binDir = dir
	build := exec.Command("go", "build", "-o", dir+"/", "github.com/brokerd/brokerd/cmd/brokerd", "github.com/brokerd/brokerd/cmd/brokerctl",
		"github.com/brokerd/brokerd/bench/mkmodels")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		panic("building binaries: " + err.Error())
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type brokerd struct {
	cmd    *exec.Cmd
	socket string
	logs   *bytes.Buffer
	exited chan error
}

func hostEnv(extra ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "TPU_ACCELERATOR_TYPE=v4-8"}, extra...)
}

func startBrokerd(t *testing.T, extraArgs ...string) *brokerd {
	t.Helper()
	return startBrokerdIn(t, t.TempDir(), extraArgs...)
}

// startBrokerdIn starts brokerd with its socket and state under dir, so a
// second start in the same dir is a restart.
func startBrokerdIn(t *testing.T, dir string, extraArgs ...string) *brokerd {
	t.Helper()
	b := &brokerd{socket: filepath.Join(dir, "brokerd.sock"), logs: &bytes.Buffer{}, exited: make(chan error, 1)}
	args := append([]string{
		"--socket", b.socket, "--state-dir", filepath.Join(dir, "state"), "--metrics-listen", "127.0.0.1:0",
		"--sysfs", filepath.Join(testHost, "sys"), "--devfs", filepath.Join(testHost, "dev"),
		"--nvml-library", filepath.Join(dir, "no-libnvidia-ml.so.1"),
	}, extraArgs...)
	b.cmd = exec.Command(filepath.Join(binDir, "brokerd"), args...)
	b.cmd.Env = hostEnv()
	stderr, err := b.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		once := false
		for sc.Scan() {
			b.logs.WriteString(sc.Text() + "\n")
			if !once && strings.Contains(sc.Text(), `"brokerd ready"`) {
				once = true
				close(ready)
			}
		}
		b.exited <- b.cmd.Wait()
	}()
	select {
	case <-ready:
	case err := <-b.exited:
		t.Fatalf("brokerd exited before ready: %v\n%s", err, b.logs)
	case <-time.After(2 * time.Minute): // far above a start (seconds), even on a loaded machine
		b.cmd.Process.Kill()
		t.Fatalf("brokerd not ready after 2m\n%s", b.logs)
	}
	t.Cleanup(func() {
		if b.cmd.ProcessState == nil {
			b.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-b.exited:
			case <-time.After(20 * time.Second):
				b.cmd.Process.Kill()
			}
		}
	})
	return b
}

func brokerctl(t *testing.T, socket string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "brokerctl"), args...)
	cmd.Env = hostEnv("BROKERD_SOCKET=" + socket)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("brokerctl %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

func TestBrokerctlCommands(t *testing.T) {
	b := startBrokerd(t)
	tests := []struct {
		args     []string
		wantCode int
		want     []string // substrings of stdout (or stderr when the code is not 0)
	}{
		{[]string{"health"}, 0, []string{"SERVING"}},
		{[]string{"devices"}, 0, []string{"ID", "cpu:0", "tpu:0", "tpu:3", "TPU v4", "32.0 GiB", "onednn"}},
		{[]string{"devices", "--json"}, 0, []string{`"devices"`, `"id": "tpu:1"`, `"DEVICE_TYPE_TPU"`}},
		{[]string{"device", "tpu:2"}, 0, []string{"tpu:2", "v4", "v4-8", "PJRT"}},
		{[]string{"device", "tpu:2", "--json"}, 0, []string{`"generation": "v4"`, `"accelerator_type": "v4-8"`}},
		{[]string{"device", "gpu:0"}, 1, []string{"NOT_FOUND"}},
		{[]string{"report"}, 0, []string{"cpu:0", "auto", "onednn", "pjrt"}},
		{[]string{"report", "--json", "--verbose"}, 0, []string{`"current_device"`, `"all_devices"`, `"configuration"`, `"prefer": "auto"`, `"allow_tpu": true`, `"tpu_batch_factor": 128`, `"runtimes"`, `"routing_mode": "ROUTING_MODE_AUTO"`, `"batch_plans"`, `"recommendations"`}},
		{[]string{"batch-plan", "--base", "5", "--type", "tpu"}, 0, []string{"512"}},
		{[]string{"batch-plan", "--base", "8", "--device", "cpu:0", "--json"}, 0, []string{`"max_batch": 8`, `"device_id": "cpu:0"`}},
		{[]string{"batch-plan", "--base", "0", "--type", "gpu"}, 1, []string{"INVALID_ARGUMENT"}},
		{[]string{"batch-plan", "--base", "8"}, 2, []string{"--type"}},
		{[]string{"cordon", "tpu:1", "--reason", "bad HBM"}, 0, []string{"tpu:1"}},
		{[]string{"device", "tpu:1", "--json"}, 0, []string{`"cordoned": true`, `"cordon_reason": "bad HBM"`}},
		{[]string{"uncordon", "tpu:1"}, 0, []string{"tpu:1"}},
		{[]string{"cordon", "tpu:9"}, 1, []string{"NOT_FOUND"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			stdout, stderr, code := brokerctl(t, b.socket, tt.args...)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.wantCode, stdout, stderr)
			}
			text := stdout
			if code != 0 {
				text = stderr
			}
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("output lacks %q:\n%s", w, text)
				}
			}
			if strings.Contains(strings.Join(tt.args, " "), "--json") && code == 0 && !json.Valid([]byte(stdout)) {
				t.Errorf("--json output is not JSON:\n%s", stdout)
			}
		})
	}
}

func TestBrokerdRefusesBadSettings(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"bad prefer", nil, []string{"COMPUTE_PREFER=fastest"}, "allowed values are auto, cpu, gpu, tpu"},
		{"tcp without tls", []string{"--listen", "127.0.0.1:0"}, nil, "TCP without TLS is refused"},
		{"insecure tcp off loopback", []string{"--listen", "0.0.0.0:0", "--insecure-tcp"}, nil, "only on a loopback"},
		{"bad pjrt plugin spec", []string{"--pjrt-plugin", "tpu"}, nil, "pjrt-plugin"},
		{"bad costs", []string{"--costs", "gpu=cheap"}, nil, "costs"},
		{"unknown admin group", []string{"--admin-groups", "no-such-group-here"}, nil, "no-such-group-here"},
		{"settings file typo", []string{"--config", "TYPO_YAML"}, nil, `unknown setting "prefur"`},
		{"busy metrics port", []string{"--metrics-listen", "BUSY"}, nil, "address already in use (another brokerd, or another program, listens there); set --metrics-listen / BROKERD_METRICS_LISTEN to another address"},
		{"busy http port", []string{"--http-allow-unauthenticated"}, []string{"BROKERD_HTTP_LISTEN=BUSY"}, "; set --http-listen / BROKERD_HTTP_LISTEN to another address"},
	}
	typo := filepath.Join(t.TempDir(), "brokerd.yaml")
	if err := os.WriteFile(typo, []byte("prefur: gpu\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			args := append([]string{"--socket", filepath.Join(dir, "s.sock"), "--state-dir", dir, "--metrics-listen", ""}, tt.args...)
			for i := range args {
				switch args[i] {
				case "TYPO_YAML":
					args[i] = typo
				case "BUSY":
					args[i] = busy.Addr().String()
				}
			}
			env := slices.Clone(tt.env)
			for i := range env {
				env[i] = strings.ReplaceAll(env[i], "BUSY", busy.Addr().String())
			}
			cmd := exec.Command(filepath.Join(binDir, "brokerd"), args...)
			cmd.Env = hostEnv(env...)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("brokerd started with a bad setting:\n%s", out)
			}
			// Every bad setting is the same class of mistake: exit 2 and
			// one line, whether Load or the daemon's start found it.
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
				t.Errorf("exit %v, want status 2", err)
			}
			if lines := strings.Count(strings.TrimSpace(string(out)), "\n") + 1; lines != 1 {
				t.Errorf("%d lines of output, want one:\n%s", lines, out)
			}
			if !strings.Contains(string(out), tt.want) {
				t.Errorf("output lacks %q:\n%s", tt.want, out)
			}
		})
	}
}

func TestSecondBrokerdExitsAndSIGTERMStops(t *testing.T) {
	b := startBrokerd(t)
	dir := t.TempDir()
	second := exec.Command(filepath.Join(binDir, "brokerd"), "--socket", b.socket, "--state-dir", dir, "--metrics-listen", "")
	second.Env = hostEnv()
	out, err := second.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "already running") {
		t.Fatalf("second brokerd: %v\n%s", err, out)
	}
	if _, _, code := brokerctl(t, b.socket, "health"); code != 0 {
		t.Fatal("first brokerd stopped serving after the second one tried")
	}

	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-b.exited:
		if err != nil {
			t.Fatalf("brokerd exit after SIGTERM: %v\n%s", err, b.logs)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("brokerd did not stop on SIGTERM")
	}
	if !strings.Contains(b.logs.String(), "brokerd stopped") {
		t.Errorf("no clean-stop log line:\n%s", b.logs)
	}
	if _, err := os.Stat(b.socket); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
}

func TestVersionFlags(t *testing.T) {
	out, err := exec.Command(filepath.Join(binDir, "brokerd"), "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "brokerd dev (go1.") || !strings.Contains(string(out), ", oneDNN 2.") {
		t.Errorf("brokerd --version: %q, %v", out, err)
	}
	out, err = exec.Command(filepath.Join(binDir, "brokerctl"), "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "brokerctl dev (go1.") {
		t.Errorf("brokerctl --version: %q, %v", out, err)
	}
	out, err = exec.Command(filepath.Join(binDir, "brokerd"), "-h").Output()
	if err != nil || !strings.Contains(string(out), "(env BROKERD_MAX_QUEUE_ITEMS; default 65536)") {
		t.Errorf("brokerd -h: %v\n%s", err, out)
	}
}
