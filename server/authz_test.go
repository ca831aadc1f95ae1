package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/server/config"
)

// TestMethodRolesCoverEveryRegisteredMethod enumerates the services the
// daemon registers (their ServiceDescs, as the server holds them) and fails
// for a method missing from methodRoles, so adding an RPC forces a decision
// about who may call it; and for a table entry nothing registers.
func TestMethodRolesCoverEveryRegisteredMethod(t *testing.T) {
	s := grpc.NewServer()
	registerAPI(s, &BrokerService{}, &InferenceService{}, health.NewServer())
	registered := map[string]bool{}
	for svc, info := range s.GetServiceInfo() {
		for _, m := range info.Methods {
			full := "/" + svc + "/" + m.Name
			registered[full] = true
			if _, ok := methodRoles[full]; !ok {
				t.Errorf("%s is registered but not in methodRoles: decide its role (it is admin-only until then)", full)
			}
		}
	}
	if len(registered) < 20 {
		t.Fatalf("only %d methods registered: registerAPI lost a service?", len(registered))
	}
	for m := range methodRoles {
		if !registered[m] {
			t.Errorf("methodRoles names %s, which no registered service has", m)
		}
	}
	for _, m := range []string{"CordonDevice", "UncordonDevice", "LoadModel", "UnloadModel", "Drain"} {
		if r := methodRole("/broker.v1.BrokerService/" + m); r != roleAdmin {
			t.Errorf("%s has role %s, want admin", m, r)
		}
	}
}

func unixCaller(uid, gid int, groups ...uint32) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{
		Addr:     &net.UnixAddr{Name: "@", Net: "unix"},
		AuthInfo: peerCredAuthInfo{UID: uid, GID: gid, PID: 4242, Groups: groups},
	})
}

func tlsCaller(cert *x509.Certificate, verified bool) context.Context {
	st := tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
	if verified {
		st.VerifiedChains = [][]*x509.Certificate{{cert}}
	}
	return peer.NewContext(context.Background(), &peer.Peer{
		Addr:     &net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 50000},
		AuthInfo: credentials.TLSInfo{State: st},
	})
}

func fakeCert(cn string, dns []string, uris []string, emails []string, ips []string) *x509.Certificate {
	c := &x509.Certificate{Subject: pkix.Name{CommonName: cn}, DNSNames: dns, EmailAddresses: emails, Issuer: pkix.Name{CommonName: "test CA"}}
	for _, u := range uris {
		pu, _ := url.Parse(u)
		c.URIs = append(c.URIs, pu)
	}
	for _, ip := range ips {
		c.IPAddresses = append(c.IPAddresses, net.ParseIP(ip))
	}
	return c
}

