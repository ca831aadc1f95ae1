package server

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
	"github.com/brokerd/brokerd/server/config"
)

// role is what a method needs of its caller.
type role int

const (
	// roleAdmin is the zero value: a method missing from methodRoles needs
	// an admin, so a new RPC is closed until someone decides otherwise.
	roleAdmin role = iota
	// roleHealth: health checks, answered on every listener to everyone.
	roleHealth
	// roleData: the data plane, open to whoever reaches the socket (its
	// group) or holds a certificate of the TCP listener's client CA.
	roleData
	// roleInventory: read-only views of devices, models, plans and queues,
	// open to the data plane like roleData (clients pick models and devices
	// from them); kept apart so it can be closed by changing one line.
	roleInventory
)

func (r role) String() string {
	switch r {
	case roleHealth:
		return "health"
	case roleData:
		return "data-plane"
	case roleInventory:
		return "inventory"
	}
	return "admin"
}

// methodRoles is the whole access policy: every registered method, by full
// name. TestMethodRolesCoverEveryRegisteredMethod fails when a registered
// method is missing, and a missing one needs an admin at run time.
var methodRoles = map[string]role{
	brokerv1.BrokerService_Encode_FullMethodName:         roleData,
	brokerv1.BrokerService_EncodeStream_FullMethodName:   roleData,
	brokerv1.BrokerService_Infer_FullMethodName:          roleData,
	brokerv1.BrokerService_Generate_FullMethodName:       roleData,
	brokerv1.BrokerService_Chat_FullMethodName:           roleData,
	brokerv1.BrokerService_Tokenize_FullMethodName:       roleData,
	brokerv1.BrokerService_Detokenize_FullMethodName:     roleData,
	brokerv1.BrokerService_ListDevices_FullMethodName:    roleInventory,
	brokerv1.BrokerService_GetDevice_FullMethodName:      roleInventory,
	brokerv1.BrokerService_GetReport_FullMethodName:      roleInventory,
	brokerv1.BrokerService_GetBatchPlan_FullMethodName:   roleInventory,
	brokerv1.BrokerService_ListModels_FullMethodName:     roleInventory,
	brokerv1.BrokerService_GetStats_FullMethodName:       roleInventory,
	brokerv1.BrokerService_LoadModel_FullMethodName:      roleAdmin,
	brokerv1.BrokerService_UnloadModel_FullMethodName:    roleAdmin,
	brokerv1.BrokerService_CordonDevice_FullMethodName:   roleAdmin,
	brokerv1.BrokerService_UncordonDevice_FullMethodName: roleAdmin,
	brokerv1.BrokerService_Drain_FullMethodName:          roleAdmin,

	// KServe v2: liveness and readiness are part of its data plane (Triton
	// clients poll them before inferring); metadata is inventory.
	inference.GRPCInferenceService_ServerLive_FullMethodName:     roleData,
	inference.GRPCInferenceService_ServerReady_FullMethodName:    roleData,
	inference.GRPCInferenceService_ModelReady_FullMethodName:     roleData,
	inference.GRPCInferenceService_ModelInfer_FullMethodName:     roleData,
	inference.GRPCInferenceService_ServerMetadata_FullMethodName: roleInventory,
	inference.GRPCInferenceService_ModelMetadata_FullMethodName:  roleInventory,
	// Triton's extensions: the decoupled stream is inference; configuration,
	// statistics and the repository index are read-only inventory; loads,
	// unloads and log settings change brokerd. The shared-memory and trace
	// RPCs only say brokerd has none, to anyone.
	inference.GRPCInferenceService_ModelStreamInfer_FullMethodName:             roleData,
	inference.GRPCInferenceService_ModelConfig_FullMethodName:                  roleInventory,
	inference.GRPCInferenceService_ModelStatistics_FullMethodName:              roleInventory,
	inference.GRPCInferenceService_RepositoryIndex_FullMethodName:              roleInventory,
	inference.GRPCInferenceService_RepositoryModelLoad_FullMethodName:          roleAdmin,
	inference.GRPCInferenceService_RepositoryModelUnload_FullMethodName:        roleAdmin,
	inference.GRPCInferenceService_LogSettings_FullMethodName:                  roleAdmin,
	inference.GRPCInferenceService_TraceSetting_FullMethodName:                 roleData,
	inference.GRPCInferenceService_SystemSharedMemoryStatus_FullMethodName:     roleData,
	inference.GRPCInferenceService_SystemSharedMemoryRegister_FullMethodName:   roleData,
	inference.GRPCInferenceService_SystemSharedMemoryUnregister_FullMethodName: roleData,
	inference.GRPCInferenceService_CudaSharedMemoryStatus_FullMethodName:       roleData,
	inference.GRPCInferenceService_CudaSharedMemoryRegister_FullMethodName:     roleData,
	inference.GRPCInferenceService_CudaSharedMemoryUnregister_FullMethodName:   roleData,

	healthpb.Health_Check_FullMethodName: roleHealth,
	healthpb.Health_Watch_FullMethodName: roleHealth,
	healthpb.Health_List_FullMethodName:  roleHealth,

	// Reflection describes the API, nothing about the host.
	reflectionv1.ServerReflection_ServerReflectionInfo_FullMethodName:      roleInventory,
	reflectionv1alpha.ServerReflection_ServerReflectionInfo_FullMethodName: roleInventory,
}

