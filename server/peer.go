package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/brokerd/brokerd/server/httpapi"
)

// unixCreds is the transport security of the Unix socket: no encryption (the
// socket's file mode guards it), but each connection learns its client's uid,
// gid, pid (SO_PEERCRED) and supplementary groups from the kernel. The
// scheduler uses the uid as the client identity for fairness, the authorizer
// all of them to tell admins from the data plane. procfs is the /proc root
// read for the groups on kernels without SO_PEERGROUPS.
type unixCreds struct{ procfs string }

// peerCredAuthInfo is the AuthInfo of a Unix socket connection.
type peerCredAuthInfo struct {
	credentials.CommonAuthInfo
	UID, GID, PID int
	// Groups are the peer's supplementary groups when it connected; nil with
	// GroupsErr set when they could not be learnt (then only the uid and
	// primary gid count).
	Groups    []uint32
	GroupsErr error
}

func (peerCredAuthInfo) AuthType() string { return "peercred" }

func (unixCreds) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, peerCredAuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, UID: -1, GID: -1, PID: -1}, nil
}

// unixConn finds the Unix socket under wrappers (the connection limits')
// that expose it with Unwrap.
func unixConn(c net.Conn) (*net.UnixConn, bool) {
	for {
		switch x := c.(type) {
		case *net.UnixConn:
			return x, true
		case interface{ Unwrap() net.Conn }:
			c = x.Unwrap()
		default:
			return nil, false
		}
	}
}

func (u unixCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	uc, ok := unixConn(c)
	if !ok {
		return c, peerCredAuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, UID: -1, GID: -1, PID: -1}, nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, nil, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return nil, nil, fmt.Errorf("peer credentials: %w", err)
	}
	if credErr != nil {
		return nil, nil, fmt.Errorf("peer credentials: %w", credErr)
	}
	ai := peerCredAuthInfo{
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
		UID:            int(cred.Uid), GID: int(cred.Gid), PID: int(cred.Pid),
	}
	var groupsErr error
	if err := raw.Control(func(fd uintptr) { ai.Groups, groupsErr = peerGroups(int(fd)) }); err != nil {
		groupsErr = err
	}
	if errors.Is(groupsErr, syscall.ENOPROTOOPT) {
		ai.Groups, groupsErr = procGroups(u.procfs, ai.PID, ai.UID, ai.GID)
	}
	ai.GroupsErr = groupsErr
	return c, ai, nil
}

// soPeerGroups is SO_PEERGROUPS (Linux 4.13+; the same number on every
// architecture Go's syscall package gives SO_PEERCRED for but mips, sparc and
// parisc, which brokerd does not build for).
const soPeerGroups = 59

// maxGroups is NGROUPS_MAX: the kernel never reports more.
const maxGroups = 65536

// peerGroups asks the kernel for the supplementary groups the peer had when
// it connected. Unlike the account's groups in the group database, these are
// what the process actually holds (a sandbox that dropped a group does not
// get it back), and unlike /proc/<pid>/status they cannot belong to another
// process that reused the pid.
func peerGroups(fd int) ([]uint32, error) {
	buf := make([]uint32, 64)
	for {
		n := uint32(len(buf) * 4)
		_, _, e := syscall.Syscall6(syscall.SYS_GETSOCKOPT, uintptr(fd), syscall.SOL_SOCKET, soPeerGroups,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch {
		case e == syscall.ERANGE && n/4 > uint32(len(buf)) && n/4 <= maxGroups:
			buf = make([]uint32, n/4) // the kernel wrote the size it needs
			continue
		case e != 0:
			return nil, fmt.Errorf("SO_PEERGROUPS: %w", e)
		}
		return buf[: n/4 : n/4], nil
	}
}

// procGroups reads the Groups line of <procfs>/<pid>/status, for kernels
// without SO_PEERGROUPS. The status's effective uid and gid must be those the
// kernel gave at connect (SO_PEERCRED), so a pid reused meanwhile yields an
// error, never another process's groups.
func procGroups(procfs string, pid, uid, gid int) ([]uint32, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("no pid for the peer (another pid namespace)")
	}
	f, err := os.Open(filepath.Join(procfs, strconv.Itoa(pid), "status"))
	if err != nil {
		return nil, fmt.Errorf("peer groups: %w", err)
	}
	defer f.Close()
	var groups []uint32
	var sawUID, sawGID, sawGroups bool
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(val)
		switch key {
		case "Uid", "Gid":
			want := uid
			if key == "Gid" {
				want = gid
			}
			// Real, effective, saved, filesystem: SO_PEERCRED gives the effective.
			if len(fields) < 2 || fields[1] != strconv.Itoa(want) {
				return nil, fmt.Errorf("peer groups: %s of pid %d is %q, not %d as at connect: the process changed or exited", key, pid, val, want)
			}
			if key == "Uid" {
				sawUID = true
			} else {
				sawGID = true
			}
		case "Groups":
			sawGroups = true
			for _, g := range fields {
				n, err := strconv.ParseUint(g, 10, 32)
				if err != nil {
					return nil, fmt.Errorf("peer groups: pid %d: bad group %q", pid, g)
				}
				groups = append(groups, uint32(n))
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("peer groups: %w", err)
	}
	if !sawUID || !sawGID || !sawGroups {
		return nil, fmt.Errorf("peer groups: %s has no Uid, Gid or Groups line", f.Name())
	}
	return groups, nil
}

func (unixCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}
func (u unixCreds) Clone() credentials.TransportCredentials { return u }
func (unixCreds) OverrideServerName(string) error           { return nil }

// clientID names the caller for fairness between clients: "uid:N" on the Unix
// socket (all processes of one user are one client), the remote IP on TCP,
// the API key or the address on the HTTP APIs (httpapi.ClientFrom).
func clientID(ctx context.Context) string {
	if c, ok := httpapi.ClientFrom(ctx); ok {
		return c
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "unknown"
	}
	if ai, ok := p.AuthInfo.(peerCredAuthInfo); ok && ai.UID >= 0 {
		return "uid:" + strconv.Itoa(ai.UID)
	}
	if p.Addr != nil {
		if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
			return "ip:" + host
		}
		return p.Addr.String()
	}
	return "unknown"
}
