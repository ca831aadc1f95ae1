package ollama

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/template"
	"text/template/parse"
	"time"
)

// A template layer is Ollama's Go text/template (its template package,
// template/template.go), run here as Ollama runs it:
//
//   - A template that reads .Messages runs once with .System (every system
//     message's content, joined by a blank line), .Messages (each with
//     .Role, .Content, .Thinking, .ToolCalls (.ID, .Function.Index,
//     .Function.Name, .Function.Arguments), .ToolName, .ToolCallID),
//     .Tools (each with .Type and .Function: .Name, .Description,
//     .Parameters with .Type, .Required, .Properties), .Response (""),
//     .Think, .ThinkLevel and .IsThinkSet. Consecutive messages of one
//     role but tool are first merged, their contents joined by a blank
//     line (Ollama's collate).
//   - A template that does not (the legacy .System/.Prompt/.Response
//     ones) runs once per turn: a system message, a user prompt and the
//     assistant's response each turn; the last turn runs with the
//     template cut after its {{ .Response }}, which a template reading
//     neither .Messages nor .Response gets appended.
//   - Missing map keys print Ollama's "<no value>" (missingkey=zero);
//     the functions are Ollama's json, currentDate, yesterdayDate and
//     toTypeScriptType besides text/template's own.
//   - Tools, tool calls' arguments and a tool's properties print as JSON,
//     as Ollama prints them; so does a tool's .Function (as Ollama's
//     api.ToolFunction did: Qwen 2.5's template writes {{ .Function }}).
//
// A template is code from a file, run under bounds (TemplateLimits): its
// {{ template }} calls may not recurse (checked when it is parsed), every
// range iteration and action counts a step and checks the render's
// deadline, the strings printf, print, println, html, js, urlquery and
// json make count against an allocation bound (all but json's bounded
// before fmt builds them: template_fmt.go), and the output against its
// own.

// Template errors. ErrTemplateLimit also wraps ErrTemplate.
var (
	// ErrTemplate: the template cannot be parsed, or its execution
	// failed.
	ErrTemplate = errors.New("Ollama template")
	// ErrTemplateLimit: a render broke one of its TemplateLimits, or the
	// template recurses.
	ErrTemplateLimit = errors.New("Ollama template over its limits")
)

// TemplateLimits bound one render. A zero field takes
// DefaultTemplateLimits'.
type TemplateLimits struct {
	// MaxSteps bounds the actions run and range iterations.
	MaxSteps int64
	// MaxOutputBytes bounds the rendered prompt.
	MaxOutputBytes int64
	// MaxAllocBytes bounds the strings the template's functions make.
	MaxAllocBytes int64
	// MaxTime bounds the render's wall time.
	MaxTime time.Duration
}

// DefaultTemplateLimits are far above what Ollama's templates need (tens
// of steps a message: a step is a function call through reflection, a few
// hundred nanoseconds) and bound a hostile one to about a second and tens
// of megabytes, as the Jinja path's.
var DefaultTemplateLimits = TemplateLimits{MaxSteps: 1_000_000, MaxOutputBytes: 16 << 20, MaxAllocBytes: 64 << 20, MaxTime: 2 * time.Second}

func (l TemplateLimits) withDefaults() TemplateLimits {
	d := DefaultTemplateLimits
	if l.MaxSteps <= 0 {
		l.MaxSteps = d.MaxSteps
	}
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = d.MaxOutputBytes
	}
	if l.MaxAllocBytes <= 0 {
		l.MaxAllocBytes = d.MaxAllocBytes
	}
	if l.MaxTime <= 0 {
		l.MaxTime = d.MaxTime
	}
	return l
}

// MaxTemplateBytes bounds a template's source.
const MaxTemplateBytes = 1 << 20

// DefaultTemplate is Ollama's template of a model without one.
const DefaultTemplate = "{{ .Prompt }}"

// Template is a parsed template layer, safe for concurrent renders.
type Template struct {
	raw      string
	root     *template.Template // ticked; its funcs are set per render
	final    *template.Template // legacy: the last turn's, cut after .Response
	messages bool               // reads .Messages: one execution
}

