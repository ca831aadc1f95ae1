package lifecycle

// canonicaler is a repository whose models answer to several names (an
// Ollama store's qwen2.5, qwen2.5:latest and library/qwen2.5:latest).
type canonicaler interface {
	Canonical(name string) string
}

// Canonical is the name name's model is served under; names without
// aliases are their own.
func (ms *Set) Canonical(name string) string {
	if c, ok := ms.repo.(canonicaler); ok {
		return c.Canonical(name)
	}
	return name
}

// Canonical names the served name of an Ollama store's model.
func (p repository) Canonical(name string) string { return p.r.Canonical(name) }