// methodRole is the role method needs: admin when it is not in the table.
func methodRole(method string) role {
	return methodRoles[method] // the zero value is roleAdmin
}

// listenerScope is what a listener serves at most.
type listenerScope int

const (
	scopeAPI    listenerScope = iota // the Unix socket and the TCP listener
	scopeHealth                      // --health-listen: health checks only
)

// admins is who holds the admin role.
type admins struct {
	uids, gids []uint32 // Unix socket: peer uid, or primary or supplementary gid
	identities []config.Identity
}

// resolveAdmins builds the admins from the settings: root and euid (brokerd's
// own user, who can signal or replace brokerd anyway) always, plus
// --admin-uids and --admin-groups, whose names are resolved now.
func resolveAdmins(cfg config.Config, euid int, lookupUser, lookupGroup func(string) (string, error)) (admins, error) {
	uids, err := config.ResolveIDs("admin-uids", cfg.AdminUIDs, lookupUser)
	if err != nil {
		return admins{}, err
	}
	gids, err := config.ResolveIDs("admin-groups", cfg.AdminGroups, lookupGroup)
	if err != nil {
		return admins{}, err
	}
	ids, err := cfg.AdminIdentityList()
	if err != nil {
		return admins{}, fmt.Errorf("admin-identities: %w", err)
	}
	uids = append(uids, 0)
	if euid >= 0 {
		uids = append(uids, uint32(euid))
	}
	slices.Sort(uids)
	return admins{uids: slices.Compact(uids), gids: gids, identities: ids}, nil
}

// osLookupUser and osLookupGroup resolve names through the system's user and
// group databases.
func osLookupUser(name string) (string, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return "", err
	}
	return u.Uid, nil
}

func osLookupGroup(name string) (string, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return "", err
	}
	return g.Gid, nil
}

// caller is who made a call, as the transport established it.
type caller struct {
	transport string // "unix", "tls" or "tcp" (plaintext loopback)
	addr      string
	// Unix socket peer credentials; uid -1 when unknown.
	uid, gid, pid int
	groups        []uint32
	groupsErr     error
	// cert is the verified client certificate on mutual TLS, else nil.
	cert *x509.Certificate
}

func callerFrom(ctx context.Context) caller {
	c := caller{transport: "unknown", uid: -1, gid: -1, pid: -1}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return c
	}
	if p.Addr != nil {
		c.addr = p.Addr.String()
	}
	switch ai := p.AuthInfo.(type) {
	case peerCredAuthInfo:
		c.transport = "unix"
		c.uid, c.gid, c.pid, c.groups, c.groupsErr = ai.UID, ai.GID, ai.PID, ai.Groups, ai.GroupsErr
	case credentials.TLSInfo:
		c.transport = "tls"
		// Only a chain the server verified against --tls-client-ca names
		// anyone; PeerCertificates alone are whatever the client sent.
		if len(ai.State.VerifiedChains) > 0 && len(ai.State.VerifiedChains[0]) > 0 {
			c.cert = ai.State.VerifiedChains[0][0]
		}
	default:
		if p.Addr != nil && p.Addr.Network() == "tcp" {
			c.transport = "tcp"
		}
	}
	return c
}

// certNames lists a certificate's names as admin-identities spells them,
// most specific first.
func certNames(cert *x509.Certificate) []config.Identity {
	var out []config.Identity
	for _, u := range cert.URIs {
		out = append(out, config.Identity{Kind: "uri", Value: u.String()})
	}
	for _, d := range cert.DNSNames {
		out = append(out, config.Identity{Kind: "dns", Value: d})
	}
	for _, e := range cert.EmailAddresses {
		out = append(out, config.Identity{Kind: "email", Value: e})
	}
	for _, ip := range cert.IPAddresses {
		out = append(out, config.Identity{Kind: "ip", Value: ip.String()})
	}
	if cert.Subject.CommonName != "" {
		out = append(out, config.Identity{Kind: "cn", Value: cert.Subject.CommonName})
	}
	return out
}