// tickFunc is the function the parser's tree gets a call of before each
// action and in each range iteration (a template that calls it only
// counts a step more).
const tickFunc = "__brokerd_step"

// boundedFuncs are text/template's builtins that make strings, replaced
// by bounded ones, and Ollama's functions.
var boundedFuncs = []string{"printf", "print", "println", "html", "js", "urlquery", "json", "currentDate", "yesterdayDate", "toTypeScriptType"}

// parseFuncs stand for the functions while parsing (the parser checks
// only their names); each render binds its own.
func parseFuncs() template.FuncMap {
	m := template.FuncMap{tickFunc: func() string { return "" }}
	for _, n := range boundedFuncs {
		m[n] = func(...any) string { return "" }
	}
	return m
}

// ParseTemplate parses a template layer as Ollama's template.Parse does
// (an undefined {{ template }} pipeline refused, {{ .Response }} appended
// to a template reading neither .Messages nor .Response) and refuses a
// template whose {{ template }} calls recurse.
func ParseTemplate(src string) (*Template, error) {
	if len(src) > MaxTemplateBytes {
		return nil, fmt.Errorf("%w: %w: %d bytes, more than %d", ErrTemplate, ErrTemplateLimit, len(src), MaxTemplateBytes)
	}
	tm, err := template.New("").Option("missingkey=zero").Funcs(parseFuncs()).Parse(src)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	vars := map[string]bool{}
	for _, tt := range tm.Templates() {
		if tt.Tree == nil || tt.Root == nil {
			continue
		}
		ids, err := identifiers(tt.Root)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
		}
		for _, id := range ids {
			vars[strings.ToLower(id)] = true
		}
	}
	if err := checkRecursion(tm); err != nil {
		return nil, err
	}
	if tm.Tree == nil || tm.Root == nil {
		return nil, fmt.Errorf("%w: an empty template", ErrTemplate)
	}
	t := &Template{raw: src, messages: vars["messages"]}
	if !vars["messages"] && !vars["response"] {
		tm.Root.Nodes = append(tm.Root.Nodes, responseNode())
	}
	if !t.messages {
		cut := cutAfterResponse(tm.Root.CopyList())
		final, err := tm.Clone()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
		}
		final.Tree = &parse.Tree{Name: tm.Name(), ParseName: tm.Tree.ParseName, Root: cut}
		tick(cut)
		t.final = final
	}
	for _, tt := range tm.Templates() {
		if tt.Tree != nil && tt.Root != nil {
			tick(tt.Root)
		}
	}
	t.root = tm
	return t, nil
}

// String is the template's source.
func (t *Template) String() string { return t.raw }

// UsesMessages reports whether the template reads .Messages (runs once
// per conversation) rather than per turn.
func (t *Template) UsesMessages() bool { return t.messages }

func responseNode() *parse.ActionNode {
	return &parse.ActionNode{NodeType: parse.NodeAction, Pipe: &parse.PipeNode{NodeType: parse.NodePipe, Cmds: []*parse.CommandNode{{
		NodeType: parse.NodeCommand, Args: []parse.Node{&parse.FieldNode{NodeType: parse.NodeField, Ident: []string{"Response"}}},
	}}}}
}

func tickNode() *parse.ActionNode {
	return &parse.ActionNode{NodeType: parse.NodeAction, Pipe: &parse.PipeNode{NodeType: parse.NodePipe, Cmds: []*parse.CommandNode{{
		NodeType: parse.NodeCommand, Args: []parse.Node{parse.NewIdentifier(tickFunc)},
	}}}}
}

