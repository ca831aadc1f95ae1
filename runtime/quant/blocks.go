package quant

// The block decoders. Each follows its dequantize_row_* in ggml's
// ggml-quants.c operation for operation: the same float32 products and sums
// in the same order, each rounded to float32 (an explicit float32(...) keeps
// Go from fusing a multiply and an add into one FMA, which ggml's reference
// build does not do), so the bits are the same. Offsets are those of the
// block structs in ggml-common.h; multi-byte fields are little-endian.

// Q4_0: {f16 d; u8 qs[16]}, x = (nibble - 8) * d; element j is the low
// nibble of qs[j], element j+16 the high one.
func q4_0Row(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := (*[18]byte)(src[i*18:])
		y := (*[32]float32)(dst[i*32:])
		d := f16(b[0:2])
		for j := 0; j < 16; j++ {
			x0 := int32(b[2+j]&0x0f) - 8
			x1 := int32(b[2+j]>>4) - 8
			y[j] = float32(x0) * d
			y[j+16] = float32(x1) * d
		}
	}
}

// Q4_1: {f16 d; f16 m; u8 qs[16]}, x = nibble*d + m.
func q4_1Row(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := (*[20]byte)(src[i*20:])
		y := (*[32]float32)(dst[i*32:])
		d, m := f16(b[0:2]), f16(b[2:4])
		for j := 0; j < 16; j++ {
			x0 := int32(b[4+j] & 0x0f)
			x1 := int32(b[4+j] >> 4)
			y[j] = float32(float32(x0)*d) + m
			y[j+16] = float32(float32(x1)*d) + m
		}
	}
}

// qh32 reads a block's 32 fifth bits (u8 qh[4], little-endian as ggml's
// memcpy into a uint32 on a little-endian host).
func qh32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// Q5_0: {f16 d; u8 qh[4]; u8 qs[16]}, x = (nibble | bit<<4) - 16) * d; bit j
// of qh is element j's fifth bit, bit j+16 element j+16's.
func q5_0Row(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := (*[22]byte)(src[i*22:])
		y := (*[32]float32)(dst[i*32:])
		d := f16(b[0:2])
		qh := qh32(b[2:6])
		for j := 0; j < 16; j++ {
			xh0 := uint8(qh>>uint(j)<<4) & 0x10
			xh1 := uint8(qh>>uint(j+12)) & 0x10
			x0 := int32(b[6+j]&0x0f|xh0) - 16
			x1 := int32(b[6+j]>>4|xh1) - 16
			y[j] = float32(x0) * d
			y[j+16] = float32(x1) * d
		}
	}
}

// Q5_1: {f16 d; f16 m; u8 qh[4]; u8 qs[16]}, x = (nibble | bit<<4)*d + m.
func q5_1Row(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := (*[24]byte)(src[i*24:])
		y := (*[32]float32)(dst[i*32:])
		d, m := f16(b[0:2]), f16(b[2:4])
		qh := qh32(b[4:8])
		for j := 0; j < 16; j++ {
			xh0 := uint8(qh>>uint(j)<<4) & 0x10
			xh1 := uint8(qh>>uint(j+12)) & 0x10
			x0 := int32(b[8+j]&0x0f | xh0)
			x1 := int32(b[8+j]>>4 | xh1)
			y[j] = float32(float32(x0)*d) + m
			y[j+16] = float32(float32(x1)*d) + m
		}
	}
}

// Q8_0: {f16 d; i8 qs[32]}, x = q * d.
func q8_0Row(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := (*[34]byte)(src[i*34:])
		y := (*[32]float32)(dst[i*32:])
		d := f16(b[0:2])
		for j := 0; j < 32; j++ {
			y[j] = float32(int8(b[2+j])) * d
		}
	}
}

