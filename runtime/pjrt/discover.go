package pjrt

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Environment variables the search reads.
const (
	EnvPlugins       = "BROKERD_PJRT_PLUGINS"     // name=path pairs, as --pjrt-plugin
	EnvPluginLibrary = "PJRT_PLUGIN_LIBRARY_PATH" // a plugin .so, or a directory of them; ':'-separated
	EnvTPULibrary    = "TPU_LIBRARY_PATH"         // libtpu.so, as JAX reads it
)

// Sources of a Candidate, in priority order.
const (
	SourceFlag          = "--pjrt-plugin"
	SourceEnvPlugins    = EnvPlugins
	SourcePluginLibrary = EnvPluginLibrary
	SourceTPULibrary    = EnvTPULibrary
	SourceSitePackages  = "site-packages"
)

// Options say where to look for PJRT plugins.
type Options struct {
	// Plugins are explicit name=path pairs, parsed from --pjrt-plugin with
	// ParsePluginSpec. They come before every other source.
	Plugins map[string]string
	// SitePackages are glob patterns of Python site-packages directories to
	// search for libtpu/libtpu.so and jax_plugins/xla_cuda*/xla_cuda_plugin.so,
	// earliest first. Nil means DefaultSitePackages(Getenv).
	SitePackages []string
	// Getenv reads the environment; nil means os.Getenv. Tests set it so the
	// search does not depend on the host's environment.
	Getenv func(string) string
}

func (o Options) getenv(key string) string {
	if o.Getenv == nil {
		return os.Getenv(key)
	}
	return o.Getenv(key)
}

// Validate checks the settings a daemon should refuse to start with: plugin
// names in Plugins and a malformed BROKERD_PJRT_PLUGINS.
func (o Options) Validate() error {
	for _, name := range sortedNames(o.Plugins) {
		if err := checkPluginName(name); err != nil {
			return fmt.Errorf("%s: %w", SourceFlag, err)
		}
		if !filepath.IsAbs(o.Plugins[name]) {
			return fmt.Errorf("%s: plugin %s: path %q is not absolute", SourceFlag, name, o.Plugins[name])
		}
	}
	if _, err := ParsePluginSpec(o.getenv(EnvPlugins)); err != nil {
		return fmt.Errorf("%s: %w", EnvPlugins, err)
	}
	return nil
}

// DefaultSitePackages returns the usual Python site-packages directories as
// glob patterns, in the order Python itself prefers them: the active virtual
// environment, the user's site, conda, then the system's.
func DefaultSitePackages(getenv func(string) string) []string {
	if getenv == nil {
		getenv = os.Getenv
	}
	var pats []string
	if venv := getenv("VIRTUAL_ENV"); venv != "" {
		pats = append(pats, filepath.Join(venv, "lib/python3*/site-packages"))
	}
	if home := getenv("HOME"); home != "" {
		pats = append(pats, filepath.Join(home, ".local/lib/python3*/site-packages"))
	}
	return append(pats,
		"/opt/conda/lib/python3*/site-packages",
		"/usr/local/lib/python3*/site-packages",
		"/usr/local/lib/python3*/dist-packages",
		"/usr/lib/python3*/dist-packages",
	)
}

// Candidate is a plugin library the search found; it may not load.
type Candidate struct {
	Name   string // "tpu", "cuda", ...: from the setting or the file name
	Path   string // absolute path as found
	Source string // one of the Source constants
}

// Discovery is what Discover found and where it looked.
type Discovery struct {
	Plugins []Candidate
	// Searched names every place looked at, for a report that says why
	// nothing was found: settings with their values, site-packages
	// directories (or the patterns that matched none).
	Searched []string
}

