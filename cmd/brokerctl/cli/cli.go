// Package cli implements brokerctl's commands. Main runs one command line in
// process, so tests drive the real commands against an in-process server.
package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	goruntime "runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/brokerd/brokerd/client"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/server/endpoint"
)

// Exit codes of brokerctl.
const (
	ExitOK    = 0 // the command succeeded
	ExitError = 1 // an RPC or other runtime error, or health not SERVING
	ExitUsage = 2 // bad command line
)

// DefaultTimeout bounds a whole command unless --timeout says otherwise.
const DefaultTimeout = 10 * time.Second

// Main runs brokerctl with args (without the program name), reading input
// (encode's texts) from stdin, writing results to stdout and diagnostics to
// stderr, and returns the process exit code. stdin may be nil. getenv supplies
// BROKERD_SOCKET, BROKERD_ADDR and XDG_RUNTIME_DIR.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	return MainVersion(ctx, "dev", args, stdin, stdout, stderr, getenv)
}

// MainVersion is Main for a binary stamped with version (brokerctl
// --version prints it).
func MainVersion(ctx context.Context, version string, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, getenv: getenv, euid: os.Geteuid(), version: version}
	return a.run(ctx, args)
}

// app is one run of brokerctl; euid is a field so tests can pick the default
// socket rule.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	euid           int
	version        string
}

// usageError is a bad command line: exit 2 and a usage hint.
type usageError struct {
	msg     string
	oneLine bool // msg already says where to look: no usage line after it
}

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return usageError{msg: fmt.Sprintf(format, args...)}
}

// exitStatus ends a command with a code and no further message, for outcomes
// the command already printed (health NOT_SERVING).
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// globals are the connection flags. They are registered on the top-level
// flag set and on every command's, so they work before or after the command.
type globals struct {
	socket, addr       string
	socketSet, addrSet bool
	timeout            time.Duration
	timeoutSet         bool
}

func isGlobalFlag(name string) bool {
	switch name {
	case "socket", "addr", "timeout":
		return true
	}
	return false
}

func (g *globals) register(fs *flag.FlagSet) {
	// Func flags, not StringVar/DurationVar: registering those again on the
	// command's flag set would reset values parsed before the command.
	fs.Func("socket", "Unix socket of brokerd (env "+endpoint.EnvSocket+")", func(s string) error {
		g.socket, g.socketSet = s, true
		return nil
	})
	fs.Func("addr", "TCP host:port of brokerd; wins over the socket (env "+endpoint.EnvAddr+")", func(s string) error {
		g.addr, g.addrSet = s, true
		return nil
	})
	fs.Func("timeout", "deadline for the whole command (default 10s, none for load, unload and drain; 0 for none)", func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		if d < 0 {
			return errors.New("must not be negative")
		}
		g.timeout, g.timeoutSet = d, true
		return nil
	})
}

// resolve applies the environment and defaults: a flag beats the environment,
// and an explicit --socket beats an address that only came from BROKERD_ADDR.
func (g *globals) resolve(euid int, getenv func(string) string) {
	if !g.addrSet && !g.socketSet {
		g.addr = getenv(endpoint.EnvAddr)
	}
	if !g.socketSet {
		g.socket = getenv(endpoint.EnvSocket)
	}
	if g.socket == "" {
		g.socket = endpoint.DefaultSocketPath(euid, getenv)
	}
}

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// Errors and usage are printed by run, to the right stream.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

