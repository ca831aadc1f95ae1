package ollama

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// The values a template sees, shaped as Ollama's template package shapes
// them (templateMessage, templateTool, ...): the same field names, and the
// same JSON when printed.

type tmplMessage struct {
	Role       string
	Content    string
	Thinking   string
	Images     []any // brokerd's chats carry no images
	ToolCalls  []tmplToolCall
	ToolName   string
	ToolCallID string
}

type tmplToolCall struct {
	ID       string
	Function tmplToolCallFunction
}

type tmplToolCallFunction struct {
	Index     int
	Name      string
	Arguments tmplArgs
}

// tmplArgs prints as its JSON (keys sorted, as Ollama's map prints them).
type tmplArgs map[string]any

func (a tmplArgs) String() string {
	if a == nil {
		return "{}"
	}
	b, _ := json.Marshal(map[string]any(a))
	return string(b)
}

type tmplTools []tmplTool

func (t tmplTools) String() string {
	b, _ := json.Marshal([]tmplTool(t))
	return string(b)
}

type tmplTool struct {
	Type     string           `json:"type"`
	Items    any              `json:"items,omitempty"`
	Function tmplToolFunction `json:"function"`
}

func (t tmplTool) String() string {
	b, _ := json.Marshal(t)
	return string(b)
}

type tmplToolFunction struct {
	Name        string         `json:"name"`
	Description string         `json:"description"`
	Parameters  tmplParameters `json:"parameters"`
}

// String is the function's JSON, as Ollama's api.ToolFunction printed
// (Qwen 2.5's template writes {"type": "function", "function":
// {{ .Function }}}).
func (f tmplToolFunction) String() string {
	b, _ := json.Marshal(f)
	return string(b)
}

type tmplParameters struct {
	Type       string         `json:"type"`
	Defs       any            `json:"$defs,omitempty"`
	Items      any            `json:"items,omitempty"`
	Required   []string       `json:"required,omitempty"`
	Properties tmplProperties `json:"properties"`
}

// tmplProperties prints as its JSON (names sorted).
type tmplProperties map[string]toolProperty

func (p tmplProperties) String() string {
	if p == nil {
		return "{}"
	}
	b, _ := json.Marshal(map[string]toolProperty(p))
	return string(b)
}

// toolProperty is Ollama's api.ToolProperty: what it keeps of a
// parameter's schema.
type toolProperty struct {
	AnyOf       []toolProperty     `json:"anyOf,omitempty"`
	Type        propertyType       `json:"type,omitempty"`
	Items       any                `json:"items,omitempty"`
	Description string             `json:"description,omitempty"`
	Enum        []any              `json:"enum,omitempty"`
	Properties  *orderedProperties `json:"properties,omitempty"`
	Required    []string           `json:"required,omitempty"`
}

func (p toolProperty) typeScript() string {
	if len(p.AnyOf) > 0 {
		var ts []string
		for _, a := range p.AnyOf {
			ts = append(ts, a.typeScript())
		}
		return strings.Join(ts, " | ")
	}
	if len(p.Type) == 0 {
		return "any"
	}
	var ts []string
	for _, t := range p.Type {
		switch t {
		case "string":
			ts = append(ts, "string")
		case "number", "integer":
			ts = append(ts, "number")
		case "boolean":
			ts = append(ts, "boolean")
		case "array":
			ts = append(ts, "any[]")
		case "object":
			ts = append(ts, "Record<string, any>")
		case "null":
			ts = append(ts, "null")
		default:
			ts = append(ts, "any")
		}
	}
	return strings.Join(ts, " | ")
}

// propertyType is a type or a list of them (one prints as a string).
type propertyType []string

func (pt *propertyType) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*pt = []string{s}
		return nil
	}
	var a []string
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	*pt = a
	return nil
}