// identityMatches reports whether a certificate name satisfies an
// admin-identities entry: same kind (any for a bare entry) and the same
// value, ignoring case for DNS names and emails.
func identityMatches(want, got config.Identity) bool {
	if want.Kind != "" && want.Kind != got.Kind {
		return false
	}
	switch got.Kind {
	case "dns", "email":
		return strings.EqualFold(want.Value, got.Value)
	case "ip":
		w := net.ParseIP(want.Value)
		return w != nil && w.Equal(net.ParseIP(got.Value))
	}
	return want.Value == got.Value
}

// isAdmin decides the admin role for c.
func (a admins) isAdmin(c caller) bool {
	switch c.transport {
	case "unix":
		if c.uid >= 0 && slices.Contains(a.uids, uint32(c.uid)) {
			return true
		}
		if c.gid >= 0 && slices.Contains(a.gids, uint32(c.gid)) {
			return true
		}
		for _, g := range c.groups {
			if slices.Contains(a.gids, g) {
				return true
			}
		}
	case "tls":
		if c.cert == nil {
			return false
		}
		for _, got := range certNames(c.cert) {
			for _, want := range a.identities {
				if identityMatches(want, got) {
					return true
				}
			}
		}
	}
	return false
}

func joinIDs(ids []uint32) string {
	s := make([]string, len(ids))
	for i, g := range ids {
		s[i] = strconv.FormatUint(uint64(g), 10)
	}
	return strings.Join(s, ",")
}

// String describes the caller for messages and logs.
func (c caller) String() string {
	switch c.transport {
	case "unix":
		groups := joinIDs(c.groups)
		if c.groupsErr != nil {
			groups = "unknown"
		} else if groups == "" {
			groups = "none"
		}
		return fmt.Sprintf("uid %d (gid %d, groups %s, pid %d) on the Unix socket", c.uid, c.gid, groups, c.pid)
	case "tls":
		if c.cert == nil {
			return fmt.Sprintf("%s over TLS without a verified client certificate", c.addr)
		}
		names := certNames(c.cert)
		s := make([]string, len(names))
		for i, n := range names {
			s[i] = n.String()
		}
		return fmt.Sprintf("client certificate [%s] from %s", strings.Join(s, " "), c.addr)
	case "tcp":
		return fmt.Sprintf("%s over plaintext TCP (no identity)", c.addr)
	}
	return "an unidentified caller"
}

// grant tells an operator how to make c an admin.
func (c caller) grant() string {
	switch c.transport {
	case "unix":
		return fmt.Sprintf("to grant it, start brokerd with --admin-uids %d (env BROKERD_ADMIN_UIDS), or --admin-groups naming one of its groups (BROKERD_ADMIN_GROUPS)", c.uid)
	case "tls":
		if c.cert != nil {
			if names := certNames(c.cert); len(names) > 0 {
				return fmt.Sprintf("to grant it, start brokerd with --admin-identities %s (env BROKERD_ADMIN_IDENTITIES)", names[0])
			}
		}
		return "on TCP only a client certificate verified by --tls-client-ca and named in --admin-identities is an admin"
	}
	return "administer brokerd over its Unix socket as an admin user, or over mutual TLS with a certificate named in --admin-identities"
}

// fields are the caller's log fields.
func (c caller) fields() []zap.Field {
	fs := []zap.Field{zap.String("transport", c.transport)}
	if c.addr != "" {
		fs = append(fs, zap.String("remote", c.addr))
	}
	switch {
	case c.transport == "unix":
		fs = append(fs, zap.Int("uid", c.uid), zap.Int("gid", c.gid), zap.Int("pid", c.pid))
		if c.groupsErr != nil {
			fs = append(fs, zap.NamedError("groups_error", c.groupsErr))
		} else {
			fs = append(fs, zap.String("groups", joinIDs(c.groups)))
		}
	case c.cert != nil:
		names := certNames(c.cert)
		s := make([]string, len(names))
		for i, n := range names {
			s[i] = n.String()
		}
		fs = append(fs, zap.Strings("identities", s), zap.String("issuer", c.cert.Issuer.String()),
			zap.String("serial", c.cert.SerialNumber.String()))
	}
	return fs
}

// authorizer is the one place that lets a call through or not: every unary
// and stream call of a listener passes it.
type authorizer struct {
	admins admins
	scope  listenerScope
	log    *zap.Logger
	denied *prometheus.CounterVec
}

