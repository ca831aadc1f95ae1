// Package grammar is the constrained-decoding engine: it keeps a sequence's
// output inside a grammar by computing, before each sampling step, the set
// of vocabulary tokens that may come next.
//
// # Constraints
//
// A constraint is a Kind and a source string:
//
//   - KindGBNF: llama.cpp's GBNF. Rules `name ::= alternatives` (names of
//     letters, digits, '-' and '_'; one rule per line, newlines allowed
//     inside parentheses and after '|' or '::='), alternation '|',
//     sequences, groups ( ), postfix * + ? {m} {m,} {m,n} {,n}, string
//     literals "…", character classes […] and [^…] with ranges, '.' (any
//     character), escapes \x.. \u.... \U........ \t \n \r \\ \" \[ \] \-,
//     comments '#'. The start rule is root. Token references <…> are
//     refused. Left recursion (also through rules that match the empty
//     string, like ("a"?)*) is refused at compile time (llama.cpp would
//     loop); rules that derive no finite string are refused or dropped.
//   - KindJSONSchema: a JSON Schema, translated to GBNF the way llama.cpp's
//     json-schema-to-grammar does (SchemaToGBNF). Supported: type (object,
//     array, string, number, integer, boolean, null, or a list of them),
//     properties, required, additionalProperties (false, true or a schema;
//     absent means none, as in llama.cpp — generation may stay inside a
//     subset of what validates; extra keys never repeat a declared one),
//     enum, const, items (a schema, true or false), prefixItems, minItems,
//     maxItems, anyOf and oneOf (as alternation: oneOf's exclusivity is not
//     enforced), allOf of object schemas (merged), $ref to #, #/$defs/…,
//     #/definitions/… (recursive too), minLength, maxLength, pattern (a
//     regular expression as below, unanchored unless ^/$), format date, time,
//     date-time and uuid (dates have valid days per month, February to the
//     28th), minimum/maximum/exclusiveMinimum/exclusiveMaximum on integers
//     (exact decimal ranges) and on numbers (the integers in range, with a
//     fraction where it stays in range; a range with no integer is refused).
//     Ignored, as annotations: title, description, default, examples,
//     $comment, $schema, $id, deprecated, readOnly, writeOnly, other
//     formats (email, uri, … are plain strings, as in llama.cpp),
//     uniqueItems false, unknown keywords. Refused with ErrUnsupportedSchema:
//     not, if/then/else, patternProperties, propertyNames, dependent*,
//     dependencies, unevaluated*, contains, min/maxContains, multipleOf,
//     min/maxProperties, uniqueItems true, $dynamicRef, remote $refs.
//     Numbers have at most 16 integer and 16 fraction digits and a 2-digit
//     exponent; a \u escape never spells a UTF-16 surrogate.
//   - KindJSON: any JSON object (Ollama format "json", OpenAI
//     response_format json_object).
//   - KindRegex: a regular expression in Go's RE2 syntax (Perl flags, as
//     regexp.Compile): literals, classes (\d \w \s \p{…}, [^…]), '.' (not
//     newline unless (?s)), groups, alternation, * + ? {m,n}, (?i). The
//     whole output must match; ^ $ \A \z only at the ends; \b \B refused.
//     Under (?i), a constraint's classes may span 2M case-folded
//     characters in all (maxFoldRunes).
//
// JSON whitespace is bounded as in llama.cpp (`space ::= | " " | "\n"{1,2}
// [ \t]{0,20}` between tokens), so a model cannot loop on spaces, and each
// generated string, number and array/object is finite by construction:
// a sequence always has a way to finish.
//
// # Engine
//
// A grammar is lowered to bytes (a character class becomes the UTF-8 byte
// sequences of its ranges, so matching is UTF-8 exact with no decoder
// state) and run as a pushdown automaton whose parse stacks are persistent,
// hash-consed linked lists (llama.cpp's stack sets, xgrammar's persistent
// stack). For every terminal position Compile walks the vocabulary trie
// once and sorts the tokens into accepted and rejected whatever the stack
// below holds, and a few context-dependent ones (xgrammar's adaptive token
// mask cache). Where a rule is entered from one place only, the walk
// follows what comes after it, so few tokens stay context-dependent; small
// shared rules (whitespace, strings, numbers) are copied per use for that,
// and the copies share their template's sets. Mask ORs the precomputed sets
// of the current stack tops and checks only the context-dependent tokens
// against the real stacks, in byte order so that common prefixes are
// stepped once, with the steps memoized per matcher.
//
// # Use from a sampler
//
// Once per model:
//
//	vocab, err := grammar.NewVocab(tokenBytes, eosIDs) // token i's bytes after byte-level decoding; nil for control tokens
//	cache := grammar.NewCache(256<<20, grammar.Limits{})
//
// Once per request (errors wrap ErrInvalidGrammar, ErrUnsupportedSchema or
// ErrGrammarTooLarge: answer INVALID_ARGUMENT / 400):
//
//	g, err := cache.Get(ctx, vocab, grammar.KindJSONSchema, schema)
//	m, err := g.NewMatcher()
//	mask := make([]uint64, vocab.MaskWords())
//
// Each decode step of that sequence (Mask can run while the forward pass
// computes the logits; it does not depend on them):
//
//	n, err := m.Mask(mask)
//	// err (ErrStackLimit, or a deferred position over its bounds): finish the
//	// sequence with a grammar error. n == 0: dead end, nothing is allowed and
//	// the grammar cannot end: finish with a clear reason, do not sample.
//	for id := range logits {
//		if !grammar.MaskAllows(mask, int32(id)) {
//			logits[id] = float32(math.Inf(-1))
//		}
//	}
//	id := sample(logits) // temperature, top-k/p… over what is left
//	if err := m.Accept(id); err != nil { … } // cannot fail for an allowed id unless ErrStackLimit
//	if m.IsTerminated() { … } // id was an EOS: the output is complete
//
// EOS tokens are allowed exactly when the output so far is a complete
// sentence (CanEnd). A sequence that stops for another reason (max tokens)
// may end incomplete. Rollback(n) undoes tokens (speculative decoding).
//
// # Bounds
//
// Limits bound what a client's grammar may cost: source size, rules and
// elements after expansion, nesting while parsing, repetition counts,
// compile-time states, and at run time the parse-stack depth, the number of
// stacks (ambiguity) and the work per byte. Compile (and ToGBNF and
// SchemaToGBNF) take a context.Context and stop once it ends; a schema's
// numeric bound costs the work of its bytes, whatever its exponent.
// Limits.Precompute bounds the time Compile spends
// precomputing (40ms by default): the positions left are computed the
// first time a Mask reaches them, under the grammar's lock, and cached in
// the Grammar for every later sequence.
//
// A Grammar is immutable (but for those deferred positions) and safe for
// concurrent use; a Matcher is one sequence's and not.
package grammar
