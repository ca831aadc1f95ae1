package server

import "testing"

func TestTokenText(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		want string
	}{
		{[]byte("hello"), "hello"},
		{[]byte(" ü"), " ü"},
		{[]byte{0xe2, 0x80}, `bytes:\xe2\x80`},
		{[]byte{'a', 0xff}, `bytes:\x61\xff`},
		{nil, ""},
	} {
		if got := tokenText(tc.in); got != tc.want {
			t.Errorf("tokenText(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