func (a *app) run(ctx context.Context, args []string) int {
	g := &globals{timeout: DefaultTimeout}
	top := newFlagSet("brokerctl")
	g.register(top)
	showVersion := top.Bool("version", false, "print brokerctl's version and exit")
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return a.print(a.stdout, mainUsage(a.defaultSocket()))
		}
		// One line, not the whole usage: the mistake and where the flags are.
		if name, ok := undefinedFlag(err); ok {
			if cmdFlag := commandFlagHint(name, top.Args()); cmdFlag != "" {
				fmt.Fprintf(a.stderr, "brokerctl: %s\n", cmdFlag)
				return ExitUsage
			}
			fmt.Fprintf(a.stderr, "brokerctl: %s\n", unknownFlag(name, top, "brokerctl help"))
		} else {
			fmt.Fprintf(a.stderr, "brokerctl: %v (\"brokerctl help\" lists the flags)\n", err)
		}
		return ExitUsage
	}
	if *showVersion {
		return a.print(a.stdout, fmt.Sprintf("brokerctl %s (%s)\n", a.version, goruntime.Version()))
	}
	if top.NArg() == 0 {
		fmt.Fprintf(a.stderr, "brokerctl: no command given\n%s", mainUsage(a.defaultSocket()))
		return ExitUsage
	}
	name := top.Arg(0)
	cmd, ok := lookup(name)
	if !ok {
		fmt.Fprintf(a.stderr, "brokerctl: %s\n", unknownCommand(name))
		return ExitUsage
	}

	fs := newFlagSet("brokerctl " + name)
	g.register(fs)
	act := cmd.setup(fs)
	pos, err := parseInterspersed(fs, top.Args()[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return a.print(a.stdout, commandUsage(cmd, fs))
		}
		if flagName, ok := undefinedFlag(err); ok {
			fmt.Fprintf(a.stderr, "brokerctl: %s: %s\n", name, unknownFlag(flagName, fs, "brokerctl help "+name))
			return ExitUsage
		}
		fmt.Fprintf(a.stderr, "brokerctl: %s: %v\n%s", name, err, shortUsage(cmd))
		return ExitUsage
	}
	if cmd.nargs >= 0 && len(pos) != cmd.nargs {
		fmt.Fprintf(a.stderr, "brokerctl: %s: want %d argument(s) (%s), got %d\n%s",
			name, cmd.nargs, cmd.args, len(pos), shortUsage(cmd))
		return ExitUsage
	}
	g.resolve(a.euid, a.getenv)

	// A self-bounded command (bench) ends by its own clock, so --timeout
	// bounds each of its RPCs instead of the whole command; one that waits
	// on brokerd's work (load, unload, drain) has no deadline unless asked.
	if g.timeout > 0 && !cmd.selfBounded && (!cmd.waits || g.timeoutSet) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.timeout)
		defer cancel()
	}
	inv := &invocation{
		stdin: a.stdin, stdout: a.stdout, stderr: a.stderr,
		socket: g.socket, addr: g.addr, timeout: g.timeout, defaultSocket: a.defaultSocket(),
	}
	defer inv.close()
	err = act(ctx, inv, pos)
	if err == nil {
		return ExitOK
	}
	return a.fail(cmd, fs, inv, err)
}

func (a *app) defaultSocket() string { return endpoint.DefaultSocketPath(a.euid, a.getenv) }

func (a *app) print(w io.Writer, s string) int {
	if _, err := io.WriteString(w, s); err != nil {
		return ExitError
	}
	return ExitOK
}

// fail prints err as "brokerctl: <command>: <message> (<gRPC code>)" and
// returns the exit code for it.
func (a *app) fail(cmd command, fs *flag.FlagSet, inv *invocation, err error) int {
	var ue usageError
	if errors.As(err, &ue) {
		if ue.oneLine {
			fmt.Fprintf(a.stderr, "brokerctl: %s: %s\n", cmd.name, ue.msg)
			return ExitUsage
		}
		fmt.Fprintf(a.stderr, "brokerctl: %s: %s\n%s", cmd.name, ue.msg, shortUsage(cmd))
		return ExitUsage
	}
	var es exitStatus
	if errors.As(err, &es) {
		return int(es)
	}
	st, ok := grpcStatus(err)
	if !ok {
		fmt.Fprintf(a.stderr, "brokerctl: %s: %v\n", cmd.name, err)
		return ExitError
	}
	msg := tidyMessage(st.Message())
	if st.Code() == codes.PermissionDenied {
		msg = permissionDenied(st)
	}
	if st.Code() == codes.DeadlineExceeded && inv.timeout > 0 {
		msg = fmt.Sprintf("no answer within --timeout %s: %s", inv.timeout, msg)
	}
	// Read the channel state once: it moves on while the client retries.
	unreachable := inv.unreachable(st.Code())
	if unreachable && answeredHTTP1(st.Message()) {
		// --addr names the HTTP API's port: one line saying so.
		fmt.Fprintf(a.stderr, "brokerctl: %s: %s answered HTTP/1.1, not gRPC: it is brokerd's HTTP API (--http-listen); point --addr (env %s) at brokerd's gRPC address (--listen), or leave it out to use the Unix socket (%s)\n",
			cmd.name, inv.endpointName(), endpoint.EnvAddr, codeName(st.Code()))
		return ExitError
	}
	if unreachable {
		msg = fmt.Sprintf("cannot reach brokerd at %s: %s", inv.endpointName(), msg)
	}
	fmt.Fprintf(a.stderr, "brokerctl: %s: %s (%s)\n", cmd.name, msg, codeName(st.Code()))
	if unreachable {
		fmt.Fprintf(a.stderr, "brokerctl: is brokerd running? Start it with \"make run\", or point --socket (env %s) or --addr (env %s) at a running brokerd\n",
			endpoint.EnvSocket, endpoint.EnvAddr)
	}
	return ExitError
}

