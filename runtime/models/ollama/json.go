package ollama

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
)

// maxJSONDepth bounds the nesting of the JSON files read (a manifest is
// 3 deep, a messages layer with tool calls a few more).
const maxJSONDepth = 64

// strictJSON decodes b, exactly one JSON value nested at most
// maxJSONDepth deep whose objects repeat no key, into v. Unknown fields are
// let through, as Ollama lets them through.
func strictJSON(b []byte, v any) error {
	if err := checkJSON(b); err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("%s is a JSON %s, not %s", fieldName(te), te.Value, jsonKind(te.Type))
		}
		return err
	}
	return nil
}

// jsonKind is what JSON a Go type reads.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return t.String()
}

func fieldName(te *json.UnmarshalTypeError) string {
	if te.Field == "" {
		return "the value"
	}
	return fmt.Sprintf("%q", te.Field)
}

// checkJSON checks b's shape without building it.
func checkJSON(b []byte) error {
	type frame struct {
		obj, wantKey bool
		keys         map[string]struct{}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var st []frame
	seen := false
	after := func() {
		if n := len(st); n > 0 && st[n-1].obj {
			st[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			if !seen {
				return fmt.Errorf("empty")
			}
			if len(st) > 0 {
				return fmt.Errorf("truncated JSON")
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("malformed JSON: %w", err)
		}
		if len(st) == 0 && seen {
			return fmt.Errorf("malformed JSON: data after the value (at byte %d)", dec.InputOffset())
		}
		if n := len(st); n > 0 && st[n-1].obj && st[n-1].wantKey {
			if tok == json.Delim('}') {
				st = st[:n-1]
				after()
				continue
			}
			k, _ := tok.(string)
			if _, dup := st[n-1].keys[k]; dup {
				return fmt.Errorf("malformed JSON: key %q twice in one object", clip([]byte(k)))
			}
			st[n-1].keys[k] = struct{}{}
			st[n-1].wantKey = false
			continue
		}
		seen = true
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if len(st) >= maxJSONDepth {
				return fmt.Errorf("JSON nested more than %d deep", maxJSONDepth)
			}
			f := frame{obj: tok == json.Delim('{')}
			if f.obj {
				f.wantKey, f.keys = true, map[string]struct{}{}
			}
			st = append(st, f)
		case json.Delim(']'):
			st = st[:len(st)-1]
			after()
		default:
			after()
		}
	}
}
