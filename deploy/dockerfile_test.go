package deploy

import (
	"encoding/json"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/server/config"
)

// instruction is one Dockerfile instruction with its continuation lines joined.
type instruction struct {
	op, args string
}

func parseDockerfile(t *testing.T) []instruction {
	t.Helper()
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	var cur strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cont, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(trimmed)
		op, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{op: strings.ToUpper(op), args: strings.Join(strings.Fields(args), " ")})
		cur.Reset()
	}
	return out
}

// stages splits the instructions at each FROM and names the stages.
func stages(ins []instruction) map[string][]instruction {
	out := map[string][]instruction{}
	name := ""
	for _, in := range ins {
		if in.op == "FROM" {
			name = in.args
			if _, alias, ok := strings.Cut(in.args, " AS "); ok {
				name = alias
			}
		}
		if name != "" {
			out[name] = append(out[name], in)
		}
	}
	return out
}

// dockerEntrypoint is the image's ENTRYPOINT (exec form).
func dockerEntrypoint(t *testing.T) []string {
	t.Helper()
	var ep []string
	for _, in := range parseDockerfile(t) {
		if in.op == "ENTRYPOINT" {
			if err := json.Unmarshal([]byte(in.args), &ep); err != nil {
				t.Fatalf("ENTRYPOINT is not the exec form: %v", err)
			}
		}
	}
	if len(ep) == 0 {
		t.Fatal("no ENTRYPOINT")
	}
	return ep
}

// TestDockerfile checks what no Docker engine here can: the builder runs
// make build itself (so the image's binaries come from exactly the host
// build's steps and flags), the runtime is Debian 12 slim with oneDNN, runs
// as a non-root user, and its entrypoint is a valid brokerd command line.
func TestDockerfile(t *testing.T) {
	st := stages(parseDockerfile(t))
	build, ok := st["build"]
	if !ok {
		t.Fatalf("no build stage; stages %v", slices.Collect(maps.Keys(st)))
	}
	var runs []string
	for _, in := range build {
		if in.op == "RUN" {
			runs = append(runs, in.args)
		}
	}
	if !slices.Contains(runs, "make build VERSION=${VERSION}") {
		t.Errorf("the builder's RUN steps %q do not include `make build VERSION=${VERSION}`", runs)
	}
	for _, r := range runs {
		if strings.Contains(r, "go build") {
			t.Errorf("the builder runs go build itself (%q): it must go through make build", r)
		}
	}
	if !strings.HasPrefix(build[0].args, "golang:${GO_VERSION}-bookworm") {
		t.Errorf("builder image %q: want golang on bookworm (Debian 12, like the runtime)", build[0].args)
	}

	runtime := st["debian:12-slim"]
	if runtime == nil {
		t.Fatalf("no debian:12-slim stage; stages %v", slices.Collect(maps.Keys(st)))
	}
	have := map[string][]string{}
	for _, in := range runtime {
		have[in.op] = append(have[in.op], in.args)
	}
	apt := strings.Join(have["RUN"], " ")
	for _, pkg := range []string{"libdnnl2", "libgomp1"} {
		if !regexp.MustCompile(`apt-get install[^&]*\b` + pkg + `\b`).MatchString(apt) {
			t.Errorf("runtime does not apt-get install %s", pkg)
		}
	}
	if u := have["USER"]; len(u) != 1 || strings.HasPrefix(u[0], "0") || strings.HasPrefix(u[0], "root") {
		t.Errorf("USER %v: want one non-root user", u)
	}
	if v := strings.Join(have["VOLUME"], " "); !strings.Contains(v, `"/run/brokerd"`) {
		t.Errorf("VOLUME %q lacks the socket directory /run/brokerd", v)
	}
	if !slices.ContainsFunc(have["COPY"], func(s string) bool {
		return strings.HasPrefix(s, "--from=build /src/bin/brokerd /src/bin/brokerctl ")
	}) {
		t.Errorf("runtime COPY %q does not take both binaries from the builder's bin/", have["COPY"])
	}
	if env := strings.Join(have["ENV"], " "); !strings.Contains(env, "LD_LIBRARY_PATH=/usr/local/nvidia/lib64") {
		t.Errorf("ENV %q: want GKE's NVIDIA library directory on LD_LIBRARY_PATH", env)
	}

	ep := dockerEntrypoint(t)
	if ep[0] != "/usr/local/bin/brokerd" {
		t.Errorf("entrypoint runs %q, want /usr/local/bin/brokerd", ep[0])
	}
	cfg, err := config.Load(ep[1:], func(string) string { return "" }, 10001, io.Discard)
	if err != nil {
		t.Fatalf("the entrypoint is not a valid brokerd command line: %v", err)
	}
	if cfg.Socket != "/run/brokerd/brokerd.sock" || cfg.MetricsListen != "0.0.0.0:9464" || cfg.StateDir != "/var/lib/brokerd" {
		t.Errorf("entrypoint config: socket %q, metrics %q, state %q", cfg.Socket, cfg.MetricsListen, cfg.StateDir)
	}
}

// TestMakefileImage checks that make image builds this Dockerfile from the
// repository root (make -n prints the command without a Docker engine).
func TestMakefileImage(t *testing.T) {
	out := runCmd(t, "..", nil, "make", "-n", "image", "IMAGE=registry.example/brokerd:t1", "VERSION=v9")
	want := "docker build -f deploy/Dockerfile --build-arg VERSION=v9 -t registry.example/brokerd:t1 ."
	if strings.TrimSpace(out) != want {
		t.Errorf("make -n image printed %q, want %q", out, want)
	}
}