// permissionDenied renders a PERMISSION_DENIED on one line naming the role
// the command needs, from brokerd's ErrorInfo (domain "brokerd", reason
// ROLE_REQUIRED) when it sent one.
func permissionDenied(st *status.Status) string {
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != "brokerd" || info.GetReason() != "ROLE_REQUIRED" {
			continue
		}
		md := info.GetMetadata()
		msg := fmt.Sprintf("permission denied: needs brokerd's %s role; brokerd saw %s", md["role"], md["caller"])
		if g := md["grant"]; g != "" {
			msg += "; " + g
		}
		return oneLine(msg)
	}
	msg := oneLine(st.Message())
	if !strings.HasPrefix(strings.ToLower(msg), "permission denied") {
		msg = "permission denied: " + msg
	}
	return msg
}

// sentinelTexts are the texts of brokerd's sentinel errors (lifecycle's
// ErrModelNotFound and ErrModelNotLoaded, the scheduler's and detect's
// ErrDeviceNotFound, the repository's ErrNotFound) that its messages carry
// as a ": "-separated part after, or before, a part that already says the
// same of the named model or device.
var sentinelTexts = map[string]bool{"model not found": true, "model not loaded": true, "device not found": true}

// tidyMessage says "not found" (or "not loaded") once: it drops a sentinel
// part of a server message when another part already says what is missing
// ("model \"x\" not found (Served: a): model not found" becomes "model \"x\"
// not found (Served: a)"; "model x: model not found: \"x\" is not in the
// repository" becomes "model x: \"x\" is not in the repository"). A
// sentinel that is the only statement ("device \"gpu:9\": device not
// found") stays.
func tidyMessage(msg string) string {
	parts := strings.Split(msg, ": ")
	var kept []string
	for i, p := range parts {
		if sentinelTexts[p] {
			rest := strings.Join(slices.Concat(kept, parts[i+1:]), ": ")
			if strings.Contains(rest, " not ") || strings.Contains(rest, " no ") {
				continue
			}
		}
		kept = append(kept, p)
	}
	return strings.Join(kept, ": ")
}

// answeredHTTP1 reports whether a connection error says the server spoke
// HTTP/1.1 where gRPC's HTTP/2 was expected (grpc-go reads the HTTP/1.1
// status line as a frame header and says so).
func answeredHTTP1(msg string) bool {
	return strings.Contains(msg, "looked like an HTTP/1.1 header")
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// grpcStatus finds a gRPC status anywhere in err's chain, keeping the
// server's own message (status.FromError would prefix the wrapping text).
func grpcStatus(err error) (*status.Status, bool) {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus(), true
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return status.New(codes.DeadlineExceeded, err.Error()), true
	}
	if errors.Is(err, context.Canceled) {
		return status.New(codes.Canceled, err.Error()), true
	}
	return nil, false
}

// codeName is the canonical name of a gRPC code, as the API contract spells
// it: NOT_FOUND, UNAVAILABLE, ...
func codeName(c codes.Code) string {
	return code.Code(c).String()
}

