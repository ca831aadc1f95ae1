package daemon

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
	"github.com/brokerd/brokerd/server/config"
)

// The helper process's environment: the socket to call and the calls to make.
const (
	helperSocketEnv = "BROKERD_AUTHZ_HELPER_SOCKET"
	helperCallsEnv  = "BROKERD_AUTHZ_HELPER_CALLS"
	helperPrefix    = "authz-result "
)

// roleCalls are the calls the helper can make, each one RPC.
var roleCalls = map[string]func(context.Context, *grpc.ClientConn) error{
	"health": func(ctx context.Context, c *grpc.ClientConn) error {
		_, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	},
	"encode": func(ctx context.Context, c *grpc.ClientConn) error {
		_, err := brokerv1.NewBrokerServiceClient(c).Encode(ctx, &brokerv1.EncodeRequest{Items: textItems("from another user")})
		return err
	},
	"devices": func(ctx context.Context, c *grpc.ClientConn) error {
		_, err := brokerv1.NewBrokerServiceClient(c).ListDevices(ctx, &brokerv1.ListDevicesRequest{})
		return err
	},
	"kserve-live": func(ctx context.Context, c *grpc.ClientConn) error {
		_, err := inference.NewGRPCInferenceServiceClient(c).ServerLive(ctx, &inference.ServerLiveRequest{})
		return err
	},
	"cordon": func(ctx context.Context, c *grpc.ClientConn) error {
		_, err := brokerv1.NewBrokerServiceClient(c).CordonDevice(ctx, &brokerv1.CordonDeviceRequest{Id: "tpu:3", Reason: "test"})
		return err
	},
	"uncordon": func(ctx context.Context, c *grpc.ClientConn) error {
		_, err := brokerv1.NewBrokerServiceClient(c).UncordonDevice(ctx, &brokerv1.UncordonDeviceRequest{Id: "tpu:3"})
		return err
	},
	"load": func(ctx context.Context, c *grpc.ClientConn) error {
		_, err := brokerv1.NewBrokerServiceClient(c).LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "no-such-model"})
		return err
	},
	"unload": func(ctx context.Context, c *grpc.ClientConn) error {
		_, err := brokerv1.NewBrokerServiceClient(c).UnloadModel(ctx, &brokerv1.UnloadModelRequest{Name: "nbmf-hash-v1"})
		return err
	},
	"kserve-index": func(ctx context.Context, c *grpc.ClientConn) error {
		_, err := inference.NewGRPCInferenceServiceClient(c).RepositoryIndex(ctx, &inference.RepositoryIndexRequest{})
		return err
	},
	"kserve-load": func(ctx context.Context, c *grpc.ClientConn) error {
		_, err := inference.NewGRPCInferenceServiceClient(c).RepositoryModelLoad(ctx, &inference.RepositoryModelLoadRequest{ModelName: "no-such-model"})
		return err
	},
	"kserve-unload": func(ctx context.Context, c *grpc.ClientConn) error {
		_, err := inference.NewGRPCInferenceServiceClient(c).RepositoryModelUnload(ctx, &inference.RepositoryModelUnloadRequest{ModelName: "nbmf-hash-v1"})
		return err
	},
	"kserve-log": func(ctx context.Context, c *grpc.ClientConn) error {
		_, err := inference.NewGRPCInferenceServiceClient(c).LogSettings(ctx, &inference.LogSettingsRequest{})
		return err
	},
	"drain": func(ctx context.Context, c *grpc.ClientConn) error {
		_, err := brokerv1.NewBrokerServiceClient(c).Drain(ctx, &brokerv1.DrainRequest{Exit: true})
		return err
	},
}

// TestAuthzHelperProcess is not a test: TestUnixSocketRoles runs this test
// binary as another user with the helper environment set, and this makes the
// calls it names and prints each one's code.
func TestAuthzHelperProcess(t *testing.T) {
	sock := os.Getenv(helperSocketEnv)
	if sock == "" {
		t.Skip("the client half of TestUnixSocketRoles; runs only as its child")
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println(helperPrefix+"dial", err)
		os.Exit(1)
	}
	defer conn.Close()
	for _, name := range strings.Split(os.Getenv(helperCallsEnv), ",") {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := roleCalls[name](ctx, conn)
		cancel()
		fmt.Printf("%s%s %d %s\n", helperPrefix, name, status.Code(err), strings.ReplaceAll(status.Convert(err).Message(), "\n", " "))
	}
}

