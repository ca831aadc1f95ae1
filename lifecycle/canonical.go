package lifecycle

// Canonical is the name name's model is served under.
func (ms *Set) Canonical(name string) string {
	if ms.repo == nil {
		return name
	}
	return ms.repo.Canonical(name)
}

// Canonical names the served name of an Ollama store's model.
func (p repository) Canonical(name string) string { return p.r.Canonical(name) }
