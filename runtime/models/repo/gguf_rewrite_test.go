package repo

import (
	"encoding/binary"
	"math"
	"os"
	"slices"
	"testing"

	"github.com/brokerd/brokerd/runtime/gguf"
)

// rewriteGGUF rewrites the GGUF file at path with its metadata
// changed by edit (keys in order, values by key) and its tensors, their
// infos and data section unchanged (or changed by editTensors).
func rewriteGGUF(t *testing.T, path string, edit func(keys []string, kv map[string]gguf.Value) []string, editTensors func([]gguf.Tensor)) {
	t.Helper()
	f, err := gguf.Open(path, gguf.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	keys := append([]string(nil), f.Keys...)
	kv := map[string]gguf.Value{}
	for k, v := range f.KV {
		kv[k] = v
	}
	tensors := append([]gguf.Tensor(nil), f.Tensors...)
	dataOff, align := f.DataOffset, f.Alignment
	f.Close()
	if edit != nil {
		keys = edit(keys, kv)
	}
	if editTensors != nil {
		editTensors(tensors)
	}
	var b []byte
	u32 := func(x uint32) { b = binary.LittleEndian.AppendUint32(b, x) }
	u64 := func(x uint64) { b = binary.LittleEndian.AppendUint64(b, x) }
	str := func(s string) { u64(uint64(len(s))); b = append(b, s...) }
	var scalar func(v any)
	scalar = func(v any) {
		switch x := v.(type) {
		case uint8:
			b = append(b, x)
		case int8:
			b = append(b, byte(x))
		case bool:
			if x {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		case uint16:
			b = binary.LittleEndian.AppendUint16(b, x)
		case int16:
			b = binary.LittleEndian.AppendUint16(b, uint16(x))
		case uint32:
			u32(x)
		case int32:
			u32(uint32(x))
		case float32:
			u32(math.Float32bits(x))
		case uint64:
			u64(x)
		case int64:
			u64(uint64(x))
		case float64:
			u64(math.Float64bits(x))
		case string:
			str(x)
		default:
			t.Fatalf("rewriteGGUF: value %T", v)
		}
	}
	b = append(b, "GGUF"...)
	u32(3)
	u64(uint64(len(tensors)))
	u64(uint64(len(keys)))
	for _, k := range keys {
		v := kv[k]
		str(k)
		u32(uint32(v.Type))
		if v.Type != gguf.ValueArray {
			scalar(v.Data)
			continue
		}
		u32(uint32(v.Elem))
		switch a := v.Data.(type) {
		case []string:
			u64(uint64(len(a)))
			for _, x := range a {
				str(x)
			}
		case []int32:
			u64(uint64(len(a)))
			for _, x := range a {
				u32(uint32(x))
			}
		case []uint32:
			u64(uint64(len(a)))
			for _, x := range a {
				u32(x)
			}
		case []float32:
			u64(uint64(len(a)))
			for _, x := range a {
				u32(math.Float32bits(x))
			}
		default:
			t.Fatalf("rewriteGGUF: array %T", v.Data)
		}
	}
	for _, tn := range tensors {
		str(tn.Name)
		u32(uint32(len(tn.Dims)))
		for _, d := range tn.Dims {
			u64(uint64(d))
		}
		u32(uint32(tn.Type))
		u64(uint64(tn.Offset - dataOff))
	}
	for int64(len(b))%align != 0 {
		b = append(b, 0)
	}
	b = append(b, raw[dataOff:]...)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func setKV(key string, v gguf.Value) func([]string, map[string]gguf.Value) []string {
	return func(keys []string, kv map[string]gguf.Value) []string {
		if _, ok := kv[key]; !ok {
			keys = append(keys, key)
		}
		kv[key] = v
		return keys
	}
}

func deleteKV(key string) func([]string, map[string]gguf.Value) []string {
	return func(keys []string, kv map[string]gguf.Value) []string {
		delete(kv, key)
		return slices.DeleteFunc(keys, func(k string) bool { return k == key })
	}
}