// parseInterspersed parses fs from args, collecting positional arguments
// between flags so "device gpu:0 --json" and "device --json gpu:0" both work.
// After "--" everything is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		consumed := args[:len(args)-len(rest)]
		if len(consumed) > 0 && consumed[len(consumed)-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// invocation is what a command's action works with: where to write, and a
// connection dialled on first use so that help and usage errors never dial.
type invocation struct {
	stdin         io.Reader // nil when there is none
	stdout        io.Writer
	stderr        io.Writer // notes that are not results (bench interrupted)
	socket, addr  string
	timeout       time.Duration
	defaultSocket string
	client        *client.Client
}

// connect returns a new client of the invocation's brokerd (the Go client
// library: brokerctl and it cannot drift apart).
func (inv *invocation) connect(ctx context.Context) (*client.Client, error) {
	opt := client.WithSocket(inv.socket)
	if inv.addr != "" {
		opt = client.WithAddress(inv.addr)
	}
	c, err := client.Dial(ctx, opt)
	if err != nil {
		return nil, fmt.Errorf("connect to brokerd: %w", err)
	}
	return c, nil
}

// lib is the invocation's client, connected on first use.
func (inv *invocation) lib(ctx context.Context) (*client.Client, error) {
	if inv.client == nil {
		c, err := inv.connect(ctx)
		if err != nil {
			return nil, err
		}
		inv.client = c
	}
	return inv.client, nil
}

func (inv *invocation) dial(ctx context.Context) (*grpc.ClientConn, error) {
	c, err := inv.lib(ctx)
	if err != nil {
		return nil, err
	}
	return c.Conn(), nil
}

func (inv *invocation) broker(ctx context.Context) (brokerv1.BrokerServiceClient, error) {
	conn, err := inv.dial(ctx)
	if err != nil {
		return nil, err
	}
	return brokerv1.NewBrokerServiceClient(conn), nil
}

func (inv *invocation) close() {
	if inv.client != nil {
		_ = inv.client.Close()
	}
}

// unreachable tells a failed connection from a server that answered
// UNAVAILABLE (draining): only the former leaves the channel not READY.
func (inv *invocation) unreachable(c codes.Code) bool {
	if c != codes.Unavailable && c != codes.DeadlineExceeded {
		return false
	}
	return inv.client != nil && inv.client.Conn().GetState() != connectivity.Ready
}

func (inv *invocation) endpointName() string {
	if inv.addr != "" {
		return "address " + inv.addr
	}
	return "socket " + inv.socket
}

// write sends a finished rendering to stdout in one call.
func (inv *invocation) write(b []byte) error {
	if _, err := inv.stdout.Write(b); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}

func (inv *invocation) writeJSON(m proto.Message) error {
	b, err := marshalJSON(m)
	if err != nil {
		return err
	}
	return inv.write(b)
}

func mainUsage(defaultSocket string) string {
	var b bytes.Buffer
	b.WriteString("brokerctl is the admin tool of brokerd, the per-host accelerator broker.\n\n")
	b.WriteString("usage: brokerctl [global flags] COMMAND [flags] [args]\n\ncommands:\n")
	cmds := commands()
	width := 0
	for _, c := range cmds {
		width = max(width, len(c.name))
	}
	for _, c := range cmds {
		fmt.Fprintf(&b, "  %-*s  %s\n", width, c.name, c.summary)
	}
	b.WriteString("\nglobal flags (also accepted after the command):\n")
	fmt.Fprintf(&b, "  --socket PATH     Unix socket of brokerd (env %s; default %s)\n", endpoint.EnvSocket, defaultSocket)
	fmt.Fprintf(&b, "  --addr HOST:PORT  TCP address of brokerd; wins over the socket (env %s)\n", endpoint.EnvAddr)
	fmt.Fprintf(&b, "  --timeout DUR     deadline for the whole command (default %s; for bench, for each request; load, unload and drain: none)\n", DefaultTimeout)
	b.WriteString("\nRun \"brokerctl help COMMAND\" for a command's flags.\n")
	return b.String()
}

// shortUsage is the line after a usage error: the command's synopsis and
// where its flags are, not every flag.
func shortUsage(c command) string {
	return fmt.Sprintf("usage: brokerctl %s (\"brokerctl help %s\" lists the flags)\n", c.synopsis, c.name)
}

func commandUsage(c command, fs *flag.FlagSet) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "usage: brokerctl %s\n  %s\n", c.synopsis, c.summary)
	var names []string
	fs.VisitAll(func(f *flag.Flag) {
		if !isGlobalFlag(f.Name) {
			names = append(names, f.Name)
		}
	})
	if len(names) > 0 {
		sort.Strings(names)
		b.WriteString("flags:\n")
		for _, n := range names {
			f := fs.Lookup(n)
			arg, usage := flag.UnquoteUsage(f)
			fmt.Fprintf(&b, "  --%s", strings.TrimSpace(n+" "+arg))
			// Zero defaults (empty, false, 0) say nothing worth printing.
			switch f.DefValue {
			case "", "false", "0":
			default:
				usage += " (default " + f.DefValue + ")"
			}
			fmt.Fprintf(&b, "\n      %s\n", usage)
		}
	}
	return b.String()
}
