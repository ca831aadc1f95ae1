package ollama

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Ollama's defaults for the parts of a name left out (types/model/name.go).
const (
	DefaultHost      = "registry.ollama.ai"
	DefaultNamespace = "library"
	DefaultTag       = "latest"
)

// Name is an Ollama model name: host/namespace/model:tag, the path of its
// manifest under manifests/.
type Name struct {
	Host, Namespace, Model, Tag string
}

// ParseName parses a name in any form Ollama accepts: model, model:tag,
// namespace/model[:tag], host/namespace/model[:tag], the host optionally
// led by a scheme ("https://"); the parts left out are Ollama's defaults
// (registry.ollama.ai, library, latest). Every part must be what Ollama
// allows (letters, digits, _ and -; . in all but the namespace; : in the
// host; at most 80 bytes, the host 350), so a name never leaves the
// manifests directory. The error matches ErrNotFound: a name that cannot
// be in the store is not in it.
func ParseName(s string) (Name, error) {
	var n Name
	rest := s
	if strings.LastIndex(rest, ":") > strings.LastIndex(rest, "/") {
		rest, n.Tag, _ = cutLast(rest, ":")
		if n.Tag == "" {
			return Name{}, badName(s, "the tag after : is empty")
		}
	}
	parts := 0
	for range 2 {
		before, after, ok := cutLast(rest, "/")
		if !ok {
			break
		}
		if after == "" {
			return Name{}, badName(s, "a part between / is empty")
		}
		if parts == 0 {
			n.Model = after
		} else {
			n.Namespace = after
		}
		parts++
		rest = before
	}
	switch parts {
	case 0:
		n.Model = rest
	case 1:
		n.Namespace = rest
	case 2:
		if _, host, ok := strings.Cut(rest, "://"); ok {
			rest = host
		}
		n.Host = rest
	}
	if n.Host == "" && parts == 2 || n.Namespace == "" && parts >= 1 {
		return Name{}, badName(s, "a part before / is empty")
	}
	if n.Host == "" {
		n.Host = DefaultHost
	}
	if n.Namespace == "" {
		n.Namespace = DefaultNamespace
	}
	if n.Tag == "" {
		n.Tag = DefaultTag
	}
	if err := n.check(); err != nil {
		return Name{}, badName(s, err.Error())
	}
	return n, nil
}

func badName(s, why string) error {
	return fmt.Errorf("%w: %q is not an Ollama model name: %s", ErrNotFound, s, why)
}

// check reports the first part that Ollama would not accept.
func (n Name) check() error {
	for _, p := range []struct {
		kind, v string
		max     int
	}{{"host", n.Host, 350}, {"namespace", n.Namespace, 80}, {"model", n.Model, 80}, {"tag", n.Tag, 80}} {
		if p.v == "" {
			return fmt.Errorf("the %s is empty", p.kind)
		}
		if len(p.v) > p.max {
			return fmt.Errorf("the %s is %d bytes, at most %d", p.kind, len(p.v), p.max)
		}
		for i := 0; i < len(p.v); i++ {
			c := p.v[i]
			ok := alnum(c)
			if i > 0 {
				switch c {
				case '-':
					ok = true
				case '.':
					ok = p.kind != "namespace"
				case ':':
					ok = p.kind == "host"
				}
			}
			if !ok {
				return fmt.Errorf("the %s %q holds %q at byte %d", p.kind, p.v, c, i)
			}
		}
	}
	return nil
}

func alnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
}

func cutLast(s, sep string) (before, after string, ok bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// String is the full name: host/namespace/model:tag.
func (n Name) String() string {
	return n.Host + "/" + n.Namespace + "/" + n.Model + ":" + n.Tag
}

// Short is the name as Ollama shows it (`ollama list`, /api/tags): the
// default host and namespace left out (qwen2.5:0.5b), another namespace
// kept (myuser/mymodel:latest), another host kept with its namespace
// (hf.co/org/repo:Q4_K_M). The tag is always there.
func (n Name) Short() string {
	switch {
	case !strings.EqualFold(n.Host, DefaultHost):
		return n.Host + "/" + n.Namespace + "/" + n.Model + ":" + n.Tag
	case !strings.EqualFold(n.Namespace, DefaultNamespace):
		return n.Namespace + "/" + n.Model + ":" + n.Tag
	}
	return n.Model + ":" + n.Tag
}

// EqualFold reports whether n and o name the same model, ignoring case as
// Ollama does.
func (n Name) EqualFold(o Name) bool {
	return strings.EqualFold(n.Host, o.Host) && strings.EqualFold(n.Namespace, o.Namespace) &&
		strings.EqualFold(n.Model, o.Model) && strings.EqualFold(n.Tag, o.Tag)
}

// filepath is the manifest's path under manifests/ (n checked).
func (n Name) filepath() string {
	return filepath.Join(n.Host, n.Namespace, n.Model, n.Tag)
}
