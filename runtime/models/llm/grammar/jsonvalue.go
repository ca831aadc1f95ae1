package grammar

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
)

// jv is a JSON value that keeps object keys in document order (the order a
// schema's properties are generated in).
type jv struct {
	kind byte // 'o' object, 'a' array, 's' string, 'n' number, 'b' bool, 'z' null
	obj  []jkv
	arr  []*jv
	str  string
	num  json.Number
	b    bool
}

type jkv struct {
	k string
	v *jv
}

func (v *jv) get(k string) *jv {
	if v == nil || v.kind != 'o' {
		return nil
	}
	for _, kv := range v.obj {
		if kv.k == k {
			return kv.v
		}
	}
	return nil
}

func parseJSONOrdered(src []byte, maxDepth int) (*jv, error) {
	dec := json.NewDecoder(bytes.NewReader(src))
	dec.UseNumber()
	var read func(depth int) (*jv, error)
	read = func(depth int) (*jv, error) {
		if depth > maxDepth {
			return nil, tooLargef("JSON nested deeper than %d", maxDepth)
		}
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		switch x := t.(type) {
		case json.Delim:
			switch x {
			case '{':
				v := &jv{kind: 'o'}
				for dec.More() {
					kt, err := dec.Token()
					if err != nil {
						return nil, err
					}
					k, _ := kt.(string)
					for _, kv := range v.obj {
						if kv.k == k {
							return nil, invalidf("duplicate key %q in JSON object", k)
						}
					}
					val, err := read(depth + 1)
					if err != nil {
						return nil, err
					}
					v.obj = append(v.obj, jkv{k, val})
				}
				if _, err := dec.Token(); err != nil {
					return nil, err
				}
				return v, nil
			case '[':
				v := &jv{kind: 'a'}
				for dec.More() {
					val, err := read(depth + 1)
					if err != nil {
						return nil, err
					}
					v.arr = append(v.arr, val)
				}
				if _, err := dec.Token(); err != nil {
					return nil, err
				}
				return v, nil
			}
		case string:
			return &jv{kind: 's', str: x}, nil
		case json.Number:
			return &jv{kind: 'n', num: x}, nil
		case bool:
			return &jv{kind: 'b', b: x}, nil
		case nil:
			return &jv{kind: 'z'}, nil
		}
		return nil, invalidf("unexpected JSON token %v", t)
	}
	v, err := read(0)
	if err != nil {
		if errors.Is(err, ErrGrammarTooLarge) || errors.Is(err, ErrInvalidGrammar) {
			return nil, err
		}
		return nil, invalidf("JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, invalidf("JSON: trailing data after the document")
	}
	return v, nil
}

// compact is v's compact JSON text.
func (v *jv) compact(b *strings.Builder) {
	switch v.kind {
	case 'o':
		b.WriteByte('{')
		for i, kv := range v.obj {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(jsonQuote(kv.k))
			b.WriteByte(':')
			kv.v.compact(b)
		}
		b.WriteByte('}')
	case 'a':
		b.WriteByte('[')
		for i, x := range v.arr {
			if i > 0 {
				b.WriteByte(',')
			}
			x.compact(b)
		}
		b.WriteByte(']')
	case 's':
		b.WriteString(jsonQuote(v.str))
	case 'n':
		b.WriteString(v.num.String())
	case 'b':
		b.WriteString(strconv.FormatBool(v.b))
	default:
		b.WriteString("null")
	}
}

func jsonQuote(s string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(buf.String(), "\n")
}
