package deploy

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/brokerd/brokerd/server/config"
)

// unit is a systemd unit file: section -> key -> values in order (a key may
// repeat, DeviceAllow= does).
type unit map[string]map[string][]string

func parseUnit(t *testing.T, r io.Reader) unit {
	t.Helper()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("line %d %q: not KEY=VALUE inside a section", n, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

func (u unit) one(t *testing.T, section, key string) string {
	t.Helper()
	v := u[section][key]
	if len(v) != 1 {
		t.Errorf("[%s] %s has %d values %q, want one", section, key, len(v), v)
		return ""
	}
	return v[0]
}

func readUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return parseUnit(t, f)
}

func TestSystemdUnit(t *testing.T) {
	u := readUnit(t, "systemd/brokerd.service")
	want := map[string]string{
		"RuntimeDirectory": "brokerd", "StateDirectory": "brokerd", "User": "brokerd", "Group": "brokerd",
		"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
		"DevicePolicy": "closed", "Restart": "on-failure", "KillSignal": "SIGTERM",
		"ExecStart": "/usr/local/bin/brokerd --config /etc/brokerd/brokerd.yaml",
	}
	for k, v := range want {
		t.Run(k, func(t *testing.T) {
			if got := u.one(t, "Service", k); got != v {
				t.Errorf("%s=%q, want %q", k, got, v)
			}
		})
	}
	t.Run("DeviceAllow", func(t *testing.T) {
		// The device list, as systemd can express it: fixed nodes by
		// path, node families by their /proc/devices group.
		wantDev := []string{
			"/dev/nvidiactl rw", "char-nvidia-frontend rw", // /dev/nvidiactl, /dev/nvidia*
			"/dev/nvidia-uvm rw", "char-nvidia-uvm rw", // /dev/nvidia-uvm
			"char-nvidia-caps rw", "char-nvidia-nvswitch rw", // /dev/nvidia-caps/*, /dev/nvidia-nvswitch*
			"char-accel rw",                     // /dev/accel*
			"/dev/vfio/vfio rw", "char-vfio rw", // /dev/vfio/*
		}
		if got := u["Service"]["DeviceAllow"]; !reflect.DeepEqual(got, wantDev) {
			t.Errorf("DeviceAllow %q, want %q", got, wantDev)
		}
	})
	t.Run("TimeoutStopSec above the drain", func(t *testing.T) {
		stop, err := time.ParseDuration(u.one(t, "Service", "TimeoutStopSec"))
		if err != nil {
			t.Fatal(err)
		}
		// Run drains for up to shutdown-grace, then ends what still runs
		// and closes the servers within a few seconds (server.stopBound).
		cfg := loadDefaultConfig(t)
		if worst := time.Duration(cfg.ShutdownGrace) + 5*time.Second; stop <= worst {
			t.Errorf("TimeoutStopSec %s is not above the longest drain %s", stop, worst)
		}
	})
	t.Run("no MemoryDenyWriteExecute", func(t *testing.T) {
		// oneDNN JIT-compiles its kernels: W^X would break every batch.
		if v := u["Service"]["MemoryDenyWriteExecute"]; len(v) != 0 && v[0] != "no" {
			t.Errorf("MemoryDenyWriteExecute=%v breaks oneDNN's JIT", v)
		}
	})
	if got := u.one(t, "Install", "WantedBy"); got != "multi-user.target" {
		t.Errorf("WantedBy=%q", got)
	}
}

// loadDefaultConfig loads deploy/brokerd.yaml as the unit's brokerd would
// (non-root user, no environment).
func loadDefaultConfig(t *testing.T) config.Config {
	t.Helper()
	cfg, err := config.Load([]string{"--config", "brokerd.yaml"}, func(string) string { return "" }, 999, io.Discard)
	if err != nil {
		t.Fatalf("deploy/brokerd.yaml: %v", err)
	}
	return cfg
}

var commentedKey = regexp.MustCompile(`^# ?([a-z][a-z0-9-]*): (.*)$`)

// TestDefaultConfig checks deploy/brokerd.yaml names every setting brokerd
// has, that every commented default is a valid value under its real key,
// and that the active lines give the paths the unit sets up.
func TestDefaultConfig(t *testing.T) {
	cfg := loadDefaultConfig(t)
	if cfg.Socket != "/run/brokerd/brokerd.sock" || cfg.StateDir != "/var/lib/brokerd" {
		t.Errorf("socket %q, state-dir %q: want the unit's RuntimeDirectory and StateDirectory", cfg.Socket, cfg.StateDir)
	}
	b, err := os.ReadFile("brokerd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	var uncommented []string
	for _, line := range strings.Split(string(b), "\n") {
		if m := commentedKey.FindStringSubmatch(line); m != nil {
			keys[m[1]] = true
			uncommented = append(uncommented, m[1]+": "+m[2])
			continue
		}
		if k, _, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, "#") && k != "" {
			keys[k] = true
			uncommented = append(uncommented, line)
		}
	}
	var missing []string
	for _, k := range configKeys() {
		if !keys[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		t.Errorf("deploy/brokerd.yaml does not mention %v", missing)
	}
	// Every commented default, uncommented, must load strictly and equal
	// brokerd's built-in default, so the file never documents a wrong value.
	all := filepath.Join(t.TempDir(), "all.yaml")
	if err := os.WriteFile(all, []byte(strings.Join(uncommented, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := config.Load([]string{"--config", all}, func(string) string { return "" }, 999, io.Discard)
	if err != nil {
		t.Fatalf("the uncommented defaults do not load: %v", err)
	}
	want := config.Defaults(999, func(string) string { return "" })
	want.Socket, want.StateDir = cfg.Socket, cfg.StateDir
	if !reflect.DeepEqual(got, want) {
		t.Errorf("documented defaults differ from brokerd's:\n got %+v\nwant %+v", got, want)
	}
}

// configKeys are the YAML keys of config.Config (its JSON tags).
func configKeys() []string {
	var keys []string
	typ := reflect.TypeFor[config.Config]()
	for i := range typ.NumField() {
		if k, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ","); k != "" && k != "-" {
			keys = append(keys, k)
		}
	}
	return keys
}

// TestSystemdAnalyzeVerify runs systemd's own checker on the installed unit
// (ExecStart pointing at a real binary, as verify insists on).
func TestSystemdAnalyzeVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze not available: the unit was checked by TestSystemdUnit only")
	}
	dir := t.TempDir()
	b, err := os.ReadFile("systemd/brokerd.service")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(b), "/usr/local/bin/brokerd", self, 1)
	path := filepath.Join(dir, "brokerd.service")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := runCmdErr(dir, []string{"SYSTEMD_LOG_LEVEL=notice"}, "systemd-analyze", "verify", path)
	if err != nil {
		t.Fatalf("systemd-analyze verify: %v\n%s%s", err, out, stderr)
	}
	// verify exits 0 on warnings such as an unknown key: any line about
	// this file is a failure.
	for _, line := range strings.Split(out+stderr, "\n") {
		if strings.Contains(line, path) || strings.Contains(line, "brokerd.service") {
			t.Errorf("systemd-analyze: %s", line)
		}
	}
	t.Run("catches a misspelt key", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "brokerd.service")
		if err := os.WriteFile(bad, []byte(strings.Replace(text, "ProtectHome=", "ProtectHom=", 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		out, stderr, _ := runCmdErr(dir, []string{"SYSTEMD_LOG_LEVEL=notice"}, "systemd-analyze", "verify", bad)
		if !strings.Contains(out+stderr, "ProtectHom") {
			t.Errorf("systemd-analyze said nothing about ProtectHom:\n%s%s", out, stderr)
		}
	})
}

// TestMakeInstall runs make install and make uninstall into a DESTDIR, with a
// PREFIX other than the default so the unit's paths must be rewritten.
func TestMakeInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries through make")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	dest := t.TempDir()
	bin := t.TempDir()
	vars := []string{"DESTDIR=" + dest, "PREFIX=/opt/brokerd", "SYSCONFDIR=/etc/opt", "BIN=" + bin, "VERSION=install-test"}
	env := []string{"GOCACHE=" + goEnv(t, "GOCACHE"), "GOPATH=" + goEnv(t, "GOPATH"), "GOFLAGS=" + os.Getenv("GOFLAGS")}
	runCmd(t, "..", env, "make", append([]string{"install"}, vars...)...)

	files := map[string]os.FileMode{
		"opt/brokerd/bin/brokerd":            0o755,
		"opt/brokerd/bin/brokerctl":          0o755,
		"etc/systemd/system/brokerd.service": 0o644,
		"etc/opt/brokerd/brokerd.yaml":       0o644,
	}
	for f, mode := range files {
		fi, err := os.Stat(filepath.Join(dest, f))
		if err != nil {
			t.Errorf("not installed: %v", err)
			continue
		}
		if fi.Mode().Perm() != mode {
			t.Errorf("%s has mode %v, want %v", f, fi.Mode().Perm(), mode)
		}
	}
	u := readUnit(t, filepath.Join(dest, "etc/systemd/system/brokerd.service"))
	if got := u.one(t, "Service", "ExecStart"); got != "/opt/brokerd/bin/brokerd --config /etc/opt/brokerd/brokerd.yaml" {
		t.Errorf("installed ExecStart=%q: PREFIX and SYSCONFDIR not applied", got)
	}
	// The installed binaries are the ones make build stamped with VERSION.
	for _, b := range []string{"brokerd", "brokerctl"} {
		out := runCmd(t, dest, nil, filepath.Join(dest, "opt/brokerd/bin", b), "--version")
		if !strings.HasPrefix(out, b+" install-test ") {
			t.Errorf("installed %s --version: %q, want %q and the stamp", b, out, b+" install-test")
		}
	}

	// An edited config survives both a reinstall and an uninstall.
	conf := filepath.Join(dest, "etc/opt/brokerd/brokerd.yaml")
	if err := os.WriteFile(conf, []byte("log-level: debug\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runCmd(t, "..", env, "make", append([]string{"install"}, vars...)...)
	runCmd(t, "..", env, "make", append([]string{"uninstall"}, vars...)...)
	var left []string
	filepath.WalkDir(dest, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			left = append(left, strings.TrimPrefix(p, dest+"/"))
		}
		return nil
	})
	if !slices.Equal(left, []string{"etc/opt/brokerd/brokerd.yaml"}) {
		t.Errorf("after uninstall %v remain, want only the edited config", left)
	}
	if b, _ := os.ReadFile(conf); string(b) != "log-level: debug\n" {
		t.Errorf("the edited config was replaced: %q", b)
	}

	// An unedited config goes with the rest.
	if err := os.Remove(conf); err != nil {
		t.Fatal(err)
	}
	runCmd(t, "..", env, "make", append([]string{"install"}, vars...)...)
	runCmd(t, "..", env, "make", append([]string{"uninstall"}, vars...)...)
	if _, err := os.Stat(conf); !os.IsNotExist(err) {
		t.Errorf("the default config was left behind: %v", err)
	}
}

func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}
