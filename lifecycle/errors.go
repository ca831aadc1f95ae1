package lifecycle

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Errors of model management; the gRPC edge (server) maps them to codes.
var (
	ErrModelNotFound  = errors.New("model not found")
	ErrModelNotLoaded = errors.New("model not loaded")
	ErrBuiltinModel   = errors.New("built-in model")
)

// missingError is a model (or version) that does not serve, explained in
// one message that says "not found" or "not loaded" once: it matches its
// sentinel (ErrModelNotFound or ErrModelNotLoaded) without repeating the
// sentinel's text after its own.
type missingError struct {
	msg      string
	sentinel error
}

func (e *missingError) Error() string        { return e.msg }
func (e *missingError) Is(target error) bool { return target == e.sentinel }

func notFound(format string, args ...any) error {
	return &missingError{msg: fmt.Sprintf(format, args...), sentinel: ErrModelNotFound}
}

func notLoaded(format string, args ...any) error {
	return &missingError{msg: fmt.Sprintf(format, args...), sentinel: ErrModelNotLoaded}
}

// AdmissionError refuses a load no device's memory budget can take.
type AdmissionError struct {
	Model   string
	Version int64
	Need    int64    // bytes one Replica needs (the smallest over device types)
	Devices []string // "cpu:0 has N of its M-byte budget free"
}

func (e *AdmissionError) Error() string {
	return fmt.Sprintf("model %s version %d needs %d bytes of device memory for a Replica, more than any device has free: %s",
		e.Model, e.Version, e.Need, strings.Join(e.Devices, "; "))
}

// Missing explains why name is not Served: ErrModelNotLoaded when the
// repository holds it, else ErrModelNotFound.
func (ms *Set) Missing(name string) error {
	if ms.listed(name) {
		return notLoaded("model %s is in the repository but not loaded (brokerctl load %s)", name, name)
	}
	return notFound("model %q not found (Served: %s)", name, ms.Names())
}

// versionMissing explains why version of name does not serve (serving:
// the version that does, 0 if none): ErrModelNotFound when the repository
// does not hold that version (or the model), ErrModelNotLoaded when it
// does, as Triton answers. A repository that cannot be listed leaves it
// "not loaded".
func (ms *Set) versionMissing(name string, version, serving int64) error {
	serves := ""
	if serving != 0 {
		serves = fmt.Sprintf("; version %d serves", serving)
	}
	if ms.repo == nil {
		if serving == 0 {
			return ms.Missing(name)
		}
		return notFound("model %s version %d not found: only version %d serves (there is no model repository)", name, version, serving)
	}
	entries, err := ms.repo.List()
	if err != nil {
		return notLoaded("model %s version %d is not loaded (%v%s)", name, version, err, serves)
	}
	i := slices.IndexFunc(entries, func(e RepoEntry) bool { return e.Name == name })
	switch {
	case i < 0 && serving == 0:
		return ms.Missing(name)
	case i < 0:
		return notFound("model %s version %d not found: the model is not in the repository, and version %d serves", name, version, serving)
	case !slices.Contains(entries[i].Versions, version):
		return notFound("model %s version %d not found: the model repository holds version(s) %s%s", name, version, joinVersions(entries[i].Versions), serves)
	case serving == 0:
		return notLoaded("model %s version %d is in the repository but not loaded (brokerctl load %s --version %d)", name, version, name, version)
	}
	return notLoaded("model %s version %d is not loaded (version %d serves; brokerctl load %s --version %d switches)", name, version, serving, name, version)
}

// joinVersions lists versions for a message ("1, 2"; "none").
func joinVersions(vs []int64) string {
	if len(vs) == 0 {
		return "none"
	}
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}