func (pt propertyType) MarshalJSON() ([]byte, error) {
	if len(pt) == 1 {
		return json.Marshal(pt[0])
	}
	return json.Marshal([]string(pt))
}

func (pt propertyType) String() string {
	if len(pt) == 1 {
		return pt[0]
	}
	if len(pt) == 0 {
		return ""
	}
	return fmt.Sprintf("%v", []string(pt))
}

// orderedProperties keep their names' order (Ollama's ToolPropertiesMap
// of a nested object).
type orderedProperties struct {
	names []string
	props map[string]toolProperty
}

func (o *orderedProperties) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if t == nil {
		return nil
	}
	if d, ok := t.(json.Delim); !ok || d != '{' {
		return errors.New("properties is not an object")
	}
	o.props = map[string]toolProperty{}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return err
		}
		var p toolProperty
		if err := dec.Decode(&p); err != nil {
			return err
		}
		name := k.(string)
		if _, dup := o.props[name]; !dup {
			o.names = append(o.names, name)
		}
		o.props[name] = p
	}
	_, err = dec.Token()
	return err
}

func (o *orderedProperties) MarshalJSON() ([]byte, error) {
	if o == nil || o.props == nil {
		return []byte("null"), nil
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, n := range o.names {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(n)
		v, err := json.Marshal(o.props[n])
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// toolJSON is a tool as a request has it (Ollama's api.Tool).
type toolJSON struct {
	Type     string `json:"type"`
	Items    any    `json:"items"`
	Function struct {
		Name        string `json:"name"`
		Description string `json:"description"`
		Parameters  struct {
			Type       string             `json:"type"`
			Defs       any                `json:"$defs"`
			Items      any                `json:"items"`
			Required   []string           `json:"required"`
			Properties *orderedProperties `json:"properties"`
		} `json:"parameters"`
	} `json:"function"`
}

func templateTools(raw []json.RawMessage) (tmplTools, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	out := make(tmplTools, len(raw))
	for i, r := range raw {
		if err := checkJSON(r); err != nil {
			return nil, fmt.Errorf("tools[%d]: %w", i, err)
		}
		var t toolJSON
		if err := json.Unmarshal(r, &t); err != nil {
			return nil, fmt.Errorf("tools[%d]: %w", i, err)
		}
		p := t.Function.Parameters
		var props tmplProperties
		if p.Properties != nil && p.Properties.props != nil {
			props = tmplProperties(p.Properties.props)
		}
		out[i] = tmplTool{Type: t.Type, Items: t.Items, Function: tmplToolFunction{
			Name: t.Function.Name, Description: t.Function.Description,
			Parameters: tmplParameters{Type: p.Type, Defs: p.Defs, Items: p.Items, Required: p.Required, Properties: props},
		}}
	}
	return out, nil
}

func templateMessages(msgs []ChatMessage) ([]*tmplMessage, error) {
	out := make([]*tmplMessage, len(msgs))
	for i, m := range msgs {
		tm := &tmplMessage{Role: m.Role, Content: m.Content, Thinking: m.Thinking, ToolName: m.ToolName, ToolCallID: m.ToolCallID}
		for j, c := range m.ToolCalls {
			var args map[string]any
			if len(c.Arguments) > 0 {
				if err := checkJSON(c.Arguments); err != nil {
					return nil, fmt.Errorf("messages[%d].tool_calls[%d].arguments: %w", i, j, err)
				}
				dec := json.NewDecoder(bytes.NewReader(c.Arguments))
				dec.UseNumber()
				if err := dec.Decode(&args); err != nil || args == nil {
					return nil, fmt.Errorf("messages[%d].tool_calls[%d].arguments is not a JSON object", i, j)
				}
			}
			tm.ToolCalls = append(tm.ToolCalls, tmplToolCall{ID: c.ID, Function: tmplToolCallFunction{Index: j, Name: c.Name, Arguments: tmplArgs(args)}})
		}
		out[i] = tm
	}
	return out, nil
}