// clientAs runs the helper as uid/gid with the given supplementary groups,
// and returns each call's code and message.
func clientAs(t *testing.T, bin, sock string, uid, gid uint32, groups []uint32, calls ...string) map[string]status.Status {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^TestAuthzHelperProcess$", "-test.count=1")
	cmd.Env = []string{helperSocketEnv + "=" + sock, helperCallsEnv + "=" + strings.Join(calls, ","), "HOME=/nonexistent", "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper as uid %d: %v\n%s", uid, err, out)
	}
	got := map[string]status.Status{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), helperPrefix)
		if !ok {
			continue
		}
		f := strings.SplitN(line, " ", 3)
		if len(f) < 3 {
			t.Fatalf("helper printed %q", sc.Text())
		}
		code, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			t.Fatalf("helper printed code %q: %v", f[1], err)
		}
		got[f[0]] = *status.New(codes.Code(code), f[2])
	}
	if len(got) != len(calls) {
		t.Fatalf("helper answered %d of %d calls:\n%s", len(got), len(calls), out)
	}
	return got
}

// copyExecutable copies this test binary where another user can run it:
// go test builds it in a directory only its owner may enter.
func copyExecutable(t *testing.T, dir string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst := filepath.Join(dir, "authz-client.test")
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, src); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestUnixSocketRoles is finding 3 of issue 10 over a real socket: a member
// of the socket's group who is not an admin encodes and reads the inventory,
// but gets PERMISSION_DENIED for Cordon, Uncordon, Load, Unload and Drain
// (and brokerd keeps serving); a configured admin uid, and a member of a
// configured admin group, administer it.
func TestUnixSocketRoles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the client runs as other uids through SysProcAttr.Credential")
	}
	const (
		nobody      = 65534
		socketGroup = 65533 // the socket's group: data-plane users
		adminGroup  = 65532
		adminUID    = 65531
	)
	cfg := testConfig(t)
	cfg.AdminUIDs = config.List{fmt.Sprint(adminUID)}
	cfg.AdminGroups = config.List{fmt.Sprint(adminGroup)}
	// The socket's directory and its parent (t.TempDir's, 0700) must let
	// other users reach the socket; the socket itself (0660) is the group's.
	dir := filepath.Dir(cfg.Socket)
	for _, p := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	bin := copyExecutable(t, dir)
	d := startDaemon(t, cfg)
	if err := os.Chown(d.addrs.Socket, -1, socketGroup); err != nil {
		t.Fatal(err)
	}

	adminCalls := []string{"cordon", "uncordon", "load", "unload", "kserve-load", "kserve-unload", "kserve-log", "drain"}
	t.Run("group member without admin", func(t *testing.T) {
		got := clientAs(t, bin, d.addrs.Socket, nobody, nobody, []uint32{socketGroup},
			append([]string{"health", "encode", "devices", "kserve-live", "kserve-index"}, adminCalls...)...)
		for _, call := range []string{"health", "encode", "devices", "kserve-live", "kserve-index"} {
			if st := got[call]; st.Code() != codes.OK {
				t.Errorf("%s as uid %d: %v, want OK", call, nobody, st.Err())
			}
		}
		for _, call := range adminCalls {
			st := got[call]
			if st.Code() != codes.PermissionDenied {
				t.Errorf("%s as uid %d: %v, want PERMISSION_DENIED", call, nobody, st.Err())
				continue
			}
			want := fmt.Sprintf("uid %d (gid %d, groups %d", nobody, nobody, socketGroup)
			if !strings.Contains(st.Message(), want) || !strings.Contains(st.Message(), "--admin-uids 65534") {
				t.Errorf("%s: message %q does not name %q and how to grant it", call, st.Message(), want)
			}
		}
	})
	t.Run("still serving after the refused drain", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		hc, err := healthpb.NewHealthClient(d.conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health after refused drain: %v, %v", hc, err)
		}
		dev, err := brokerv1.NewBrokerServiceClient(d.conn).GetDevice(ctx, &brokerv1.GetDeviceRequest{Id: "tpu:3"})
		if err != nil || dev.GetDevice().GetCordoned() {
			t.Fatalf("tpu:3 after a refused cordon: %v, %v", dev, err)
		}
	})
	t.Run("admin by supplementary group", func(t *testing.T) {
		got := clientAs(t, bin, d.addrs.Socket, nobody, nobody, []uint32{socketGroup, adminGroup}, "cordon", "uncordon")
		for call, st := range got {
			if st.Code() != codes.OK {
				t.Errorf("%s as a member of admin group %d: %v", call, adminGroup, st.Err())
			}
		}
	})
	t.Run("admin group after 100 others", func(t *testing.T) {
		// More groups than peerGroups' first buffer: the kernel asks for a
		// bigger one (ERANGE) and the admin group at the end still counts.
		groups := []uint32{socketGroup}
		for g := uint32(70000); g < 70100; g++ {
			groups = append(groups, g)
		}
		got := clientAs(t, bin, d.addrs.Socket, nobody, nobody, append(groups, adminGroup), "cordon", "uncordon")
		for call, st := range got {
			if st.Code() != codes.OK {
				t.Errorf("%s with admin group %d last of %d: %v", call, adminGroup, len(groups)+1, st.Err())
			}
		}
	})
	t.Run("admin by uid", func(t *testing.T) {
		got := clientAs(t, bin, d.addrs.Socket, adminUID, socketGroup, nil, "cordon", "uncordon")
		for call, st := range got {
			if st.Code() != codes.OK {
				t.Errorf("%s as admin uid %d: %v", call, adminUID, st.Err())
			}
		}
	})
	t.Run("brokerd's own user administers", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := roleCalls["cordon"](ctx, d.conn); err != nil {
			t.Errorf("cordon as uid %d: %v", os.Geteuid(), err)
		}
	})
	t.Run("refusals counted", func(t *testing.T) {
		body := scrape(t, d.addrs.Metrics)
		for _, m := range []string{"CordonDevice", "UncordonDevice", "LoadModel", "UnloadModel", "Drain"} {
			want := fmt.Sprintf(`brokerd_auth_denied_total{method="/broker.v1.BrokerService/%s"} 1`, m)
			if !strings.Contains(body, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
	})
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// testCA is a certificate authority for client certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T, dir string) (*testCA, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "brokerd test client CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "client-ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key}, path
}

// issue signs a client certificate.
func (ca *testCA) issue(t *testing.T, tmpl *x509.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestTLSRoles: over mutual TLS, a certificate named in --admin-identities
// administers brokerd; another certificate from the same CA gets the data
// plane and the inventory, and PERMISSION_DENIED for administration.
func TestTLSRoles(t *testing.T) {
	dir := t.TempDir()
	srvCert, srvKey, srvPool := writeCert(t, dir, "server")
	ca, caFile := newTestCA(t, dir)
	spiffe, _ := url.Parse("spiffe://brokerd.test/ops")
	admin := ca.issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "ops"}, URIs: []*url.URL{spiffe}})
	app := ca.issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "app"}, DNSNames: []string{"app.brokerd.test"}})

	cfg := testConfig(t)
	cfg.Listen = "127.0.0.1:0"
	cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA = srvCert, srvKey, caFile
	cfg.AdminIdentities = config.List{"uri:spiffe://brokerd.test/ops"}
	d := startDaemon(t, cfg)

	dial := func(cert tls.Certificate) *grpc.ClientConn {
		conn, err := grpc.NewClient(d.addrs.TCP, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: srvPool, Certificates: []tls.Certificate{cert}})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	tests := []struct {
		name  string
		conn  *grpc.ClientConn
		call  string
		want  codes.Code
		inMsg string
	}{
		{"app encodes", dial(app), "encode", codes.OK, ""},
		{"app lists devices", dial(app), "devices", codes.OK, ""},
		{"app checks health", dial(app), "health", codes.OK, ""},
		{"app cannot cordon", dial(app), "cordon", codes.PermissionDenied, "client certificate [dns:app.brokerd.test cn:app]"},
		{"app cannot load", dial(app), "load", codes.PermissionDenied, "--admin-identities dns:app.brokerd.test"},
		{"app cannot drain", dial(app), "drain", codes.PermissionDenied, "admin role"},
		{"admin cordons", dial(admin), "cordon", codes.OK, ""},
		{"admin uncordons", dial(admin), "uncordon", codes.OK, ""},
		{"admin loads (the model is unknown)", dial(admin), "load", codes.NotFound, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := roleCalls[tt.call](ctx, tt.conn)
			if status.Code(err) != tt.want || !strings.Contains(status.Convert(err).Message(), tt.inMsg) {
				t.Errorf("%s: %v, want %s with %q", tt.call, err, tt.want, tt.inMsg)
			}
		})
	}
}