// tick puts a step before every action, branch and template call of the
// list, and at the start of every range body.
func tick(l *parse.ListNode) {
	if l == nil {
		return
	}
	nodes := make([]parse.Node, 0, 2*len(l.Nodes))
	for _, n := range l.Nodes {
		switch n := n.(type) {
		case *parse.ActionNode, *parse.TemplateNode:
			nodes = append(nodes, tickNode())
		case *parse.IfNode:
			nodes = append(nodes, tickNode())
			tick(n.List)
			tick(n.ElseList)
		case *parse.WithNode:
			nodes = append(nodes, tickNode())
			tick(n.List)
			tick(n.ElseList)
		case *parse.RangeNode:
			nodes = append(nodes, tickNode())
			tick(n.List)
			if n.List != nil {
				n.List.Nodes = append([]parse.Node{tickNode()}, n.List.Nodes...)
			}
			tick(n.ElseList)
		}
		nodes = append(nodes, n)
	}
	l.Nodes = nodes
}

// checkRecursion refuses {{ template }} calls that reach their own
// template again: text/template would recurse 100000 deep.
func checkRecursion(tm *template.Template) error {
	calls := map[string][]string{}
	for _, tt := range tm.Templates() {
		if tt.Tree == nil || tt.Root == nil {
			continue
		}
		var walk func(n parse.Node)
		walk = func(n parse.Node) {
			switch n := n.(type) {
			case *parse.ListNode:
				if n == nil {
					return
				}
				for _, c := range n.Nodes {
					walk(c)
				}
			case *parse.TemplateNode:
				calls[tt.Name()] = append(calls[tt.Name()], n.Name)
			case *parse.IfNode:
				walk(n.List)
				walk(n.ElseList)
			case *parse.WithNode:
				walk(n.List)
				walk(n.ElseList)
			case *parse.RangeNode:
				walk(n.List)
				walk(n.ElseList)
			}
		}
		walk(tt.Root)
	}
	const (
		unseen = iota
		open
		done
	)
	state := map[string]int{}
	var visit func(name string, path []string) error
	visit = func(name string, path []string) error {
		switch state[name] {
		case open:
			return fmt.Errorf("%w: %w: its {{ template }} calls recurse (%s)", ErrTemplate, ErrTemplateLimit, strings.Join(append(path, name), " → "))
		case done:
			return nil
		}
		state[name] = open
		for _, c := range calls[name] {
			if err := visit(c, append(path, name)); err != nil {
				return err
			}
		}
		state[name] = done
		return nil
	}
	names := make([]string, 0, len(calls))
	for n := range calls {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := visit(n, nil); err != nil {
			return err
		}
	}
	return nil
}

// identifiers are the fields and variables a node reads (Ollama's
// template.Identifiers, with its errors).
func identifiers(n parse.Node) ([]string, error) {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return nil, nil
		}
		var names []string
		for _, c := range n.Nodes {
			i, err := identifiers(c)
			if err != nil {
				return names, err
			}
			names = append(names, i...)
		}
		return names, nil
	case *parse.TemplateNode:
		if n.Pipe == nil {
			return nil, errors.New("undefined template specified")
		}
		return identifiers(n.Pipe)
	case *parse.ActionNode:
		if n.Pipe == nil {
			return nil, errors.New("undefined action in template")
		}
		return identifiers(n.Pipe)
	case *parse.BranchNode:
		if n.Pipe == nil {
			return nil, errors.New("undefined branch")
		}
		names, err := identifiers(n.Pipe)
		if err != nil {
			return names, err
		}
		for _, l := range []*parse.ListNode{n.List, n.ElseList} {
			if l != nil {
				i, err := identifiers(l)
				if err != nil {
					return names, err
				}
				names = append(names, i...)
			}
		}
		return names, nil
	case *parse.IfNode:
		return identifiers(&n.BranchNode)
	case *parse.RangeNode:
		return identifiers(&n.BranchNode)
	case *parse.WithNode:
		return identifiers(&n.BranchNode)
	case *parse.PipeNode:
		var names []string
		for _, c := range n.Cmds {
			for _, a := range c.Args {
				i, err := identifiers(a)
				if err != nil {
					return names, err
				}
				names = append(names, i...)
			}
		}
		return names, nil
	case *parse.FieldNode:
		return n.Ident, nil
	case *parse.VariableNode:
		return n.Ident, nil
	}
	return nil, nil
}

