package config

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestAdminSettings(t *testing.T) {
	dir := t.TempDir()
	listYAML := filepath.Join(dir, "list.yaml")
	if err := os.WriteFile(listYAML, []byte("admin-uids: [0, alice]\nadmin-groups: brokerd-admin\nadmin-identities:\n  - uri:spiffe://example.org/ops\n"+
		"listen: 0.0.0.0:7443\ntls-cert: /c.pem\ntls-key: /k.pem\ntls-client-ca: /ca.pem\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	numberYAML := filepath.Join(dir, "number.yaml")
	if err := os.WriteFile(numberYAML, []byte("admin-uids: 1000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name                 string
		args                 []string
		env                  map[string]string
		uids, groups, idents List
	}{
		{name: "defaults are empty (root and brokerd's own uid are implied)"},
		{name: "flags", args: []string{"--admin-uids", "1000, alice", "--admin-groups=wheel,60"}, uids: List{"1000", "alice"}, groups: List{"wheel", "60"}},
		{name: "env", env: map[string]string{"BROKERD_ADMIN_UIDS": "7", "BROKERD_ADMIN_GROUPS": "ops"}, uids: List{"7"}, groups: List{"ops"}},
		{name: "flag replaces env", args: []string{"--admin-uids=8"}, env: map[string]string{"BROKERD_ADMIN_UIDS": "7"}, uids: List{"8"}},
		{name: "yaml lists and strings", args: []string{"--config", listYAML}, uids: List{"0", "alice"}, groups: List{"brokerd-admin"},
			idents: List{"uri:spiffe://example.org/ops"}},
		{name: "yaml number", args: []string{"--config", numberYAML}, uids: List{"1000"}},
		{name: "env over yaml", args: []string{"--config", listYAML}, env: map[string]string{"BROKERD_ADMIN_IDENTITIES": "cn:ops,dns:ops.example.org"},
			uids: List{"0", "alice"}, groups: List{"brokerd-admin"}, idents: List{"cn:ops", "dns:ops.example.org"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.args, env(tt.env), 1000, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.AdminUIDs, tt.uids) || !slices.Equal(c.AdminGroups, tt.groups) || !slices.Equal(c.AdminIdentities, tt.idents) {
				t.Errorf("uids %q groups %q identities %q; want %q %q %q", c.AdminUIDs, c.AdminGroups, c.AdminIdentities, tt.uids, tt.groups, tt.idents)
			}
		})
	}
}

func TestAdminSettingsRejected(t *testing.T) {
	mtls := []string{"--listen=0.0.0.0:7443", "--tls-cert=/c.pem", "--tls-key=/k.pem", "--tls-client-ca=/ca.pem"}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"uid too large", []string{"--admin-uids=4294967295"}, nil, []string{"admin-uids (BROKERD_ADMIN_UIDS)", "above the largest id"}},
		{"negative uid", nil, map[string]string{"BROKERD_ADMIN_UIDS": "-1"}, []string{"admin-uids", `"-1" is neither a number nor a user or group name`}},
		{"group with a path", []string{"--admin-groups=a/b"}, nil, []string{"admin-groups (BROKERD_ADMIN_GROUPS)", `"a/b"`}},
		{"identities without mutual TLS", []string{"--admin-identities=cn:ops"}, nil, []string{"admin-identities needs listen with tls-cert, tls-key and tls-client-ca"}},
		{"identities with TLS but no client CA", []string{"--admin-identities=cn:ops", "--listen=0.0.0.0:7443", "--tls-cert=/c.pem", "--tls-key=/k.pem"}, nil,
			[]string{"tls-client-ca"}},
		{"bad IP identity", append(slices.Clone(mtls), "--admin-identities=ip:10.0.0.300"), nil, []string{"admin-identities (BROKERD_ADMIN_IDENTITIES)", "not an IP address"}},
		{"relative URI identity", append(slices.Clone(mtls), "--admin-identities=uri:ops"), nil, []string{"not an absolute URI"}},
		{"empty typed identity", append(slices.Clone(mtls), "--admin-identities=dns:"), nil, []string{"empty name after dns:"}},
		{"email without @", append(slices.Clone(mtls), "--admin-identities=email:ops"), nil, []string{"not an email address"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(tt.args, env(tt.env), 1000, io.Discard)
			if err == nil {
				t.Fatal("Load succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestParseIdentity(t *testing.T) {
	tests := []struct {
		in   string
		want Identity
	}{
		{"uri:spiffe://example.org/ops", Identity{"uri", "spiffe://example.org/ops"}},
		{"DNS:ops.example.org", Identity{"dns", "ops.example.org"}},
		{"ip:::1", Identity{"ip", "::1"}},
		{"ip:10.0.0.5", Identity{"ip", "10.0.0.5"}},
		{"CN: ops robot", Identity{"cn", "ops robot"}},
		{"spiffe://example.org/ops", Identity{"", "spiffe://example.org/ops"}}, // not a known prefix: bare
		{"ops", Identity{"", "ops"}},
	}
	for _, tt := range tests {
		got, err := ParseIdentity(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseIdentity(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}

func TestResolveIDs(t *testing.T) {
	lookup := func(n string) (string, error) {
		if n == "alice" {
			return "1001", nil
		}
		return "", os.ErrNotExist
	}
	got, err := ResolveIDs("admin-uids", List{"0", "alice", "4294967294"}, lookup)
	if err != nil || !slices.Equal(got, []uint32{0, 1001, 4294967294}) {
		t.Errorf("ResolveIDs = %v, %v", got, err)
	}
	if _, err := ResolveIDs("admin-uids", List{"bob"}, lookup); err == nil || !strings.Contains(err.Error(), `admin-uids: "bob"`) {
		t.Errorf("unknown name: %v", err)
	}
}