// scaleMinK4 unpacks the j-th (0..7) 6-bit scale and min of a Q4_K or Q5_K
// block from its 12 scale bytes (ggml's get_scale_min_k4): the first four
// pairs are the low 6 bits of bytes 0..3 and 4..7; the last four take their
// low 4 bits from the nibbles of bytes 8..11 and their top 2 bits from the
// top bits of bytes 0..3 (scales) and 4..7 (mins).
func scaleMinK4(j int, q *[12]byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0x0f | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

// Q4_K: {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}: eight sub-blocks of 32
// elements, x = (d*sc)*nibble - dmin*m. Each 32 bytes of qs hold two
// sub-blocks: the low nibbles the first, the high nibbles the second.
func q4KRow(src []byte, dst []float32) {
	for i := 0; i < len(dst)/QK_K; i++ {
		b := (*[144]byte)(src[i*144:])
		y := (*[QK_K]float32)(dst[i*QK_K:])
		d, dmin := f16(b[0:2]), f16(b[2:4])
		scales := (*[12]byte)(b[4:16])
		q := b[16:144]
		is, o := 0, 0
		for j := 0; j < QK_K; j += 64 {
			sc, m := scaleMinK4(is, scales)
			d1, m1 := d*float32(sc), dmin*float32(m)
			sc, m = scaleMinK4(is+1, scales)
			d2, m2 := d*float32(sc), dmin*float32(m)
			qs := (*[32]byte)(q[o:])
			for l := 0; l < 32; l++ {
				y[j+l] = float32(d1*float32(qs[l]&0x0f)) - m1
			}
			for l := 0; l < 32; l++ {
				y[j+32+l] = float32(d2*float32(qs[l]>>4)) - m2
			}
			o += 32
			is += 2
		}
	}
}

// Q5_K: {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: Q4_K's
// layout plus a fifth bit per element: bit 2k of qh[l] for element l of the
// (2k)-th sub-block, bit 2k+1 for the (2k+1)-th.
func q5KRow(src []byte, dst []float32) {
	for i := 0; i < len(dst)/QK_K; i++ {
		b := (*[176]byte)(src[i*176:])
		y := (*[QK_K]float32)(dst[i*QK_K:])
		d, dmin := f16(b[0:2]), f16(b[2:4])
		scales := (*[12]byte)(b[4:16])
		qh := (*[32]byte)(b[16:48])
		ql := b[48:176]
		is, o := 0, 0
		u1, u2 := uint8(1), uint8(2)
		for j := 0; j < QK_K; j += 64 {
			sc, m := scaleMinK4(is, scales)
			d1, m1 := d*float32(sc), dmin*float32(m)
			sc, m = scaleMinK4(is+1, scales)
			d2, m2 := d*float32(sc), dmin*float32(m)
			qs := (*[32]byte)(ql[o:])
			for l := 0; l < 32; l++ {
				v := int32(qs[l] & 0x0f)
				if qh[l]&u1 != 0 {
					v += 16
				}
				y[j+l] = float32(d1*float32(v)) - m1
			}
			for l := 0; l < 32; l++ {
				v := int32(qs[l] >> 4)
				if qh[l]&u2 != 0 {
					v += 16
				}
				y[j+32+l] = float32(d2*float32(v)) - m2
			}
			o += 32
			is += 2
			u1 <<= 2
			u2 <<= 2
		}
	}
}

// Q6_K: {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: sixteen sub-blocks of
// 16 elements, x = (d*scale) * (q - 32) with q six bits: four low bits from
// ql, two high bits from qh. Each half of the block (128 elements) uses 64
// bytes of ql, 32 of qh and 8 scales; element l+32k of a half (k = 0..3)
// takes its low bits from ql[l] (k = 0, 2: low, high nibble) or ql[l+32]
// (k = 1, 3) and its high bits from bits 2k, 2k+1 of qh[l].
func q6KRow(src []byte, dst []float32) {
	for i := 0; i < len(dst)/QK_K; i++ {
		b := (*[210]byte)(src[i*210:])
		yb := (*[QK_K]float32)(dst[i*QK_K:])
		d := f16(b[208:210])
		for h := 0; h < 2; h++ {
			ql := (*[64]byte)(b[h*64:])
			qh := (*[32]byte)(b[128+h*32:])
			sc := (*[8]byte)(b[192+h*8:])
			y := (*[128]float32)(yb[h*128:])
			for l := 0; l < 32; l++ {
				is := l / 16
				q1 := int32(int8(ql[l]&0x0f|(qh[l]>>0&3)<<4)) - 32
				q2 := int32(int8(ql[l+32]&0x0f|(qh[l]>>2&3)<<4)) - 32
				q3 := int32(int8(ql[l]>>4|(qh[l]>>4&3)<<4)) - 32
				q4 := int32(int8(ql[l+32]>>4|(qh[l]>>6&3)<<4)) - 32
				y[l] = float32(d*float32(int8(sc[is]))) * float32(q1)
				y[l+32] = float32(d*float32(int8(sc[is+2]))) * float32(q2)
				y[l+64] = float32(d*float32(int8(sc[is+4]))) * float32(q3)
				y[l+96] = float32(d*float32(int8(sc[is+6]))) * float32(q4)
			}
		}
	}
}
