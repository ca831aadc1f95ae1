package main_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// brokerctlAs runs brokerctl as another user, with the given groups.
func brokerctlAs(t *testing.T, socket string, uid uint32, groups []uint32, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "brokerctl"), args...)
	cmd.Env = hostEnv("BROKERD_SOCKET=" + socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: groups}}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("brokerctl %v as uid %d: %v", args, uid, err)
	}
	return out.String(), errb.String(), code
}

// TestBrokerctlRoles runs the real binaries: brokerctl as an unprivileged
// member of the socket's group uses the data plane, is refused cordon and
// drain on one line naming the role (and brokerd keeps serving), and the
// same user in an --admin-groups group administers; brokerd logs both.
func TestBrokerctlRoles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: brokerctl runs as other uids through SysProcAttr.Credential")
	}
	const (
		nobody      = 65534
		socketGroup = 65533
		adminGroup  = 65532
	)
	b := startBrokerd(t, "--admin-groups", "65532")
	// Let other users reach the binaries and the socket: the test's own
	// temporary directories are 0700.
	sockDir := filepath.Dir(b.socket)
	for _, p := range []string{binDir, sockDir, filepath.Dir(sockDir)} {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(b.socket, -1, socketGroup); err != nil {
		t.Fatal(err)
	}
	user := []uint32{socketGroup}
	admin := []uint32{socketGroup, adminGroup}

	if out, errOut, code := brokerctlAs(t, b.socket, nobody, user, "encode", "from nobody"); code != 0 || !strings.Contains(out, "nbmf-hash-v1") {
		t.Errorf("encode as a group member: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := brokerctlAs(t, b.socket, nobody, user, "devices"); code != 0 || !strings.Contains(out, "tpu:1") {
		t.Errorf("devices as a group member: exit %d\n%s%s", code, out, errOut)
	}
	for _, args := range [][]string{{"cordon", "tpu:1"}, {"drain", "--exit"}, {"load", "some-model"}} {
		out, errOut, code := brokerctlAs(t, b.socket, nobody, user, args...)
		prefix := "brokerctl: " + args[0] + ": permission denied: needs brokerd's admin role; brokerd saw uid 65534 (gid 65534, groups 65533, pid "
		if code != 1 || out != "" || !strings.HasPrefix(errOut, prefix) || !strings.HasSuffix(errOut, "(PERMISSION_DENIED)\n") ||
			strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "--admin-uids 65534") {
			t.Errorf("%v as a group member: exit %d, stdout %q, stderr %q; want exit 1 and one line starting %q", args, code, out, errOut, prefix)
		}
	}
	if _, errOut, code := brokerctl(t, b.socket, "health"); code != 0 {
		t.Fatalf("brokerd stopped serving after a refused drain: %s", errOut)
	}
	if out, errOut, code := brokerctlAs(t, b.socket, nobody, admin, "cordon", "tpu:1", "--reason", "by an admin group member"); code != 0 || !strings.Contains(out, "tpu:1") {
		t.Errorf("cordon as a member of --admin-groups: exit %d\n%s%s", code, out, errOut)
	}

	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("brokerd did not stop on SIGTERM")
	}
	logs := b.logs.String()
	for _, want := range []string{
		`"msg":"permission denied","method":"/broker.v1.BrokerService/Drain"`,
		`"msg":"admin call","method":"/broker.v1.BrokerService/CordonDevice","transport":"unix"`,
		`"uid":65534`, `"groups":"65532,65533"`, `"request":{"id":"tpu:1","reason":"by an admin group member"},"code":"OK"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("brokerd's log lacks %s\n%s", want, logs)
		}
	}
}
