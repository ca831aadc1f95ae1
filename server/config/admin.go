package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// List is a setting holding several values: "a,b" on the command line and in
// the environment, a list (or the same string) in YAML. Setting it replaces
// the whole list, so a flag overrides the environment rather than adding to it.
type List []string

// Set implements flag.Value: comma-separated, blanks dropped.
func (l *List) Set(s string) error {
	var out List
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	*l = out
	return nil
}

func (l *List) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, ",")
}

// UnmarshalJSON accepts ["a", 1], "a,b" or a single number.
func (l *List) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '[' {
		var raw []json.RawMessage
		if err := json.Unmarshal(b, &raw); err != nil {
			return err
		}
		var out List
		for _, r := range raw {
			v, err := scalar(r)
			if err != nil {
				return err
			}
			out = append(out, v)
		}
		*l = out
		return nil
	}
	v, err := scalar(b)
	if err != nil {
		return err
	}
	return l.Set(v)
}

func scalar(b json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		return strings.TrimSpace(s), nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err == nil {
		return n.String(), nil
	}
	return "", fmt.Errorf("%s: want a string, a number or a list of them", b)
}

// maxID is the largest uid or gid: (uid_t)-1 means "no id" to the kernel.
const maxID = 1<<32 - 2

// checkIDs checks admin-uids or admin-groups: numbers, or names to resolve at
// start (the syntax useradd accepts, loosely).
func checkIDs(setting string, entries List) error {
	for _, e := range entries {
		if n, err := strconv.ParseUint(e, 10, 64); err == nil {
			if n > maxID {
				return fmt.Errorf("%s %q is invalid: %d is above the largest id %d", setting, entries.String(), n, uint64(maxID))
			}
			continue
		}
		if e[0] == '-' || len(e) > 256 || strings.ContainsAny(e, " \t\n:/") {
			return fmt.Errorf("%s %q is invalid: %q is neither a number nor a user or group name", setting, entries.String(), e)
		}
	}
	return nil
}

// ResolveIDs turns admin-uids or admin-groups into numbers: numbers as they
// are (an id needs no passwd entry, as in containers), names through lookup,
// which returns the id in decimal (os/user's Lookup(name).Uid, LookupGroup(name).Gid).
// Names are resolved once, at start.
func ResolveIDs(setting string, entries List, lookup func(name string) (string, error)) ([]uint32, error) {
	out := make([]uint32, 0, len(entries))
	for _, e := range entries {
		id := e
		if _, err := strconv.ParseUint(e, 10, 32); err != nil {
			v, err := lookup(e)
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %w", setting, e, err)
			}
			id = v
		}
		n, err := strconv.ParseUint(id, 10, 32)
		if err != nil || n > maxID {
			return nil, fmt.Errorf("%s: %q resolved to %q, not an id", setting, e, id)
		}
		out = append(out, uint32(n))
	}
	return out, nil
}

// Identity is one admin-identities entry: a client certificate name. Kind is
// "dns", "uri", "email", "ip" (subject alternative names) or "cn" (subject
// common name); an entry without one of those prefixes has Kind "" and
// matches any of them.
type Identity struct {
	Kind, Value string
}

func (id Identity) String() string {
	if id.Kind == "" {
		return id.Value
	}
	return id.Kind + ":" + id.Value
}

// identityKinds are the prefixes admin-identities accepts.
var identityKinds = []string{"dns", "uri", "email", "ip", "cn"}

// ParseIdentity parses one admin-identities entry: "uri:spiffe://org/admin",
// "dns:ops.example.com", "email:ops@example.com", "ip:10.0.0.5", "cn:ops", or
// a bare name matched against all of them. Matching is exact (DNS names and
// emails ignore case); there are no wildcards.
func ParseIdentity(s string) (Identity, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Identity{}, fmt.Errorf("empty identity")
	}
	id := Identity{Value: s}
	if k, v, ok := strings.Cut(s, ":"); ok {
		for _, kind := range identityKinds {
			if strings.EqualFold(k, kind) {
				id = Identity{Kind: kind, Value: strings.TrimSpace(v)}
				break
			}
		}
	}
	if id.Value == "" {
		return Identity{}, fmt.Errorf("%q has an empty name after %s:", s, id.Kind)
	}
	switch id.Kind {
	case "ip":
		ip := net.ParseIP(id.Value)
		if ip == nil {
			return Identity{}, fmt.Errorf("%q: %q is not an IP address", s, id.Value)
		}
		id.Value = ip.String()
	case "uri":
		if u, err := url.Parse(id.Value); err != nil || u.Scheme == "" {
			return Identity{}, fmt.Errorf("%q: %q is not an absolute URI (e.g. spiffe://example.org/brokerd-admin)", s, id.Value)
		}
	case "email":
		if !strings.Contains(id.Value, "@") {
			return Identity{}, fmt.Errorf("%q: %q is not an email address", s, id.Value)
		}
	}
	return id, nil
}

// AdminIdentityList parses every admin-identities entry.
func (c Config) AdminIdentityList() ([]Identity, error) {
	out := make([]Identity, 0, len(c.AdminIdentities))
	for _, e := range c.AdminIdentities {
		id, err := ParseIdentity(e)
		if err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, nil
}

// validateAdmins checks the three admin settings.
func (c Config) validateAdmins() []error {
	var errs []error
	if err := checkIDs("admin-uids (BROKERD_ADMIN_UIDS)", c.AdminUIDs); err != nil {
		errs = append(errs, err)
	}
	if err := checkIDs("admin-groups (BROKERD_ADMIN_GROUPS)", c.AdminGroups); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.AdminIdentityList(); err != nil {
		errs = append(errs, fmt.Errorf("admin-identities (BROKERD_ADMIN_IDENTITIES): %w; want e.g. uri:spiffe://example.org/ops, dns:ops.example.com, email:ops@example.com, ip:10.0.0.5, cn:ops", err))
	}
	if len(c.AdminIdentities) > 0 && (c.TLSClientCA == "" || c.Listen == "") {
		errs = append(errs, fmt.Errorf("admin-identities needs listen with tls-cert, tls-key and tls-client-ca: only a client certificate verified by mutual TLS carries an identity to match"))
	}
	return errs
}