func mustIdentities(t *testing.T, entries ...string) []config.Identity {
	t.Helper()
	ids, err := config.Config{AdminIdentities: entries}.AdminIdentityList()
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestAuthorize(t *testing.T) {
	const (
		cordon = "/broker.v1.BrokerService/CordonDevice"
		drain  = "/broker.v1.BrokerService/Drain"
		encode = "/broker.v1.BrokerService/Encode"
		list   = "/broker.v1.BrokerService/ListDevices"
		check  = "/grpc.health.v1.Health/Check"
		infer  = "/inference.GRPCInferenceService/ModelInfer"
	)
	adm := admins{uids: []uint32{0, 1000}, gids: []uint32{50}, identities: mustIdentities(t,
		"uri:spiffe://example.org/ops", "dns:Admin.Example.org", "cn:ops-robot", "ip:10.9.9.9", "email:ops@example.org", "bare-name")}
	other := fakeCert("app", []string{"app.example.org"}, []string{"spiffe://example.org/app"}, nil, nil)
	plaintext := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 4000}})
	tests := []struct {
		name    string
		ctx     context.Context
		scope   listenerScope
		method  string
		allowed bool
		msg     []string // substrings of the PERMISSION_DENIED message
	}{
		{name: "root cordons", ctx: unixCaller(0, 0), method: cordon, allowed: true},
		{name: "configured uid drains", ctx: unixCaller(1000, 1000), method: drain, allowed: true},
		{name: "other uid cannot cordon", ctx: unixCaller(65534, 65534, 65534), method: cordon,
			msg: []string{cordon, "admin role", "uid 65534 (gid 65534, groups 65534, pid 4242) on the Unix socket", "--admin-uids 65534"}},
		{name: "other uid cannot drain", ctx: unixCaller(65534, 65534), method: drain, msg: []string{"groups none"}},
		{name: "other uid encodes", ctx: unixCaller(65534, 65534), method: encode, allowed: true},
		{name: "other uid lists devices", ctx: unixCaller(65534, 65534), method: list, allowed: true},
		{name: "other uid KServe infers", ctx: unixCaller(65534, 65534), method: infer, allowed: true},
		{name: "other uid health", ctx: unixCaller(65534, 65534), method: check, allowed: true},
		{name: "admin by supplementary group", ctx: unixCaller(7, 7, 3, 50), method: cordon, allowed: true},
		{name: "admin by primary group", ctx: unixCaller(7, 50), method: cordon, allowed: true},
		{name: "unknown method needs admin", ctx: unixCaller(65534, 65534), method: "/broker.v1.BrokerService/Generate2", msg: []string{"admin role"}},
		{name: "unknown method open to admin", ctx: unixCaller(0, 0), method: "/broker.v1.BrokerService/Generate2", allowed: true},
		{name: "admin certificate by URI", ctx: tlsCaller(fakeCert("x", nil, []string{"spiffe://example.org/ops"}, nil, nil), true), method: cordon, allowed: true},
		{name: "admin certificate by DNS, any case", ctx: tlsCaller(fakeCert("x", []string{"admin.example.ORG"}, nil, nil, nil), true), method: cordon, allowed: true},
		{name: "admin certificate by CN", ctx: tlsCaller(fakeCert("ops-robot", nil, nil, nil, nil), true), method: drain, allowed: true},
		{name: "admin certificate by IP", ctx: tlsCaller(fakeCert("x", nil, nil, nil, []string{"10.9.9.9"}), true), method: drain, allowed: true},
		{name: "admin certificate by email", ctx: tlsCaller(fakeCert("x", nil, nil, []string{"OPS@example.org"}, nil), true), method: drain, allowed: true},
		{name: "bare name matches a DNS SAN", ctx: tlsCaller(fakeCert("x", []string{"bare-name"}, nil, nil, nil), true), method: drain, allowed: true},
		{name: "typed entry wants its kind", ctx: tlsCaller(fakeCert("Admin.Example.org", nil, nil, nil, nil), true), method: drain,
			msg: []string{"[cn:Admin.Example.org]", "--admin-identities cn:Admin.Example.org"}},
		{name: "other certificate cannot cordon", ctx: tlsCaller(other, true), method: cordon,
			msg: []string{"client certificate [uri:spiffe://example.org/app dns:app.example.org cn:app] from 10.1.2.3:50000", "--admin-identities uri:spiffe://example.org/app"}},
		{name: "other certificate encodes", ctx: tlsCaller(other, true), method: encode, allowed: true},
		{name: "unverified certificate is nobody", ctx: tlsCaller(fakeCert("ops-robot", nil, nil, nil, nil), false), method: cordon,
			msg: []string{"without a verified client certificate"}},
		{name: "plaintext TCP cannot cordon", ctx: plaintext, method: cordon, msg: []string{"plaintext TCP (no identity)"}},
		{name: "plaintext TCP encodes", ctx: plaintext, method: encode, allowed: true},
		{name: "no peer at all", ctx: context.Background(), method: cordon, msg: []string{"an unidentified caller"}},
		{name: "health listener: health", ctx: plaintext, scope: scopeHealth, method: check, allowed: true},
		{name: "health listener: nothing else", ctx: unixCaller(0, 0), scope: scopeHealth, method: encode, msg: []string{"health listener"}},
		{name: "health listener: not even admin RPCs for root", ctx: unixCaller(0, 0), scope: scopeHealth, method: cordon, msg: []string{"health listener"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			a := &authorizer{admins: adm, scope: tt.scope, log: zap.NewNop(), denied: newDeniedCounter(reg)}
			_, err := a.authorize(tt.method, callerFrom(tt.ctx))
			denied := testutil.ToFloat64(a.denied.WithLabelValues(tt.method))
			if tt.allowed {
				if err != nil || denied != 0 {
					t.Fatalf("authorize: %v (denied counter %v), want allowed", err, denied)
				}
				return
			}
			st := status.Convert(err)
			if st.Code() != codes.PermissionDenied {
				t.Fatalf("authorize: %v, want PERMISSION_DENIED", err)
			}
			for _, s := range tt.msg {
				if !strings.Contains(st.Message(), s) {
					t.Errorf("message %q lacks %q", st.Message(), s)
				}
			}
			if denied != 1 {
				t.Errorf("brokerd_auth_denied_total{method=%q} = %v, want 1", tt.method, denied)
			}
			var info *errdetails.ErrorInfo
			for _, d := range st.Details() {
				if ei, ok := d.(*errdetails.ErrorInfo); ok {
					info = ei
				}
			}
			if info == nil || info.GetDomain() != "brokerd" || info.GetReason() != reasonRoleRequired || info.GetMetadata()["method"] != tt.method || info.GetMetadata()["role"] == "" {
				t.Errorf("ErrorInfo = %v", info)
			}
		})
	}
}