// cutAfterResponse is Ollama's deleteNode: every node after the first
// .Response field (in the order the tree is walked) is removed, so that
// the last turn ends where the reply begins. Where Ollama's would panic
// (a branch emptied whole), the branch is left empty.
func cutAfterResponse(root *parse.ListNode) *parse.ListNode {
	cut := false
	fn := func(n parse.Node) bool {
		if f, ok := n.(*parse.FieldNode); ok && slices.Contains(f.Ident, "Response") {
			cut = true
			return false
		}
		return cut
	}
	var walk func(n parse.Node) parse.Node
	list := func(l *parse.ListNode) *parse.ListNode {
		if l == nil {
			return nil
		}
		if r, ok := walk(l).(*parse.ListNode); ok && r != nil {
			return r
		}
		return &parse.ListNode{NodeType: parse.NodeList}
	}
	branch := func(b *parse.BranchNode) {
		b.List = list(b.List)
		if b.ElseList != nil {
			b.ElseList = list(b.ElseList)
		}
	}
	walk = func(n parse.Node) parse.Node {
		if fn(n) {
			return nil
		}
		switch t := n.(type) {
		case *parse.ListNode:
			var nodes []parse.Node
			for _, c := range t.Nodes {
				if r := walk(c); r != nil {
					nodes = append(nodes, r)
				}
			}
			t.Nodes = nodes
			return t
		case *parse.IfNode:
			branch(&t.BranchNode)
		case *parse.WithNode:
			branch(&t.BranchNode)
		case *parse.RangeNode:
			branch(&t.BranchNode)
		case *parse.ActionNode:
			r := walk(t.Pipe)
			if r == nil {
				return nil
			}
			t.Pipe = r.(*parse.PipeNode)
		case *parse.PipeNode:
			var cmds []*parse.CommandNode
			for _, c := range t.Cmds {
				var args []parse.Node
				for _, a := range c.Args {
					if r := walk(a); r != nil {
						args = append(args, r)
					}
				}
				if len(args) == 0 {
					return nil
				}
				c.Args = args
				cmds = append(cmds, c)
			}
			if len(cmds) == 0 {
				return nil
			}
			t.Cmds = cmds
		}
		return n
	}
	return list(root)
}

// ChatMessage is one message of a conversation, as a chat request has it.
type ChatMessage struct {
	Role, Content string
	Thinking      string // an assistant turn's reasoning
	ToolCalls     []ChatToolCall
	ToolName      string // a tool turn's function
	ToolCallID    string
}

// ChatToolCall is an assistant turn's call; Arguments is a JSON object.
type ChatToolCall struct {
	ID, Name  string
	Arguments json.RawMessage
}

// RenderOptions are a render's inputs besides the messages.
type RenderOptions struct {
	// Tools are the functions the model may call, each a JSON object as
	// OpenAI's and Ollama's APIs have it ({"type": "function",
	// "function": {"name", "description", "parameters"}}).
	Tools []json.RawMessage
	// Think is .Think, IsThinkSet .IsThinkSet (whether the request said),
	// ThinkLevel .ThinkLevel ("high", ...; "" for a plain true).
	Think, IsThinkSet bool
	ThinkLevel        string
	// Limits bound the render (DefaultTemplateLimits' where zero).
	Limits TemplateLimits
}

// render is one render's state: its bounds, shared by its executions.
type render struct {
	ctx    context.Context
	lim    TemplateLimits
	steps  int64
	alloc  int64
	out    int64
	broken error // the limit broken, once one is
}

func (r *render) fail(err error) error {
	if r.broken == nil {
		r.broken = err
	}
	return r.broken
}

func (r *render) tick() (string, error) {
	r.steps++
	if r.steps > r.lim.MaxSteps {
		return "", r.fail(fmt.Errorf("%w: %w: more than %d steps", ErrTemplate, ErrTemplateLimit, r.lim.MaxSteps))
	}
	if r.steps&63 == 0 {
		if err := r.ctx.Err(); err != nil {
			return "", r.fail(err)
		}
	}
	return "", nil
}

