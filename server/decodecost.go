package server

import (
	"iter"
	"reflect"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// A decoded message costs more than its bytes: an empty submessage is two
// bytes on the wire and a Go struct of about a hundred behind a pointer in
// a slice grown by doubling. A 64 MiB request of empty EncodeItems decodes
// into some 4 GB. So the codec counts what a request will build before it
// decodes it (shapes.wire), and the budget charges a decoded request for
// it (shapes.decoded) besides twice its bytes.

// Per element, what decoding builds besides the element's own bytes (which
// the budget charges as twice the message's size).
const (
	// slotCost is a pointer or scalar's slot in a repeated field, with the
	// slack of a slice grown by appends (up to twice its length, and the
	// old array while the new one fills).
	slotCost = 3 * 8
	// stringCost is a string or bytes value's header, in a slot.
	stringCost = 3 * 16
	// oneofCost is the wrapper struct a oneof's set field lives in.
	oneofCost = 32
	// mapEntryCost is a map entry's share of the map's buckets.
	mapEntryCost = 96
	// unknownMessageCost stands for a message whose Go type is not linked in.
	unknownMessageCost = 256
)

// maxScanDepth stops the scan where protobuf's Unmarshal stops (its default
// recursion limit): deeper input fails to decode anyway.
const maxScanDepth = 10000

// shapes counts what decoding builds; it keeps the size of each message
// type's Go struct as it is first asked (the byte budget holds one).
type shapes struct {
	sizes sync.Map // protoreflect.FullName → int64
}

// messageCost is a message's Go struct, allocated on its own.
func (sh *shapes) messageCost(md protoreflect.MessageDescriptor) int64 {
	if md.IsMapEntry() {
		return mapEntryCost
	}
	if v, ok := sh.sizes.Load(md.FullName()); ok {
		return v.(int64)
	}
	size := int64(unknownMessageCost)
	if mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName()); err == nil {
		if t := reflect.TypeOf(mt.Zero().Interface()); t.Kind() == reflect.Pointer {
			size = sizeClass(int64(t.Elem().Size()))
		}
	}
	sh.sizes.Store(md.FullName(), size)
	return size
}

// sizeClass is about what the allocator gives for size bytes: Go's size
// classes are 16 bytes apart up to 256 and at most 1/8 apart above.
func sizeClass(size int64) int64 {
	if size > 256 {
		size += size / 8
	}
	return (size + 15) &^ 15
}

// fieldCost is what one value of fd costs besides its bytes, its
// submessage's own fields not counted.
func (sh *shapes) fieldCost(fd protoreflect.FieldDescriptor) int64 {
	var c int64
	switch {
	case fd.IsMap():
		return mapEntryCost
	case fd.Message() != nil:
		c = sh.messageCost(fd.Message()) + slotCost
	case fd.Kind() == protoreflect.StringKind || fd.Kind() == protoreflect.BytesKind:
		c = stringCost
	default:
		c = slotCost
	}
	if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
		c += oneofCost
	}
	return c
}

// wire is what unmarshalling b into a message of md builds besides
// b's bytes, counted from the wire without decoding. Input that does not
// parse is counted as far as it goes: Unmarshal refuses it.
func (sh *shapes) wire(md protoreflect.MessageDescriptor, b []byte) int64 {
	return sh.scanWire(md, b, 0)
}

func (sh *shapes) scanWire(md protoreflect.MessageDescriptor, b []byte, depth int) int64 {
	if depth > maxScanDepth {
		return 0
	}
	fields := md.Fields()
	var cost int64
	for f := range wireFields(b) {
		fd := fields.ByNumber(f.num)
		switch {
		case fd == nil: // unknown fields are kept as their bytes
		case f.typ != protowire.BytesType:
			cost += sh.fieldCost(fd)
		case fd.IsMap():
			cost += sh.mapEntryWire(fd, f.val, depth)
		case fd.Message() != nil:
			cost += sh.fieldCost(fd) + sh.scanWire(fd.Message(), f.val, depth+1)
		case fd.Kind() == protoreflect.StringKind || fd.Kind() == protoreflect.BytesKind:
			cost += sh.fieldCost(fd)
		default: // a packed repeated scalar
			cost += packedCount(fd.Kind(), f.val) * slotCost
		}
	}
	return cost
}

