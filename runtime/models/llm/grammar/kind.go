package grammar

import (
	"context"
	"fmt"
)

// Kind says how a constraint's source is written.
type Kind uint8

const (
	// KindGBNF: a grammar in llama.cpp's GBNF, start rule `root`.
	KindGBNF Kind = iota + 1
	// KindJSONSchema: a JSON Schema document (see doc.go for the keywords).
	KindJSONSchema
	// KindJSON: any JSON object (Ollama format "json", OpenAI json_object);
	// the source is ignored.
	KindJSON
	// KindRegex: a regular expression (Go RE2 syntax, a subset of
	// ECMAScript's) the whole output must match.
	KindRegex
)

func (k Kind) String() string {
	switch k {
	case KindGBNF:
		return "gbnf"
	case KindJSONSchema:
		return "json_schema"
	case KindJSON:
		return "json"
	case KindRegex:
		return "regex"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// ToGBNF translates a constraint to GBNF (the identity for KindGBNF).
// A JSON Schema's and a regular expression's conversions check ctx as they
// go: they stop, with ctx's error, once the caller has gone.
func ToGBNF(ctx context.Context, kind Kind, src string, lim Limits) (string, error) {
	lim = lim.withDefaults()
	if len(src) > lim.MaxSourceBytes {
		return "", tooLargef("%s source is %d bytes (limit %d)", kind, len(src), lim.MaxSourceBytes)
	}
	switch kind {
	case KindGBNF:
		return src, nil
	case KindJSONSchema:
		return SchemaToGBNF(ctx, []byte(src), lim)
	case KindJSON:
		return AnyJSONObjectGBNF, nil
	case KindRegex:
		return RegexToGBNF(ctx, src, lim)
	}
	return "", invalidf("unknown constraint kind %d", kind)
}