// made counts a string a function made.
func (r *render) made(s string) (string, error) {
	r.alloc += int64(len(s))
	if r.alloc > r.lim.MaxAllocBytes {
		return "", r.overAlloc()
	}
	return s, nil
}

// room is what is left of the allocation bound.
func (r *render) room() int64 { return max(r.lim.MaxAllocBytes-r.alloc, 0) }

// reserve refuses a call that may make more than room before it runs:
// fmt builds its whole result before made can count it.
func (r *render) reserve(bound int64) error {
	if bound > r.room() {
		return r.overAlloc()
	}
	return nil
}

func (r *render) overAlloc() error {
	return r.fail(fmt.Errorf("%w: %w: its functions made more than %d bytes", ErrTemplate, ErrTemplateLimit, r.lim.MaxAllocBytes))
}

// Write bounds the output.
func (r *render) Write(p []byte) (int, error) {
	r.out += int64(len(p))
	if r.out > r.lim.MaxOutputBytes {
		return 0, r.fail(fmt.Errorf("%w: %w: the output is over %d bytes", ErrTemplate, ErrTemplateLimit, r.lim.MaxOutputBytes))
	}
	return len(p), nil
}

func (r *render) funcs() template.FuncMap {
	m := template.FuncMap{tickFunc: r.tick}
	m["printf"] = func(format string, args ...any) (string, error) {
		if err := r.reserve(printfBound(format, args, r.room())); err != nil {
			return "", err
		}
		return r.made(fmt.Sprintf(format, args...))
	}
	for name, f := range map[string]func(...any) string{"print": fmt.Sprint, "println": fmt.Sprintln} {
		m[name] = func(args ...any) (string, error) {
			if err := r.reserve(printBound(args, r.room())); err != nil {
				return "", err
			}
			return r.made(f(args...))
		}
	}
	// The escapers print their arguments as print does, then grow each
	// byte to at most six ("&#34;", "\u003C", "%XX").
	escapers := map[string]func(...any) string{
		"html": template.HTMLEscaper, "js": template.JSEscaper, "urlquery": template.URLQueryEscaper,
	}
	for name, f := range escapers {
		m[name] = func(args ...any) (string, error) {
			if err := r.reserve(satMul(fmtEscape, printBound(args, r.room()))); err != nil {
				return "", err
			}
			return r.made(f(args...))
		}
	}
	m["json"] = func(v any) (string, error) {
		b, _ := json.Marshal(v)
		return r.made(string(b))
	}
	m["currentDate"] = func(...string) string { return time.Now().Format("2006-01-02") }
	m["yesterdayDate"] = func(...string) string { return time.Now().AddDate(0, 0, -1).Format("2006-01-02") }
	m["toTypeScriptType"] = func(v any) string {
		switch p := v.(type) {
		case toolProperty:
			return p.typeScript()
		case *toolProperty:
			if p != nil {
				return p.typeScript()
			}
		}
		return "any"
	}
	return m
}

// Render renders a conversation. The error wraps ErrTemplate (and
// ErrTemplateLimit for a bound broken), or ctx's when ctx ended.
func (t *Template) Render(ctx context.Context, messages []ChatMessage, opts RenderOptions) (string, error) {
	lim := opts.Limits.withDefaults()
	tools, err := templateTools(opts.Tools)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	msgs, err := templateMessages(messages)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	rctx, cancel := context.WithTimeout(ctx, lim.MaxTime)
	defer cancel()
	r := &render{ctx: rctx, lim: lim}
	var buf bytes.Buffer
	w := io.MultiWriter(r, &buf)
	err = t.execute(r, w, msgs, tools, opts)
	switch {
	case err == nil:
		return buf.String(), nil
	case ctx.Err() != nil:
		return "", fmt.Errorf("%w: %w", ErrTemplate, ctx.Err())
	case rctx.Err() != nil:
		return "", fmt.Errorf("%w: %w: rendering took longer than %v", ErrTemplate, ErrTemplateLimit, lim.MaxTime)
	case r.broken != nil:
		return "", r.broken
	}
	return "", fmt.Errorf("%w: %w", ErrTemplate, err)
}