// newDeniedCounter is brokerd_auth_denied_total{method}, shared by the
// listeners' authorizers.
func newDeniedCounter(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "brokerd", Subsystem: "auth", Name: "denied_total",
		Help: "Calls refused with PERMISSION_DENIED, by method.",
	}, []string{"method"})
	reg.MustRegister(c)
	return c
}

// errorDomain and reasonRoleRequired mark a PERMISSION_DENIED's ErrorInfo.
const (
	errorDomain        = "brokerd"
	reasonRoleRequired = "ROLE_REQUIRED"
)

// authorize returns the method's role, or PERMISSION_DENIED (logged and
// counted) when c may not call it.
func (a *authorizer) authorize(method string, c caller) (role, error) {
	r := methodRole(method)
	var msg string
	switch {
	case a.scope == scopeHealth && r != roleHealth:
		msg = fmt.Sprintf("%s is not served on the health listener: it answers grpc.health.v1 only", method)
	case r != roleAdmin:
		return r, nil
	case a.admins.isAdmin(c):
		return r, nil
	default:
		msg = fmt.Sprintf("%s needs the %s role; brokerd saw %s, which is not an admin; %s", method, r, c, c.grant())
	}
	a.denied.WithLabelValues(method).Inc()
	a.log.Warn("permission denied", append([]zap.Field{zap.String("method", method), zap.Stringer("role", r)}, c.fields()...)...)
	st := status.New(codes.PermissionDenied, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reasonRoleRequired, Domain: errorDomain, Metadata: map[string]string{
		"method": method, "role": r.String(), "caller": c.String(), "grant": c.grant(),
	}}); err == nil {
		st = d
	}
	return r, st.Err()
}

// audit logs an admin call once it has ended: who, what and the outcome.
// panicked is true when the handler did not return (the recovering
// interceptor outside turns that into INTERNAL).
func (a *authorizer) audit(method string, c caller, req any, start time.Time, err error, panicked bool) {
	code := status.Code(err)
	if panicked {
		code = codes.Internal
	}
	fs := append([]zap.Field{zap.String("method", method)}, c.fields()...)
	if rf := requestFields(req); len(rf) > 0 {
		fs = append(fs, zap.Dict("request", rf...))
	}
	fs = append(fs, zap.Stringer("code", code), zap.Duration("took", time.Since(start)))
	if err != nil {
		fs = append(fs, zap.String("error", status.Convert(err).Message()))
	}
	a.log.Info("admin call", fs...)
}

// requestFields are a request's top-level scalar fields (model name and
// version, device ID, reason, exit ...): enough to say what an admin did
// without logging payloads.
func requestFields(req any) []zap.Field {
	m, ok := req.(proto.Message)
	if !ok || m == nil {
		return nil
	}
	var fs []zap.Field
	r := m.ProtoReflect()
	// In declaration order (Range's order varies), so log lines compare.
	fields := r.Descriptor().Fields()
	for i := 0; i < fields.Len() && len(fs) < 16; i++ {
		fd := fields.Get(i)
		if fd.IsList() || fd.IsMap() || !r.Has(fd) {
			continue
		}
		v := r.Get(fd)
		name := string(fd.Name())
		switch fd.Kind() {
		case protoreflect.MessageKind, protoreflect.GroupKind:
		case protoreflect.BytesKind:
			fs = append(fs, zap.Int(name+"_bytes", len(v.Bytes())))
		case protoreflect.StringKind:
			s := v.String()
			if len(s) > 256 {
				s = s[:256] + "…"
			}
			fs = append(fs, zap.String(name, s))
		case protoreflect.EnumKind:
			if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
				fs = append(fs, zap.String(name, string(ev.Name())))
			} else {
				fs = append(fs, zap.Int32(name, int32(v.Enum())))
			}
		default:
			fs = append(fs, zap.Any(name, v.Interface()))
		}
	}
	return fs
}

func (a *authorizer) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		c := callerFrom(ctx)
		r, err := a.authorize(info.FullMethod, c)
		if err != nil {
			return nil, err
		}
		if r != roleAdmin {
			return handler(ctx, req)
		}
		start, returned := time.Now(), false
		defer func() { a.audit(info.FullMethod, c, req, start, err, !returned) }()
		resp, err = handler(ctx, req)
		returned = true
		return resp, err
	}
}

func (a *authorizer) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		c := callerFrom(ss.Context())
		r, err := a.authorize(info.FullMethod, c)
		if err != nil {
			return err
		}
		if r != roleAdmin {
			return handler(srv, ss)
		}
		start, returned := time.Now(), false
		defer func() { a.audit(info.FullMethod, c, nil, start, err, !returned) }()
		err = handler(srv, ss)
		returned = true
		return err
	}
}