// Discover lists PJRT plugin libraries from, in priority order: opts.Plugins;
// BROKERD_PJRT_PLUGINS; PJRT_PLUGIN_LIBRARY_PATH (files, or directories of
// *.so files, the name taken from the file name); TPU_LIBRARY_PATH (named
// "tpu"); then libtpu/libtpu.so ("tpu") and jax_plugins/xla_cuda*/
// xla_cuda_plugin.so ("cuda") under each site-packages directory.
//
// The first source to name a plugin wins, even when its file is missing, so a
// path set by hand is never silently replaced by one found elsewhere. A file
// reached twice (through symbolic links, or under two names) is listed once.
// Paths set explicitly are listed even if absent, so the report can say so;
// searched directories contribute only files that exist.
//
// It fails only when BROKERD_PJRT_PLUGINS is malformed.
func Discover(opts Options) (Discovery, error) {
	var d Discovery
	seenName := map[string]bool{}
	seenFile := map[string]bool{}
	add := func(name, path, source string) {
		if abs, err := filepath.Abs(path); err == nil {
			path = abs
		}
		real := path
		if r, err := filepath.EvalSymlinks(path); err == nil {
			real = r
		}
		if seenName[name] || seenFile[real] {
			return
		}
		seenName[name], seenFile[real] = true, true
		d.Plugins = append(d.Plugins, Candidate{Name: name, Path: path, Source: source})
	}

	if len(opts.Plugins) > 0 {
		d.Searched = append(d.Searched, SourceFlag)
	}
	for _, name := range sortedNames(opts.Plugins) {
		add(name, opts.Plugins[name], SourceFlag)
	}

	spec := opts.getenv(EnvPlugins)
	d.Searched = append(d.Searched, envSearched(EnvPlugins, spec))
	env, err := ParsePluginSpec(spec)
	if err != nil {
		return Discovery{}, fmt.Errorf("%s: %w", EnvPlugins, err)
	}
	for _, name := range sortedNames(env) {
		add(name, env[name], SourceEnvPlugins)
	}

	libPath := opts.getenv(EnvPluginLibrary)
	d.Searched = append(d.Searched, envSearched(EnvPluginLibrary, libPath))
	for _, p := range filepath.SplitList(libPath) {
		for _, f := range pluginFiles(p) {
			add(nameFromFile(filepath.Base(f)), f, SourcePluginLibrary)
		}
	}

	tpuPath := opts.getenv(EnvTPULibrary)
	d.Searched = append(d.Searched, envSearched(EnvTPULibrary, tpuPath))
	if tpuPath != "" {
		add("tpu", tpuPath, SourceTPULibrary)
	}

	pats := opts.SitePackages
	if pats == nil {
		pats = DefaultSitePackages(opts.getenv)
	}
	for _, pat := range pats {
		dirs, _ := filepath.Glob(pat) // the only error is a malformed pattern: nothing to search
		if len(dirs) == 0 {
			d.Searched = append(d.Searched, pat)
			continue
		}
		for _, dir := range dirs {
			d.Searched = append(d.Searched, dir)
			if f := filepath.Join(dir, "libtpu", "libtpu.so"); isFile(f) {
				add("tpu", f, SourceSitePackages)
			}
			cuda, _ := filepath.Glob(filepath.Join(dir, "jax_plugins", "xla_cuda*", "xla_cuda_plugin.so"))
			for _, f := range cuda {
				if isFile(f) {
					add("cuda", f, SourceSitePackages)
				}
			}
		}
	}
	return d, nil
}

func envSearched(key, val string) string {
	if val == "" {
		return key + " (unset)"
	}
	return key + "=" + val
}

// pluginFiles expands one PJRT_PLUGIN_LIBRARY_PATH entry: a directory gives
// its *.so files, anything else (a file, or a missing path to be reported)
// itself.
func pluginFiles(p string) []string {
	if p == "" {
		return nil
	}
	fi, err := os.Stat(p)
	if err != nil || !fi.IsDir() {
		return []string{p}
	}
	matches, _ := filepath.Glob(filepath.Join(p, "*.so"))
	var files []string
	for _, m := range matches {
		if isFile(m) {
			files = append(files, m)
		}
	}
	return files
}

// nameFromFile derives a plugin name from its file name: libtpu.so → tpu,
// xla_cuda_plugin.so → cuda, pjrt_c_api_cpu_plugin.so → cpu.
func nameFromFile(base string) string {
	name := strings.ToLower(base)
	if i := strings.Index(name, ".so"); i > 0 {
		name = name[:i]
	}
	for _, p := range []string{"lib", "pjrt_c_api_", "pjrt_", "plugin_", "xla_"} {
		name = strings.TrimPrefix(name, p)
	}
	for _, s := range []string{"_plugin", "_pjrt"} {
		name = strings.TrimSuffix(name, s)
	}
	if checkPluginName(name) != nil {
		// Keep the name usable as a key and a label.
		name = strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-' {
				return r
			}
			return '_'
		}, name)
	}
	if name == "" {
		return "plugin"
	}
	return name
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}
