package jinja

import (
	"context"
	"fmt"
	"strings"
)

// Template is a compiled Jinja template ready for rendering.
type Template struct {
	nodes []node
	src   string
}

// Compile parses a Jinja template source string under DefaultCompileLimits.
func Compile(source string) (*Template, error) {
	return CompileLimited(source, CompileLimits{})
}

// CompileLimited parses a Jinja template source string and returns a
// compiled template that can be rendered multiple times with different
// data. The source's size and its nesting are bounded by lim, so that
// parsing takes time linear in the source and bounded stack.
func CompileLimited(source string, lim CompileLimits) (*Template, error) {
	lim = lim.withDefaults()
	if len(source) > lim.MaxSourceBytes {
		return nil, fmt.Errorf("%w: the template is %d bytes, over %d", ErrLimit, len(source), lim.MaxSourceBytes)
	}
	segs, err := scan(source)
	if err != nil {
		return nil, fmt.Errorf("jinja scan: %w", err)
	}

	nodes, err := parseTemplate(segs, lim.MaxNesting)
	if err != nil {
		return nil, fmt.Errorf("jinja parse: %w", err)
	}

	return &Template{nodes: nodes, src: source}, nil
}

// Render executes the template with the provided data under
// DefaultLimits and returns the rendered string.
func (t *Template) Render(data map[string]any) (string, error) {
	return t.RenderContext(context.Background(), data, Limits{})
}

// RenderContext executes the template with the provided data under lim,
// and stops with ctx's error when ctx ends. Each call creates an isolated
// scope so templates are safe to render concurrently after compilation.
func (t *Template) RenderContext(ctx context.Context, data map[string]any, lim Limits) (string, error) {
	// Convert Go data to Value types.
	vals := make(map[string]Value, len(data))
	for k, v := range data {
		vals[k] = FromGoValue(v)
	}

	return render(ctx, t.nodes, vals, lim)
}

// RenderValues is like Render but accepts pre-converted Value data.
func (t *Template) RenderValues(data map[string]Value) (string, error) {
	return render(context.Background(), t.nodes, data, Limits{})
}

// =============================================================================

// render executes the AST with the given data and returns the result.
func render(ctx context.Context, nodes []node, data map[string]Value, lim Limits) (out string, err error) {
	// A panic inside the engine is a bug the template found; it fails
	// this render, not the process.
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("jinja: internal error: %v", r)
		}
	}()

	e := evaluator{
		output: strings.Builder{},
		b:      newBudget(ctx, lim),
	}

	// Use the cached builtins scope directly. The scope is initialized
	// once at package init and is only read after that (lookupFilter,
	// chained get() through parent links, passed to nested evaluators).
	// No code path writes to e.builtins, so sharing the cached scope
	// across renders is safe and avoids cloning ~20 entries per render.
	e.builtins = cachedBuiltins

	// Create user data scope on top of builtins.
	e.scope = newScope(e.builtins)
	for k, v := range data {
		e.scope.set(k, v)
	}

	if err := e.execNodes(nodes); err != nil {
		return "", err
	}
	// An overrun recorded where no error could be returned.
	if e.b.err != nil {
		return "", e.b.err
	}

	return e.output.String(), nil
}