// TestAuthzInterceptorLogs checks the audit trail: an admin call is logged
// at info with who, what and the outcome, a refusal at warn, and data-plane
// calls not at all.
func TestAuthzInterceptorLogs(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	a := &authorizer{admins: admins{uids: []uint32{0}}, log: zap.New(core), denied: newDeniedCounter(prometheus.NewRegistry())}
	intercept := a.unary()
	call := func(ctx context.Context, method string, req any, err error) error {
		_, got := intercept(ctx, req, &grpc.UnaryServerInfo{FullMethod: method}, func(context.Context, any) (any, error) { return "ok", err })
		return got
	}

	if err := call(unixCaller(0, 0, 10), "/broker.v1.BrokerService/CordonDevice", &brokerv1.CordonDeviceRequest{Id: "gpu:1", Reason: "fan"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := call(unixCaller(0, 0), "/broker.v1.BrokerService/LoadModel", &brokerv1.LoadModelRequest{Name: "bert", Version: 2},
		status.Error(codes.NotFound, "no model bert")); status.Code(err) != codes.NotFound {
		t.Fatal(err)
	}
	if err := call(unixCaller(65534, 65534), "/broker.v1.BrokerService/Drain", &brokerv1.DrainRequest{Exit: true}, nil); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Drain by uid 65534: %v", err)
	}
	if err := call(unixCaller(65534, 65534), "/broker.v1.BrokerService/Encode", &brokerv1.EncodeRequest{}, nil); err != nil {
		t.Fatal(err)
	}

	entries := logs.AllUntimed()
	if len(entries) != 3 {
		t.Fatalf("%d log entries, want 3 (two admin calls, one refusal): %v", len(entries), entries)
	}
	want := []struct {
		level  zapcore.Level
		msg    string
		fields map[string]any
	}{
		{zapcore.InfoLevel, "admin call", map[string]any{"method": "/broker.v1.BrokerService/CordonDevice", "uid": int64(0), "pid": int64(4242),
			"groups": "10", "transport": "unix", "code": "OK", "request": map[string]any{"id": "gpu:1", "reason": "fan"}}},
		{zapcore.InfoLevel, "admin call", map[string]any{"method": "/broker.v1.BrokerService/LoadModel", "code": "NotFound",
			"error": "no model bert", "request": map[string]any{"name": "bert", "version": int64(2)}}},
		{zapcore.WarnLevel, "permission denied", map[string]any{"method": "/broker.v1.BrokerService/Drain", "uid": int64(65534), "role": "admin"}},
	}
	for i, w := range want {
		e := entries[i]
		if e.Level != w.level || e.Message != w.msg {
			t.Errorf("entry %d: %s %q, want %s %q", i, e.Level, e.Message, w.level, w.msg)
		}
		got := e.ContextMap()
		for k, v := range w.fields {
			if fmt.Sprint(got[k]) != fmt.Sprint(v) {
				t.Errorf("entry %d (%s): %s = %#v, want %#v", i, e.Message, k, got[k], v)
			}
		}
	}

	// A handler that panics is still audited, as INTERNAL.
	logs.TakeAll()
	func() {
		defer func() { _ = recover() }()
		_, _ = intercept(unixCaller(0, 0), &brokerv1.UnloadModelRequest{Name: "m"}, &grpc.UnaryServerInfo{FullMethod: "/broker.v1.BrokerService/UnloadModel"},
			func(context.Context, any) (any, error) { panic("boom") })
	}()
	if e := logs.All(); len(e) != 1 || e[0].ContextMap()["code"] != "Internal" {
		t.Errorf("panicking admin call logged as %v, want one entry with code Internal", e)
	}
}

func TestResolveAdmins(t *testing.T) {
	users := map[string]string{"alice": "1001"}
	groups := map[string]string{"ops": "60", "weird": "x"}
	lookup := func(m map[string]string) func(string) (string, error) {
		return func(n string) (string, error) {
			if v, ok := m[n]; ok {
				return v, nil
			}
			return "", errors.New("unknown name")
		}
	}
	tests := []struct {
		name              string
		uids, gids        config.List
		euid              int
		wantUIDs, wantGID []uint32
		wantErr           string
	}{
		{name: "defaults: root and brokerd's own uid", euid: 998, wantUIDs: []uint32{0, 998}, wantGID: []uint32{}},
		{name: "as root", euid: 0, wantUIDs: []uint32{0}, wantGID: []uint32{}},
		{name: "names and numbers", uids: config.List{"alice", "2000"}, gids: config.List{"ops", "70"}, euid: 998,
			wantUIDs: []uint32{0, 998, 1001, 2000}, wantGID: []uint32{60, 70}},
		{name: "unknown user", uids: config.List{"bob"}, wantErr: `admin-uids: "bob": unknown name`},
		{name: "unknown group", gids: config.List{"wheel"}, wantErr: `admin-groups: "wheel": unknown name`},
		{name: "group resolving to junk", gids: config.List{"weird"}, wantErr: `admin-groups: "weird" resolved to "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := resolveAdmins(config.Config{AdminUIDs: tt.uids, AdminGroups: tt.gids}, tt.euid, lookup(users), lookup(groups))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(a.uids, tt.wantUIDs) || !slices.Equal(a.gids, tt.wantGID) {
				t.Errorf("uids %v gids %v, want %v %v", a.uids, a.gids, tt.wantUIDs, tt.wantGID)
			}
		})
	}
}

// TestPeerCredentials connects to a real Unix socket and checks that the
// server side learns this process's uid, gid, pid and supplementary groups.
func TestPeerCredentials(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := net.Dial("unix", path)
		if err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1)) // until the server closes
		}
	}()
	sc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	_, ai, err := unixCreds{procfs: "/proc"}.ServerHandshake(sc)
	if err != nil {
		t.Fatal(err)
	}
	pc := ai.(peerCredAuthInfo)
	wantGroups, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, g := range pc.Groups {
		got = append(got, int(g))
	}
	slices.Sort(got)
	slices.Sort(wantGroups)
	if pc.UID != os.Geteuid() || pc.GID != os.Getegid() || pc.PID != os.Getpid() || pc.GroupsErr != nil || !slices.Equal(got, wantGroups) {
		t.Errorf("peer credentials %+v (groups %v), want uid %d gid %d pid %d groups %v", pc, got, os.Geteuid(), os.Getegid(), os.Getpid(), wantGroups)
	}
}

// TestProcGroups covers the fallback for kernels without SO_PEERGROUPS.
func TestProcGroups(t *testing.T) {
	root := t.TempDir()
	write := func(pid, body string) {
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pid, "status"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("100", "Name:\tclient\nUid:\t1000\t1001\t1001\t1001\nGid:\t50\t51\t51\t51\nFDSize:\t64\nGroups:\t4 24 27 \n")
	write("101", "Name:\tclient\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\n")
	write("102", "Name:\tclient\nUid:\t1001\t1001\t1001\t1001\nGid:\t51\t51\t51\t51\n")
	tests := []struct {
		name     string
		pid      int
		uid, gid int
		want     []uint32
		wantErr  string
	}{
		{name: "groups of the effective ids", pid: 100, uid: 1001, gid: 51, want: []uint32{4, 24, 27}},
		{name: "no supplementary groups", pid: 101, uid: 0, gid: 0, want: nil},
		{name: "pid reused by another user", pid: 100, uid: 1000, gid: 51, wantErr: "not 1000 as at connect"},
		{name: "no Groups line", pid: 102, uid: 1001, gid: 51, wantErr: "no Uid, Gid or Groups line"},
		{name: "process gone", pid: 103, uid: 1, gid: 1, wantErr: "no such file"},
		{name: "pid not visible", pid: 0, uid: 1, gid: 1, wantErr: "no pid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := procGroups(root, tt.pid, tt.uid, tt.gid)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("procGroups = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}