// mapEntryWire is what one entry of map field fd costs, its wire form v:
// decoding gives every entry a key and a value, on the wire or not.
func (sh *shapes) mapEntryWire(fd protoreflect.FieldDescriptor, v []byte, depth int) int64 {
	cost := mapEntryCost + sh.fieldCost(fd.MapKey()) + sh.fieldCost(fd.MapValue())
	vd := fd.MapValue().Message()
	if vd == nil {
		return cost
	}
	for f := range wireFields(v) {
		if f.num == fd.MapValue().Number() && f.typ == protowire.BytesType {
			cost += sh.scanWire(vd, f.val, depth+1)
		}
	}
	return cost
}

// scalarFields is b's top-level fields that are one scalar or string each
// (a request's id and model), which cost no more to decode than their bytes.
func scalarFields(md protoreflect.MessageDescriptor, b []byte) []byte {
	var out []byte
	for f := range wireFields(b) {
		if fd := md.Fields().ByNumber(f.num); fd != nil && fd.Cardinality() != protoreflect.Repeated && fd.Message() == nil {
			out = append(out, f.raw...)
		}
	}
	return out
}

// wireField is one field of a message's wire form.
type wireField struct {
	num protowire.Number
	typ protowire.Type
	raw []byte // its tag and value
	val []byte // its value; a length-delimited one's payload
}

// wireFields walks b's fields, up to the first malformed one (Unmarshal
// refuses it; what came before is counted).
func wireFields(b []byte) iter.Seq[wireField] {
	return func(yield func(wireField) bool) {
		for len(b) > 0 {
			num, typ, n := protowire.ConsumeTag(b)
			if n < 0 {
				return
			}
			m := protowire.ConsumeFieldValue(num, typ, b[n:])
			if m < 0 {
				return
			}
			f := wireField{num: num, typ: typ, raw: b[:n+m], val: b[n : n+m]}
			if typ == protowire.BytesType {
				f.val, _ = protowire.ConsumeBytes(b[n:])
			}
			if !yield(f) {
				return
			}
			b = b[n+m:]
		}
	}
}

// packedCount is how many values a packed field's payload holds.
func packedCount(k protoreflect.Kind, v []byte) int64 {
	switch k {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return int64(len(v) / 4)
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return int64(len(v) / 8)
	}
	var n int64 // varints: one ends at each byte without the high bit
	for _, c := range v {
		if c < 0x80 {
			n++
		}
	}
	return n
}

// decoded is wire of a decoded message: what its fields cost
// besides their bytes.
func (sh *shapes) decoded(m protoreflect.Message) int64 {
	var cost int64
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			// On the wire an entry is a message of its key and value.
			mv := v.Map()
			cost += int64(mv.Len()) * (mapEntryCost + sh.fieldCost(fd.MapKey()) + sh.fieldCost(fd.MapValue()))
			if fd.MapValue().Message() != nil {
				mv.Range(func(_ protoreflect.MapKey, e protoreflect.Value) bool {
					cost += sh.decoded(e.Message())
					return true
				})
			}
		case fd.IsList():
			l := v.List()
			cost += int64(l.Len()) * sh.fieldCost(fd)
			if fd.Message() != nil {
				for i := range l.Len() {
					cost += sh.decoded(l.Get(i).Message())
				}
			}
		default:
			cost += sh.fieldCost(fd)
			if fd.Message() != nil {
				cost += sh.decoded(v.Message())
			}
		}
		return true
	})
	return cost
}
