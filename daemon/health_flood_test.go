package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

const healthFloodChildEnv = "BROKERD_HEALTH_FLOOD_CHILD"

// floodDescriptors is the child daemon's descriptor limit: small, so a
// flood of a little more takes them all where nothing bounds it.
const floodDescriptors = 128

// TestHealthFloodChild is the daemon of TestHealthFloodStarvesNothing, run
// in a process of its own with few descriptors. It prints its addresses
// and serves until stdin ends.
func TestHealthFloodChild(t *testing.T) {
	if os.Getenv(healthFloodChildEnv) == "" {
		t.Skip("run by TestHealthFloodStarvesNothing")
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: floodDescriptors, Max: floodDescriptors}); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.HealthListen = "127.0.0.1:0"
	d := startDaemon(t, cfg)
	b, _ := json.Marshal(d.addrs)
	fmt.Printf("ADDRS %s\n", b)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// startFloodChild starts TestHealthFloodChild and returns its addresses;
// the child ends with the test.
func startFloodChild(t *testing.T) Addresses {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHealthFloodChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), healthFloodChildEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	var addrs Addresses
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "ADDRS "); ok {
			if err := json.Unmarshal([]byte(rest), &addrs); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if addrs.Health == "" {
		t.Fatal("the child daemon did not start")
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return addrs
}

// TestHealthFloodStarvesNothing: one client holding idle HTTP/2
// connections on the health listener (plaintext TCP on an address kubelet
// reaches, so on the pod network) gets a few of them; the rest are closed
// at accept, and the Unix socket and /metrics still answer. Unbounded, the
// health listener took every descriptor and with them the admin and data
// plane and metrics.
func TestHealthFloodStarvesNothing(t *testing.T) {
	if os.Getenv(healthFloodChildEnv) != "" {
		t.Skip("the child")
	}
	addrs := startFloodChild(t)
	if err := listDevices(addrs.Socket); err != nil {
		t.Fatalf("before the flood: %v", err)
	}
	accepted, held := floodHealth(addrs.Health, floodDescriptors+16)
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	if accepted > sideConnsPerClient {
		t.Errorf("the health listener accepted and keeps %d idle connections of one client, want at most %d", accepted, sideConnsPerClient)
	}
	if err := listDevices(addrs.Socket); err != nil {
		t.Errorf("with one client's connections held on the health listener, a ListDevices on the Unix socket fails: %v", err)
	}
	if _, err := metricsGet(addrs.Metrics); err != nil {
		t.Errorf("and /metrics fails: %v", err)
	}
}

// floodHealth opens up to n idle HTTP/2 connections to addr, each
// completing the handshake (so gRPC's connection timeout does not close
// it) and then sending nothing. It stops at the first the server does not
// serve, and returns how many it served and every connection opened.
func floodHealth(addr string, n int) (accepted int, held []net.Conn) {
	preface := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0) // + empty SETTINGS
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return accepted, held
		}
		held = append(held, c)
		_, _ = c.Write(preface)
		// The server's SETTINGS says it accepted and serves this one.
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 9)); err != nil {
			return accepted, held // closed at accept, or no descriptor left to accept it
		}
		accepted++
	}
	return accepted, held
}

// listDevices calls ListDevices on the Unix socket at path.
func listDevices(path string) error {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = brokerv1.NewBrokerServiceClient(conn).ListDevices(ctx, &brokerv1.ListDevicesRequest{}, grpc.WaitForReady(true))
	return err
}

// metricsGet fetches /healthz from the metrics listener at addr.
func metricsGet(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")
	b, err := io.ReadAll(c)
	if err != nil {
		return string(b), err
	}
	if !strings.Contains(string(b), "200 OK") {
		return string(b), fmt.Errorf("answer %q", string(b))
	}
	return string(b), nil
}
