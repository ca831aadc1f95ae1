package ollama

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"unicode/utf8"
)

// fmt builds a whole result in its own buffer before anything can count
// it (Fprintf too writes once, at the end), and a directive's width or
// precision makes up to ten million bytes out of a few of format: the
// render's allocation bound has to hold before fmt runs. So printf and
// its kin first bound what a call can make, from its format and its
// arguments' shapes, and refuse a call whose bound does not fit what is
// left of the render's budget.

const (
	// fmtNodeBytes bounds what fmt prints of one value beyond its
	// strings' bytes and its width and precision: a number (a float64's
	// %f is up to 316 digits, a complex's two), a bool, an address,
	// brackets and separators, a field's name (%+v), a bad verb's
	// "%!d(type=...)" wrapper, or a Stringer's JSON punctuation around
	// it, hex-escaped (% #x).
	fmtNodeBytes = 1024
	// fmtEscape bounds how far a verb that escapes grows a string's bytes:
	// % #x writes "0x61 " for each, %q "\x01", and a Stringer's JSON
	// "\u0001".
	fmtEscape = 6
	// fmtDirectiveBytes bounds a directive's own error text (%!(BADWIDTH),
	// %!d(BADINDEX), %!d(MISSING), ...).
	fmtDirectiveBytes = 64
	// fmtMaxArg bounds a '*' width or precision, taken from an argument
	// (fmt refuses one past 1e6; a number in the format is read as fmt
	// reads it, up to 1e6*10+9).
	fmtMaxArg = 1e6
)

// fmtShape is what fmt may make of one argument.
type fmtShape struct {
	nodes int64 // values fmt may format one by one, each padded to a directive's width
	text  int64 // string bytes, a Stringer's counted fmtEscape times (its String prints JSON)
}

// bytes bounds one formatting of the argument by a directive that pads
// each value by pad bytes and grows strings escape times.
func (s fmtShape) bytes(pad, escape int64) int64 {
	return satAdd(satMul(satAdd(pad, fmtNodeBytes), s.nodes), satMul(escape, s.text))
}

var (
	stringerType   = reflect.TypeFor[fmt.Stringer]()
	errorType      = reflect.TypeFor[error]()
	formatterType  = reflect.TypeFor[fmt.Formatter]()
	goStringerType = reflect.TypeFor[fmt.GoStringer]()
	marshalerType  = reflect.TypeFor[json.Marshaler]()
)

// hasPrintMethod reports whether fmt (or the JSON a Stringer prints)
// may print t through a method rather than by its structure.
func hasPrintMethod(t reflect.Type) bool {
	for _, m := range []reflect.Type{t, reflect.PointerTo(t)} {
		if m.Implements(stringerType) || m.Implements(errorType) || m.Implements(formatterType) ||
			m.Implements(goStringerType) || m.Implements(marshalerType) {
			return true
		}
	}
	return false
}

// shapeOf walks v as fmt would (and further: it follows every pointer,
// which fmt prints as an address past the top level, and Stringers'
// fields, which their JSON prints). It stops once the shape's least
// formatting passes limit, reporting false: such an argument cannot be
// printed within the budget anyway, and the stop bounds the walk.
//
// The data's methods (its Stringers print their value's JSON, or a list
// of its strings) print nothing their value does not hold: a method's
// subtree counts its strings fmtEscape times for the JSON escaping.
func shapeOf(v reflect.Value, limit int64) (fmtShape, bool) {
	var s fmtShape
	var walk func(v reflect.Value, escape int64) bool
	walk = func(v reflect.Value, escape int64) bool {
		s.nodes++
		if s.bytes(0, 1) > limit {
			return false
		}
		if !v.IsValid() {
			return true
		}
		if escape == 1 && hasPrintMethod(v.Type()) {
			escape = fmtEscape
		}
		switch v.Kind() {
		case reflect.String:
			s.text = satAdd(s.text, satMul(escape, int64(v.Len())))
			return s.bytes(0, 1) <= limit
		case reflect.Pointer, reflect.Interface:
			return v.IsNil() || walk(v.Elem(), escape)
		case reflect.Slice, reflect.Array:
			for i := range v.Len() {
				if !walk(v.Index(i), escape) {
					return false
				}
			}
		case reflect.Map:
			for it := v.MapRange(); it.Next(); {
				if !walk(it.Key(), escape) || !walk(it.Value(), escape) {
					return false
				}
			}
		case reflect.Struct:
			for i := range v.NumField() {
				if !walk(v.Field(i), escape) {
					return false
				}
			}
		case reflect.Complex64, reflect.Complex128:
			s.nodes++ // its two parts each take the width
		}
		return true
	}
	ok := walk(v, 1)
	return s, ok
}

