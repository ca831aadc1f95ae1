package server

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"syscall"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// unixCreds is the transport security of the Unix socket: no encryption (the
// socket's file mode guards it), but each connection learns its client's uid
// and pid from the kernel (SO_PEERCRED), which the scheduler uses as the
// client identity for fairness.
type unixCreds struct{}

// peerCredAuthInfo is the AuthInfo of a Unix socket connection.
type peerCredAuthInfo struct {
	credentials.CommonAuthInfo
	UID, PID int
}

func (peerCredAuthInfo) AuthType() string { return "peercred" }

func (unixCreds) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, peerCredAuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, UID: -1, PID: -1}, nil
}

func (unixCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return c, peerCredAuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, UID: -1, PID: -1}, nil
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
	return c, peerCredAuthInfo{
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
		UID:            int(cred.Uid), PID: int(cred.Pid),
	}, nil
}

func (unixCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}
func (u unixCreds) Clone() credentials.TransportCredentials { return u }
func (unixCreds) OverrideServerName(string) error           { return nil }

// clientID names the caller for fairness between clients: "uid:N" on the Unix
// socket (all processes of one user are one client), the remote IP on TCP.
func clientID(ctx context.Context) string {
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
