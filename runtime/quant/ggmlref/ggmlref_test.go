package ggmlref

import "testing"

// TestOpen opens the library (installing it when missing) and checks the
// traits layout against the library's accessors and known values (Open's
// check), and that every type runtime/quant decodes has a to_float or is
// f32.
func TestOpen(t *testing.T) {
	l := Find(t)
	t.Logf("%s: ggml %s, commit %s", l.Path, l.Version, l.Commit)
	for _, typ := range []uint32{0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30} {
		tr, err := l.Traits(typ)
		if err != nil {
			t.Fatal(err)
		}
		if typ != 0 && !tr.ToFloat {
			t.Errorf("type %d (%s) has no to_float", typ, tr.Name)
		}
		if l.RequiresImatrix(typ) {
			t.Errorf("type %d (%s) needs an importance matrix", typ, tr.Name)
		}
		t.Logf("type %2d %-5s %3d elements in %3d bytes", typ, tr.Name, tr.BlockElems, tr.BlockBytes)
	}
}

// TestRefusals: arguments ggml would abort on are refused before the call.
func TestRefusals(t *testing.T) {
	l := Find(t)
	if _, err := l.Quantize(2, make([]float32, 31), 1, 31); err == nil {
		t.Error("q4_0 row of 31 quantized")
	}
	if _, err := l.Quantize(2, make([]float32, 64), 3, 32); err == nil {
		t.Error("64 values as 3 rows of 32 quantized")
	}
	if _, err := l.ToFloat(2, make([]byte, 17), 32); err == nil {
		t.Error("17 bytes decoded as a q4_0 block")
	}
	if _, err := l.ToFloat(1000, nil, 0); err == nil {
		t.Error("type 1000 accepted")
	}
	if _, err := l.Traits(4); err == nil {
		// type 4 (Q4_2) was removed: ggml keeps an empty entry.
		if _, err := l.ToFloat(4, nil, 0); err == nil {
			t.Error("removed type 4 decoded")
		}
	}
}
