package server

import "encoding/binary"

// bytesLE is a BYTES tensor's data: each element as a 4-byte
// little-endian length and its bytes.
func bytesLE(elems ...string) []byte {
	var b []byte
	for _, e := range elems {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e)))
		b = append(b, e...)
	}
	return b
}