// argShapes are the shapes of args and their largest, or false when one
// alone cannot be printed within limit.
func argShapes(args []any, limit int64) (all, largest fmtShape, ok bool) {
	for _, a := range args {
		s, ok := shapeOf(reflect.ValueOf(a), limit)
		if !ok {
			return all, largest, false
		}
		all.nodes, all.text = satAdd(all.nodes, s.nodes), satAdd(all.text, s.text)
		largest.nodes, largest.text = max(largest.nodes, s.nodes), max(largest.text, s.text)
	}
	return all, largest, true
}

// printBound bounds fmt.Sprint(args...) and fmt.Sprintln(args...): each
// argument once, as %v, with a separator.
func printBound(args []any, limit int64) int64 {
	all, _, ok := argShapes(args, limit)
	if !ok {
		return satAdd(limit, 1)
	}
	return satAdd(all.bytes(0, 1), int64(len(args))+1)
}

// printfBound bounds fmt.Sprintf(format, args...). Each directive may
// format any argument; the arguments left over may each be printed once
// more (%!(EXTRA ...)). A bound over limit may stop early, at limit+1.
func printfBound(format string, args []any, limit int64) int64 {
	all, largest, ok := argShapes(args, limit)
	if !ok {
		return satAdd(limit, 1)
	}
	n := satAdd(int64(len(format)), satAdd(fmtDirectiveBytes, all.bytes(0, 1)))
	eachDirective(format, func(pad int64, escapes bool) bool {
		escape := int64(1)
		if escapes {
			escape = fmtEscape
		}
		n = satAdd(n, satAdd(fmtDirectiveBytes, largest.bytes(pad, escape)))
		return n <= limit
	})
	return n
}

// eachDirective calls f with each directive fmt.Sprintf reads in format
// that formats an argument: the width plus the precision it pads each
// value to, and whether its flags or verb escape strings (#, q, x, X).
// It stops when f returns false. It follows fmt's doPrintf step by step,
// so that it sees every directive fmt does: one it merged with the next
// would hide an argument's formatting from the bound.
func eachDirective(format string, f func(pad int64, escapes bool) bool) {
	end := len(format)
	for i := 0; i < end; {
		j := strings.IndexByte(format[i:], '%')
		if j < 0 {
			return
		}
		i += j + 1
		escapes := false
	flags:
		for ; i < end; i++ {
			switch format[i] {
			case '#':
				escapes = true
			case '0', '+', '-', ' ':
			default:
				break flags
			}
		}
		var pad, num int64
		var afterIndex bool
		i, afterIndex = fmtArgIndex(format, i)
		if i < end && format[i] == '*' {
			i, pad, afterIndex = i+1, fmtMaxArg, false
		} else {
			num, _, i = fmtNum(format, i, end)
			pad += num
		}
		if i+1 < end && format[i] == '.' {
			i, afterIndex = fmtArgIndex(format, i+1)
			if i < end && format[i] == '*' {
				i, pad, afterIndex = i+1, pad+fmtMaxArg, false
			} else {
				num, _, i = fmtNum(format, i, end)
				pad += num
			}
		}
		if !afterIndex {
			i, _ = fmtArgIndex(format, i)
		}
		if i >= end {
			return // %!(NOVERB): no argument formatted
		}
		verb, size := rune(format[i]), 1
		if verb >= utf8.RuneSelf {
			verb, size = utf8.DecodeRuneInString(format[i:])
		}
		i += size
		if verb == '%' {
			continue // a literal percent, counted with the format's bytes
		}
		if !f(pad, escapes || verb == 'q' || verb == 'x' || verb == 'X') {
			return
		}
	}
}

// fmtNum is fmt's parsenum: the number at s[i:end], whether there was
// one, and where it ends. A number past fmt's bound swallows the rest of
// s[:end], as in fmt.
func fmtNum(s string, i, end int) (num int64, isnum bool, newi int) {
	for newi = i; newi < end && '0' <= s[newi] && s[newi] <= '9'; newi++ {
		if num > 1e6 {
			return 0, false, end
		}
		num = num*10 + int64(s[newi]-'0')
		isnum = true
	}
	return num, isnum, newi
}

// fmtArgIndex is fmt's argNumber, less the argument: it skips an
// explicit index ("[n]") at s[i:] and reports whether one parsed (a bad
// one is skipped too, up to its closing bracket).
func fmtArgIndex(s string, i int) (newi int, found bool) {
	if i >= len(s) || s[i] != '[' {
		return i, false
	}
	t := s[i:]
	if len(t) < 3 {
		return i + 1, false
	}
	for k := 1; k < len(t); k++ {
		if t[k] == ']' {
			_, isnum, end := fmtNum(t, 1, k)
			return i + k + 1, isnum && end == k
		}
	}
	return i + 1, false
}

// satAdd and satMul are non-negative sums and products that stop at the
// largest int64 rather than wrap.
func satAdd(a, b int64) int64 {
	if a > maxInt64-b {
		return maxInt64
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if a != 0 && b > maxInt64/a {
		return maxInt64
	}
	return a * b
}

const maxInt64 = 1<<63 - 1
