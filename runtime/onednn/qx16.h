// The layout of a BD_X16 tile (qgemm.h), shared by qgemm.c's kernels and
// relayout and qamx.c's panel decoder. Internal to the adapter.
#ifndef BROKERD_QX16_H
#define BROKERD_QX16_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

// A BD_X16 tile's block of ggml type t (2, 3, 6, 7, 8, 12, 13, 14): its bytes, and
// the offsets of the mins, the fifth bits' masks and the quants in it.
// Q4_K's: d[16] | dmin[16] (f16) | its 12 scale bytes as three planes of
// 16 dwords (K16_SC) | quants (K16_QS): per pair p of sub-blocks, 8
// vectors whose byte 4j+i is row j's qs[32p+4c+i] (sub-block 2p's element
// 4c+i in the low nibble, 2p+1's in the high).
// Q6_K's: d[16] (f16) | its 16 sub-blocks' int8 scales, 16 rows each
// (Q6_SC: sub-block s at Q6_SC + 16s) | per sub-block s, 192 bytes of
// quants (Q6_QS + 192s): vectors A and B whose byte 4j+i holds row j's
// sub-block elements 4c+i in nibble c (A: c 0 and 1, B: 2 and 3, low
// nibble first), then C holding their top two bits, element 4c+i's at
// bits 2c. Sub-block s is the block's elements 16s..16s+15, scale s.
// Q5_K's: Q4_K's with the fifth bits as 64-bit masks between the scales
// and the quants (K5_QH + 64s + 8c: bit 4j+i is row j's fifth bit of
// sub-block s's element 4c+i), its quants at K5_QS.
#define X16_BLOCK(t) \
    ((t) == 8 ? 544 : (t) == 2 ? 288 : (t) == 3 ? 320 : (t) == 6 ? 352 : (t) == 12 ? 2304 : (t) == 13 ? 2816 : (t) == 14 ? 3360 : 384)
#define K5_QH 256
#define K5_QS 768
// Where a K type's quants start in its tile block.
#define K16_QSOF(t) ((t) == 13 ? K5_QS : K16_QS)
#define Q6_SC 32
#define Q6_QS 288
#define K16_SC 64
#define K16_QS 256
#define X16_MIN 32
#define X16_QH(t) ((t) == 6 ? 32 : 64)
#define X16_QS(t) ((t) == 8 || (t) == 2 ? 32 : (t) == 3 ? 64 : (t) == 6 ? 96 : 128)
// The offset the quants carry as stored there (w = a*(v - off), or a*v + m
// for Q4_1 and Q5_1): Q8_0's signed values XORed with 0x80 are q + 128.
#define X16_OFF(t) ((t) == 8 ? 128 : (t) == 2 ? 8 : (t) == 6 ? 16 : 0)

// Block wb's quants (32-element type T) as 8 vectors of unsigned values,
// vector c holding elements 4c..4c+3 of each row: the 4-bit types' nibbles
// split, the fifth bits added as 16s (qgemm's kz_x16, qamx's panels).
static inline __attribute__((always_inline, target("avx512f,avx512bw"))) void x16_unpack(const uint8_t *wb, int T,
        __m512i *wv) {
    if (T == 8) {
        for (int c = 0; c < 8; c++) wv[c] = _mm512_loadu_si512((const void *)(wb + 32 + 64 * c));
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f), h16 = _mm512_set1_epi8(0x10);
    for (int l = 0; l < 4; l++) {
        const __m512i v = _mm512_loadu_si512((const void *)(wb + X16_QS(T) + 64 * l));
        wv[l] = _mm512_and_si512(v, m4);
        wv[l + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    if (T == 6 || T == 7)
        for (int c = 0; c < 8; c++) {
            uint64_t hm;
            memcpy(&hm, wb + X16_QH(T) + 8 * c, 8);
            wv[c] = _mm512_mask_add_epi8(wv[c], (__mmask64)hm, wv[c], h16);
        }
}

#endif