func (t *Template) execute(r *render, w io.Writer, msgs []*tmplMessage, tools tmplTools, opts RenderOptions) error {
	root, err := t.root.Clone()
	if err != nil {
		return err
	}
	root.Funcs(r.funcs())
	system, collated := collate(msgs)
	if t.messages {
		return root.Execute(w, map[string]any{
			"System": system, "Messages": collated, "Tools": tools, "Response": "",
			"Think": opts.Think, "ThinkLevel": opts.ThinkLevel, "IsThinkSet": opts.IsThinkSet,
		})
	}
	final, err := t.final.Clone()
	if err != nil {
		return err
	}
	final.Funcs(r.funcs())
	values := func(system, prompt, response string) map[string]any {
		return map[string]any{"System": system, "Prompt": prompt, "Response": response,
			"Think": opts.Think, "ThinkLevel": opts.ThinkLevel, "IsThinkSet": opts.IsThinkSet}
	}
	system = ""
	var prompt, response string
	run := func() error {
		if err := r.ctx.Err(); err != nil {
			return r.fail(err)
		}
		if err := root.Execute(w, values(system, prompt, response)); err != nil {
			return err
		}
		system, prompt, response = "", "", ""
		return nil
	}
	for _, m := range collated {
		switch m.Role {
		case "system":
			if prompt != "" || response != "" {
				if err := run(); err != nil {
					return err
				}
			}
			system = m.Content
		case "user":
			if response != "" {
				if err := run(); err != nil {
					return err
				}
			}
			prompt = m.Content
		case "assistant":
			response = m.Content
		}
	}
	if err := r.ctx.Err(); err != nil {
		return r.fail(err)
	}
	return final.Execute(w, values(system, prompt, response))
}

// collate is Ollama's: the system messages' contents joined, and
// consecutive messages of a role (but tool) merged into the first, their
// contents joined by a blank line.
func collate(msgs []*tmplMessage) (string, []*tmplMessage) {
	var system []string
	var out []*tmplMessage
	for _, m := range msgs {
		if m.Role == "system" {
			system = append(system, m.Content)
		}
		if len(out) > 0 && out[len(out)-1].Role == m.Role && m.Role != "tool" {
			out[len(out)-1].Content += "\n\n" + m.Content
		} else {
			out = append(out, m)
		}
	}
	return strings.Join(system, "\n\n"), out
}

// trialConversations are what Check renders: a system prompt and a few
// turns, then turns with tools, a call and its result, so that the
// branches real requests take run.
var trialConversations = []struct {
	msgs  []ChatMessage
	tools []json.RawMessage
}{
	{msgs: []ChatMessage{
		{Role: "system", Content: "You are a helpful assistant."},
		{Role: "user", Content: "What is the weather in Paris?"},
		{Role: "assistant", Content: "It is sunny in Paris."},
		{Role: "user", Content: "And in Rome?"},
	}},
	{msgs: []ChatMessage{
		{Role: "user", Content: "What is the weather in Paris?"},
		{Role: "assistant", ToolCalls: []ChatToolCall{{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"city": "Paris"}`)}}},
		{Role: "tool", Content: `{"sky": "sunny"}`, ToolName: "get_weather", ToolCallID: "call_1"},
	}, tools: []json.RawMessage{json.RawMessage(`{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city.",
		"parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city."}}, "required": ["city"]}}}`)}},
}

// Check renders sample conversations under lim, as a model load does
// before it accepts a template: a template that breaks a limit on them is
// refused (ErrTemplateLimit). One that fails otherwise is not: real
// requests may still suit it.
func (t *Template) Check(ctx context.Context, lim TemplateLimits) error {
	for _, trial := range trialConversations {
		_, err := t.Render(ctx, trial.msgs, RenderOptions{Tools: trial.tools, Limits: lim})
		if errors.Is(err, ErrTemplateLimit) || ctx.Err() != nil {
			return fmt.Errorf("a trial render: %w", err)
		}
	}
	return nil
}
