// Matrix products with GGUF block-quantized weights; see qgemm.h.
//
// The activations are quantized once per call into scratch, in groups of
// G rows (G = min(m, 8), or min(m, 4) for AVX2: the rows one pass over a
// weight row carries):
//   a32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), blocks of 32:
//     int8 q[(nb+1)/2][G][64]   a row's blocks in pairs (the AVX-512
//                               kernels load two at once)
//     f32  d[G][nbp], s[G][nbp] x ≈ d*q, s = d*Σq; a row's 8 blocks are one
//                               vector (nbp: nb rounded up to 8, zeros past)
//   ak (Q4_K, Q5_K, Q6_K), blocks of 256, per block:
//     int8 q[G][256] | f32 d[8] | int16 bs[8][8][2] | int16 br[G][16]
//                               bs[j][r]: row r's sums over 16-element groups
//                               2j and 2j+1 (the 8 rows' pairs one vector,
//                               lanes past G zeros); br: the same row by row
// with d = amax/127 and q = round-half-even(x * (127/amax)) per block,
// as ggml's quantize_row_q8_0 and quantize_row_q8_K do but with f32 scales:
// |x - d*q| <= d/2 (plus rounding of d), so a product's error from this
// step is at most Σ over blocks of d/2 * Σ|w| — the bound the tests use. A
// block holding an infinity or NaN gets d = s = NaN. F16 and BF16 weights
// read X as it is.
//
// A weight block decodes to u8 values v with w = a*v + o (a, o per block,
// per 32 or per 16 elements), so X·Wᵀ sums a*dx*(Σ v*q) + o*dx*(Σ q): the
// first in integers, the second from s or bs (Q8_0: |q| against x with
// q's sign, no o).

#include "qgemm.h"
#include "qx16.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static inline __attribute__((always_inline)) uint16_t le16(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline __attribute__((always_inline)) uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// How far ahead of the weights being read the kernels prefetch: the
// hardware's stream prefetch alone left a thread of a decode step at 0.6-0.7
// of the read bandwidth (Q8_0, Q4_0 from memory on a 2-core Xeon); 4 KiB
// ahead it streams at 0.85-1.0 (1 and 2 KiB gave less, 8 and 16 KiB no more).
#define BD_PREFETCH 4096
// The relaid kernels' (BD_X16) prefetch distance for R rows of
// activations: with one or two rows a tile's block (2-3 KiB for the K
// types) takes too little time for lines requested 4 KiB ahead to arrive,
// and requesting the block's own lines at once as it starts ran faster
// from memory (llama1024, one stream, 2 Zen 4 threads: Q5_K 3.6-4.2 ms a
// step against 5.1-5.9, Q8_0 4.7-6.1 against 5.8-6.5); from more rows on
// the block takes long enough for BD_PREFETCH.
#define X16_PF(R) ((R) <= 2 ? 0 : BD_PREFETCH)

// Prefetches the lines of [p, p+bytes) into L1.
static inline __attribute__((always_inline)) void bd_prefetch(const uint8_t *p, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)(p + o), _MM_HINT_T0);
}

// The activations' layout (see the top): bytes of one block of a group of
// G rows, and the offsets of d, s and bs in it.
// a32: q[(nb+1)/2][G][64] int8 (pairs of blocks, so the AVX-512 kernels
// load two blocks of a row at once; the second half of an odd last pair is
// zeros), then d[G][nbp] and s[G][nbp] f32, nbp = nb rounded up to 8
// (zeros past nb), so the scales of 8 blocks of a row are one vector.
#define A32_NBP(nb) (((nb) + 7) & ~(int64_t)7)
#define A32_QBYTES(nb, G) (((nb) + 1) / 2 * (G) * 64)
#define A32_Q(b, r, G) ((((b) >> 1) * (G) + (r)) * 64 + ((b) & 1) * 32)
#define A32_D(nb, r, G) (A32_QBYTES(nb, G) + (r) * A32_NBP(nb) * 4)
#define A32_S(nb, r, G) (A32_QBYTES(nb, G) + ((G) + (r)) * A32_NBP(nb) * 4)
// ak: q[G][256] int8 | d[8] f32 | bs[8][8][2] int16 (pair j of row r's
// sums per 16 at [j][r]: the 8 rows' pairs as one vector) | the same sums
// row by row, int16 br[G][16] (one row's 16 as one vector).
#define AK_BYTES(G) (256 * (int64_t)(G) + 32 + 256 + 32 * (int64_t)(G))
#define AK_D(G) (256 * (int64_t)(G))
#define AK_BS(G) (256 * (int64_t)(G) + 32)
#define AK_BR(G) (256 * (int64_t)(G) + 32 + 256)
// index in bs (int16) of row r's sum over the 16 elements g16*16…
#define AK_BSI(g16, r) ((g16) / 2 * 16 + 2 * (r) + ((g16) & 1))
// x16 (BD_X16's activations): int8 q[G][k] row by row | f32 d[G][nb] |
// int32 c[G][nb] = Σq of the block | f32 s[G][nb] = d*Σq. The offsets of
// row r's d, c and s.
#define X16_D(k, nb, r, G) ((G) * (k) + (r) * (nb) * 4)
#define X16_C(k, nb, r, G) ((G) * (k) + ((G) + (r)) * (nb) * 4)
#define X16_S(k, nb, r, G) ((G) * (k) + (2 * (G) + (r)) * (nb) * 4)
// k16 (BD_X16(12)'s activations, blocks of 256 as the ak layout): int8
// q[G][k] row by row | f32 d[G][nb] | int32 s[G][nb][4], s[p] = the sums of
// q over the block's elements 64p..64p+31 and 64p+32..64p+63 as two int16
// (low, high): sub-blocks 2p and 2p+1, against a pair of Q4_K's mins.
#define K16_D(k, nb, r, G) ((G) * (k) + (r) * (nb) * 4)
#define K16_S(k, nb, r, G) ((G) * (k) + (G) * (nb) * 4 + (r) * (nb) * 16)
// k6 (BD_X16(14)'s activations, blocks of 256 as the ak layout): int8
// q[G][k] row by row | f32 d[G][nb] | int32 s[G][nb][16], s[i] = -32 times
// the sum of q over the block's elements 16i..16i+15 (Q6_K's offset
// against sub-block i).
#define K6_D(k, nb, r, G) ((G) * (k) + (r) * (nb) * 4)
#define K6_S(k, nb, r, G) ((G) * (k) + (G) * (nb) * 4 + (r) * (nb) * 64)

// The 6-bit scales and mins of a Q4_K/Q5_K block (ggml's get_scale_min_k4
// for all eight at once): u holds the block's 12 scale bytes and becomes
// the eight scales (bytes 0..7) and the eight mins (bytes 8..15).
static inline __attribute__((always_inline)) void bd_k4_scales(uint32_t u[4]) {
    u[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    const uint32_t mins = u[1] & 0x3f3f3f3fu;
    u[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    u[2] = mins;
    u[0] &= 0x3f3f3f3fu;
}

// The weight types: ggml's number, elements and bytes per block, and the
// activations' form: 0 the a32 layout, 1 the ak layout, 2 X itself (the
// float types, whose weights are converted to f32 in registers), 3 the x16
// layout (BD_X16 of the 32-element types), 4 the k16 layout (BD_X16(12)),
// 5 the k6 layout (BD_X16(14)).
typedef struct {
    int type, elems, bytes, k;
} bd_qtype;

static const bd_qtype qtypes[] = {
    {2, 32, 18, 0},   // Q4_0
    {3, 32, 20, 0},   // Q4_1
    {6, 32, 22, 0},   // Q5_0
    {7, 32, 24, 0},   // Q5_1
    {8, 32, 34, 0},   // Q8_0
    {12, 256, 144, 1}, // Q4_K
    {13, 256, 176, 1}, // Q5_K
    {14, 256, 210, 1}, // Q6_K
    {1, 1, 2, 2},      // F16
    {30, 1, 2, 2},     // BF16
    {BD_X16(2), 32, 18, 3},
    {BD_X16(3), 32, 20, 3},
    {BD_X16(6), 32, 22, 3},
    {BD_X16(7), 32, 24, 3},
    {BD_X16(8), 32, 34, 3},
    {BD_X16(12), 256, 144, 4},
    {BD_X16(13), 256, 176, 4},
    {BD_X16(14), 256, 210, 5},
};

static const bd_qtype *qtype_of(int type) {
    for (size_t i = 0; i < sizeof qtypes / sizeof qtypes[0]; i++)
        if (qtypes[i].type == type) return &qtypes[i];
    return NULL;
}

// Bytes of one group of G rows of k activations.
static int64_t group_bytes(const bd_qtype *t, int64_t k, int64_t G) {
    const int64_t nb = k / t->elems;
    switch (t->k) {
    case 0: return A32_QBYTES(nb, G) + 2 * G * A32_NBP(nb) * 4;
    case 1: return nb * AK_BYTES(G);
    case 3: return G * k + 3 * G * nb * 4;
    case 4: return G * k + G * nb * 4 + G * nb * 16;
    case 5: return G * k + G * nb * 4 + G * nb * 64;
    }
    return 0;
}

// ---- The portable variant: the same integers and scales in plain C. ----

static inline float fp16_f(uint16_t h) {
    // ggml's GGML_FP16_TO_FP32 (exact for every half), as in dequant.c.
    const uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
    uint32_t u;
    float f;
    if (two_w < (1u << 27)) {
        u = (two_w >> 17) | (126u << 23);
        memcpy(&f, &u, 4);
        f -= 0.5f;
    } else {
        u = (two_w >> 4) + (0xE0u << 23);
        memcpy(&f, &u, 4);
        f *= 0x1.0p-112f;
    }
    memcpy(&u, &f, 4);
    u |= sign;
    memcpy(&f, &u, 4);
    return f;
}

static inline float h2f(const uint8_t *p) { return fp16_f(le16(p)); }

// Quantizes n (32 or 256) floats; returns d (NaN for a non-finite block,
// whose q are then zeros).
static float quant_block_base(const float *x, int n, int8_t *q) {
    float amax = 0.0f;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        bad |= !(a <= FLT_MAX);
        if (a > amax) amax = a;
    }
    if (bad) {
        memset(q, 0, (size_t)n);
        return NAN;
    }
    const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int i = 0; i < n; i++) q[i] = (int8_t)lrintf(x[i] * id);
    return d;
}

static void quant_a32_base(const float *x, int64_t k, int64_t nb, int R, int64_t G, uint8_t *xg) {
    for (int r = 0; r < R; r++) {
        float *dd = (float *)(xg + A32_D(nb, r, G)), *ss = (float *)(xg + A32_S(nb, r, G));
        for (int64_t b = 0; b < nb; b++) {
            int8_t *q = (int8_t *)(xg + A32_Q(b, r, G));
            const float d = quant_block_base(x + r * k + 32 * b, 32, q);
            int32_t sum = 0;
            for (int i = 0; i < 32; i++) sum += q[i];
            dd[b] = d;
            ss[b] = d * (float)sum;
        }
        for (int64_t b = nb; b < A32_NBP(nb); b++) dd[b] = ss[b] = 0.0f;
        if (nb & 1) memset(xg + A32_Q(nb, r, G), 0, 32);
    }
}

static void quant_ak_base(const float *x, int64_t k, int64_t nb, int R, int64_t G, uint8_t *xg) {
    const int64_t bb = AK_BYTES(G);
    for (int64_t b = 0; b < nb; b++) memset(xg + b * bb + AK_D(G), 0, 32 + 256);
    for (int r = 0; r < R; r++) {
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = xg + b * bb;
            int8_t *q = (int8_t *)(blk + 256 * r);
            int16_t *bs = (int16_t *)(blk + AK_BS(G));
            ((float *)(blk + AK_D(G)))[r] = quant_block_base(x + r * k + 256 * b, 256, q);
            for (int g = 0; g < 16; g++) {
                int32_t sum = 0;
                for (int i = 0; i < 16; i++) sum += q[16 * g + i];
                bs[AK_BSI(g, r)] = (int16_t)sum;
                ((int16_t *)(blk + AK_BR(G)))[16 * r + g] = (int16_t)sum;
            }
        }
    }
}

// Decodes one weight block of a 32-block type: v (u8, or the signed q of
// Q8_0), the scale a and the offset o.
static void decode32_base(int type, const uint8_t *w, int16_t v[32], float *a, float *o) {
    const uint8_t *qs;
    uint32_t qh = 0;
    switch (type) {
    case 2: *a = h2f(w); *o = -8.0f * *a; qs = w + 2; break;
    case 3: *a = h2f(w); *o = h2f(w + 2); qs = w + 4; break;
    case 6: *a = h2f(w); *o = -16.0f * *a; qh = le32(w + 2); qs = w + 6; break;
    case 7: *a = h2f(w); *o = h2f(w + 2); qh = le32(w + 4); qs = w + 8; break;
    default: // 8
        *a = h2f(w);
        *o = 0.0f;
        for (int j = 0; j < 32; j++) v[j] = (int8_t)w[2 + j];
        return;
    }
    for (int j = 0; j < 16; j++) {
        v[j] = (int16_t)((qs[j] & 0x0f) | ((qh >> j) & 1) << 4);
        v[j + 16] = (int16_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
    }
}

// Row r of the group at xg against the weight row w.
static float dot32_base(int type, const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, int r) {
    const int bytes = qtype_of(type)->bytes;
    float acc = 0.0f, off = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += bytes) {
        const int8_t *q = (const int8_t *)(xg + A32_Q(b, r, G));
        int16_t v[32];
        float a, o;
        decode32_base(type, w, v, &a, &o);
        int32_t s = 0;
        for (int j = 0; j < 32; j++) s += v[j] * q[j];
        acc += a * ((const float *)(xg + A32_D(nb, r, G)))[b] * (float)s;
        off += o * ((const float *)(xg + A32_S(nb, r, G)))[b];
    }
    return acc + off;
}

static float dotk_base(int type, const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, int r) {
    const int bytes = qtype_of(type)->bytes;
    float acc = 0.0f, off = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += bytes) {
        const uint8_t *blk = xg + b * AK_BYTES(G);
        const int8_t *q = (const int8_t *)(blk + 256 * r);
        const float dx = ((const float *)(blk + AK_D(G)))[r];
        const int16_t *bs = (const int16_t *)(blk + AK_BS(G));
        int32_t isum = 0;
        if (type == 14) { // Q6_K: (d*sc)*(q6 - 32), a scale per 16
            const uint8_t *ql = w, *qh = w + 128;
            const int8_t *sc = (const int8_t *)(w + 192);
            for (int e = 0; e < 256; e++) {
                const int h = e / 128, g = (e % 128) / 32, l = e % 32;
                const uint8_t lo = ql[64 * h + 32 * (g & 1) + l];
                const int q6 = (g < 2 ? lo & 0x0f : lo >> 4) | ((qh[32 * h + l] >> (2 * g)) & 3) << 4;
                isum += sc[e / 16] * q6 * q[e];
            }
            int32_t c = 0;
            for (int j = 0; j < 16; j++) c += sc[j] * bs[AK_BSI(j, r)];
            acc += h2f(w + 208) * dx * (float)(isum - 32 * c);
            continue;
        }
        // Q4_K, Q5_K: (d*sc_j)*v - dmin*m_j per 32.
        uint32_t u[4];
        memcpy(u, w + 4, 12);
        bd_k4_scales(u);
        const uint8_t *sc = (const uint8_t *)u, *mn = sc + 8;
        const uint8_t *qh = w + 16, *qs = w + (type == 13 ? 48 : 16);
        for (int e = 0; e < 256; e++) {
            const int j = e / 32, l = e % 32;
            int v = j & 1 ? qs[32 * (j / 2) + l] >> 4 : qs[32 * (j / 2) + l] & 0x0f;
            if (type == 13) v |= ((qh[l] >> j) & 1) << 4;
            isum += sc[j] * v * q[e];
        }
        int32_t ms = 0;
        for (int j = 0; j < 8; j++) ms += mn[j] * (bs[AK_BSI(2 * j, r)] + bs[AK_BSI(2 * j + 1, r)]);
        acc += h2f(w) * dx * (float)isum;
        off -= h2f(w + 2) * dx * (float)ms;
    }
    return acc + off;
}

// Row r of X (x, f32) against a weight row of F16 (type 1) or BF16.
static float dotf_base(int type, const uint8_t *w, int64_t k, const float *x) {
    float acc = 0.0f;
    for (int64_t e = 0; e < k; e++) {
        const uint16_t h = le16(w + 2 * e);
        float f;
        if (type == 1) {
            f = fp16_f(h);
        } else {
            const uint32_t u = (uint32_t)h << 16;
            memcpy(&f, &u, 4);
        }
        acc += f * x[e];
    }
    return acc;
}

// R rows into a group of the x16 layout with G rows.
static void quant_x16_base(const float *x, int64_t k, int64_t nb, int R, int64_t G, uint8_t *xg) {
    for (int r = 0; r < R; r++) {
        float *dd = (float *)(xg + X16_D(k, nb, r, G)), *ss = (float *)(xg + X16_S(k, nb, r, G));
        int32_t *cc = (int32_t *)(xg + X16_C(k, nb, r, G));
        for (int64_t b = 0; b < nb; b++) {
            int8_t *q = (int8_t *)(xg + r * k + 32 * b);
            dd[b] = quant_block_base(x + r * k + 32 * b, 32, q);
            int32_t sum = 0;
            for (int i = 0; i < 32; i++) sum += q[i];
            cc[b] = sum;
            ss[b] = dd[b] * (float)sum;
        }
    }
}

// Q6_K's block in ggml's layout (rb) as its 256 six-bit values v (ggml's
// dequantize_row_q6_K without the -32 and the scales), and back.
static void q6_values(const uint8_t *rb, uint8_t v[256]) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *ql = rb + 64 * h, qh = rb[128 + 32 * h + l];
            uint8_t *y = v + 128 * h;
            y[l] = (uint8_t)((ql[l] & 0x0f) | (qh & 3) << 4);
            y[l + 32] = (uint8_t)((ql[l + 32] & 0x0f) | (qh >> 2 & 3) << 4);
            y[l + 64] = (uint8_t)((ql[l] >> 4) | (qh >> 4 & 3) << 4);
            y[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (qh >> 6 & 3) << 4);
        }
}

static void q6_pack(const uint8_t v[256], uint8_t *rb) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *y = v + 128 * h;
            rb[64 * h + l] = (uint8_t)((y[l] & 0x0f) | (y[l + 64] & 0x0f) << 4);
            rb[64 * h + l + 32] = (uint8_t)((y[l + 32] & 0x0f) | (y[l + 96] & 0x0f) << 4);
            rb[128 + 32 * h + l] = (uint8_t)(y[l] >> 4 | (y[l + 32] >> 4) << 2 | (y[l + 64] >> 4) << 4 | (y[l + 96] >> 4) << 6);
        }
}

// Row j of a BD_X16(14) tile block: its sub-block s's element 4c+i is
// nibble c&1 of byte 4j+i of vector A (c < 2) or B, its top two bits at
// 2c of C's (qx16.h).
static void q6_get(const uint8_t *xb, int j, uint8_t *rb) {
    uint8_t v[256];
    for (int s = 0; s < 16; s++) {
        rb[192 + s] = xb[Q6_SC + 16 * s + j];
        const uint8_t *qp = xb + Q6_QS + 192 * s + 4 * j;
        for (int i = 0; i < 4; i++) {
            const uint8_t a = qp[i], b = qp[64 + i], c = qp[128 + i];
            uint8_t *y = v + 16 * s + i;
            y[0] = (uint8_t)((a & 0x0f) | (c & 3) << 4);
            y[4] = (uint8_t)((a >> 4) | (c >> 2 & 3) << 4);
            y[8] = (uint8_t)((b & 0x0f) | (c >> 4 & 3) << 4);
            y[12] = (uint8_t)((b >> 4) | (c >> 6) << 4);
        }
    }
    q6_pack(v, rb);
    memcpy(rb + 208, xb + 2 * j, 2);
}

static void q6_put(uint8_t *xb, int j, const uint8_t *rb) {
    uint8_t v[256];
    q6_values(rb, v);
    memcpy(xb + 2 * j, rb + 208, 2);
    for (int s = 0; s < 16; s++) {
        xb[Q6_SC + 16 * s + j] = rb[192 + s];
        uint8_t *qp = xb + Q6_QS + 192 * s + 4 * j;
        for (int i = 0; i < 4; i++) {
            const uint8_t *y = v + 16 * s + i;
            qp[i] = (uint8_t)((y[0] & 0x0f) | (y[4] & 0x0f) << 4);
            qp[64 + i] = (uint8_t)((y[8] & 0x0f) | (y[12] & 0x0f) << 4);
            qp[128 + i] = (uint8_t)(y[0] >> 4 | (y[4] >> 4) << 2 | (y[8] >> 4) << 4 | (y[12] >> 4) << 6);
        }
    }
}

// Row j's block at xb of a BD_X16(t) tile, back into ggml's layout at rb
// (t's bytes); x16_put is the reverse (the tile's fifth-bit masks must
// start zeroed: it ORs row j's bits into them).
static void x16_get(int t, const uint8_t *xb, int j, uint8_t *rb) {
    if (t == 14) {
        q6_get(xb, j, rb);
        return;
    }
    memcpy(rb, xb + 2 * j, 2);
    if (t == 12 || t == 13) {
        const int qs = t == 13 ? 48 : 16; // ggml's qs offset: Q5_K's qh[32] comes first
        memcpy(rb + 2, xb + X16_MIN + 2 * j, 2);
        for (int p = 0; p < 3; p++) memcpy(rb + 4 + 4 * p, xb + K16_SC + 64 * p + 4 * j, 4);
        for (int l = 0; l < 128; l += 4) memcpy(rb + qs + l, xb + K16_QSOF(t) + 512 * (l / 32) + 64 * (l % 32 / 4) + 4 * j, 4);
        if (t == 13) {
            // qh[l] bit s is sub-block s's element l: mask (s, l/4) bit
            // 4j + l%4, so row j's four bits of a mask are one nibble.
            memset(rb + 16, 0, 32);
            for (int sb = 0; sb < 8; sb++)
                for (int c = 0; c < 8; c++) {
                    const int nib = xb[K5_QH + 64 * sb + 8 * c + j / 2] >> (4 * (j & 1)) & 0x0f;
                    for (int i = 0; i < 4; i++) rb[16 + 4 * c + i] |= (uint8_t)((nib >> i & 1) << sb);
                }
        }
        return;
    }
    if (t == 8) {
        for (int c = 0; c < 8; c++) {
            const uint32_t v = le32(xb + 32 + 64 * c + 4 * j) ^ 0x80808080u;
            memcpy(rb + 2 + 4 * c, &v, 4); // little-endian, as le32 read it
        }
        return;
    }
    uint8_t *q = rb + 2;
    if (t == 3 || t == 7) memcpy(q, xb + X16_MIN + 2 * j, 2), q += 2;
    if (t == 6 || t == 7) {
        uint32_t qh = 0;
        for (int c = 0; c < 8; c++) qh |= (uint32_t)(xb[X16_QH(t) + 8 * c + j / 2] >> (4 * (j & 1)) & 0x0f) << (4 * c);
        memcpy(q, &qh, 4), q += 4; // little-endian, as ggml's qh
    }
    for (int l = 0; l < 16; l += 4) memcpy(q + l, xb + X16_QS(t) + 64 * (l / 4) + 4 * j, 4);
}

static void x16_put(int t, uint8_t *xb, int j, const uint8_t *rb) {
    if (t == 14) {
        q6_put(xb, j, rb);
        return;
    }
    memcpy(xb + 2 * j, rb, 2);
    if (t == 12 || t == 13) {
        const int qs = t == 13 ? 48 : 16;
        memcpy(xb + X16_MIN + 2 * j, rb + 2, 2);
        for (int p = 0; p < 3; p++) memcpy(xb + K16_SC + 64 * p + 4 * j, rb + 4 + 4 * p, 4);
        for (int l = 0; l < 128; l += 4) memcpy(xb + K16_QSOF(t) + 512 * (l / 32) + 64 * (l % 32 / 4) + 4 * j, rb + qs + l, 4);
        if (t == 13)
            for (int sb = 0; sb < 8; sb++)
                for (int c = 0; c < 8; c++) {
                    int nib = 0;
                    for (int i = 0; i < 4; i++) nib |= (rb[16 + 4 * c + i] >> sb & 1) << i;
                    xb[K5_QH + 64 * sb + 8 * c + j / 2] |= (uint8_t)(nib << (4 * (j & 1)));
                }
        return;
    }
    if (t == 8) {
        for (int c = 0; c < 8; c++) {
            const uint32_t v = le32(rb + 2 + 4 * c) ^ 0x80808080u;
            memcpy(xb + 32 + 64 * c + 4 * j, &v, 4);
        }
        return;
    }
    const uint8_t *q = rb + 2;
    if (t == 3 || t == 7) memcpy(xb + X16_MIN + 2 * j, q, 2), q += 2;
    if (t == 6 || t == 7) {
        const uint32_t qh = le32(q);
        // Mask c's bits 4j..4j+3 are qh's bits 4c..4c+3: a nibble of byte j/2.
        for (int c = 0; c < 8; c++) xb[X16_QH(t) + 8 * c + j / 2] |= (uint8_t)((qh >> (4 * c) & 0x0f) << (4 * (j & 1)));
        q += 4;
    }
    for (int l = 0; l < 16; l += 4) memcpy(xb + X16_QS(t) + 64 * (l / 4) + 4 * j, q + l, 4);
}

// R rows of the group at xg against one tile of 16 BD_X16(t) rows into
// out[r*16 + j]: each row's block back in ggml's layout, then dot32_base's
// sums.
static void x16_base(int t, const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, int R, float *out) {
    const int64_t k = 32 * nb;
    for (int r = 0; r < R; r++) {
        const int8_t *q = (const int8_t *)(xg + r * k);
        const float *dx = (const float *)(xg + X16_D(k, nb, r, G)), *sx = (const float *)(xg + X16_S(k, nb, r, G));
        for (int j = 0; j < 16; j++) {
            float acc = 0.0f, off = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t rb[34];
                int16_t v[32];
                float a, o;
                x16_get(t, w + b * X16_BLOCK(t), j, rb);
                decode32_base(t, rb, v, &a, &o);
                int32_t s = 0;
                for (int e = 0; e < 32; e++) s += v[e] * q[32 * b + e];
                acc += a * dx[b] * (float)s;
                off += o * sx[b];
            }
            out[r * 16 + j] = acc + off;
        }
    }
}

// Fills row r's block b of a k16 group from the ak layout of that block
// alone (G = 1, at a).
static void k16_from_ak(const uint8_t *a, int64_t k, int64_t nb, int r, int64_t b, int64_t G, uint8_t *xg) {
    memcpy(xg + r * k + 256 * b, a, 256);
    ((float *)(xg + K16_D(k, nb, r, G)))[b] = ((const float *)(a + AK_D(1)))[0];
    const int16_t *br = (const int16_t *)(a + AK_BR(1));
    int32_t *s = (int32_t *)(xg + K16_S(k, nb, r, G)) + 4 * b;
    for (int p = 0; p < 4; p++)
        s[p] = (int32_t)((uint32_t)(uint16_t)(br[4 * p] + br[4 * p + 1]) |
                (uint32_t)(uint16_t)(br[4 * p + 2] + br[4 * p + 3]) << 16);
}

// Fills row r's block b of a group from the ak layout of that block alone
// (k16_from_ak, k6_from_ak).
typedef void (*bd_akfill)(const uint8_t *a, int64_t k, int64_t nb, int r, int64_t b, int64_t G, uint8_t *xg);

// R rows into a group of G rows, each block quantized in the ak layout
// alone and then put where fill puts it.
static void quant_via_ak_base(bd_akfill fill, const float *x, int64_t k, int64_t nb, int R, int64_t G, uint8_t *xg) {
    uint8_t a[AK_BYTES(1)] __attribute__((aligned(64)));
    for (int r = 0; r < R; r++)
        for (int64_t b = 0; b < nb; b++) {
            quant_ak_base(x + r * k + 256 * b, 256, 1, 1, 1, a);
            fill(a, k, nb, r, b, G, xg);
        }
}

// R rows into a group of the k16 layout with G rows: each block quantized
// as the ak layout quantizes it (so every variant gets the same int8).
static void quant_k16_base(const float *x, int64_t k, int64_t nb, int R, int64_t G, uint8_t *xg) {
    quant_via_ak_base(k16_from_ak, x, k, nb, R, G, xg);
}

// R rows of the group at xg against one tile of 16 BD_X16(12) rows into
// out[r*16 + j]: each row's block back in Q4_K's layout, then dotk_base's
// sums.
static void k16_base_t(int t, const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, int R, float *out) {
    const int64_t k = 256 * nb;
    for (int r = 0; r < R; r++) {
        const int8_t *q = (const int8_t *)(xg + r * k);
        const float *dx = (const float *)(xg + K16_D(k, nb, r, G));
        const int32_t *sx = (const int32_t *)(xg + K16_S(k, nb, r, G));
        for (int j = 0; j < 16; j++) {
            float acc = 0.0f, off = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t rb[176];
                x16_get(t, w + b * X16_BLOCK(t), j, rb);
                const int qs = t == 13 ? 48 : 16;
                uint32_t u[4];
                memcpy(u, rb + 4, 12);
                bd_k4_scales(u);
                const uint8_t *sc = (const uint8_t *)u, *mn = sc + 8;
                int32_t isum = 0, ms = 0;
                for (int e = 0; e < 256; e++) {
                    const int jj = e / 32, l = e % 32;
                    int v = jj & 1 ? rb[qs + 32 * (jj / 2) + l] >> 4 : rb[qs + 32 * (jj / 2) + l] & 0x0f;
                    if (t == 13) v |= (rb[16 + l] >> jj & 1) << 4; // Q5_K's fifth bit
                    isum += sc[jj] * v * q[256 * b + e];
                }
                for (int p = 0; p < 4; p++) {
                    const uint32_t sp = (uint32_t)sx[4 * b + p];
                    ms += mn[2 * p] * (int16_t)(sp & 0xffff) + mn[2 * p + 1] * (int16_t)(sp >> 16);
                }
                acc += h2f(rb) * dx[b] * (float)isum;
                off -= h2f(rb + 2) * dx[b] * (float)ms;
            }
            out[r * 16 + j] = acc + off;
        }
    }
}

static void k16_base(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, int R, float *out) {
    k16_base_t(12, w, nb, xg, G, R, out);
}

static void k5x16_base(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, int R, float *out) {
    k16_base_t(13, w, nb, xg, G, R, out);
}

// Fills row r's block b of a k6 group from the ak layout of that block
// alone (G = 1, at a).
static void k6_from_ak(const uint8_t *a, int64_t k, int64_t nb, int r, int64_t b, int64_t G, uint8_t *xg) {
    memcpy(xg + r * k + 256 * b, a, 256);
    ((float *)(xg + K6_D(k, nb, r, G)))[b] = ((const float *)(a + AK_D(1)))[0];
    const int16_t *br = (const int16_t *)(a + AK_BR(1));
    int32_t *s = (int32_t *)(xg + K6_S(k, nb, r, G)) + 16 * b;
    for (int i = 0; i < 16; i++) s[i] = -32 * br[i];
}

// R rows into a group of the k6 layout with G rows, as quant_k16_base.
static void quant_k6_base(const float *x, int64_t k, int64_t nb, int R, int64_t G, uint8_t *xg) {
    quant_via_ak_base(k6_from_ak, x, k, nb, R, G, xg);
}

// R rows of the group at xg against one tile of 16 BD_X16(14) rows into
// out[r*16 + j]: each row's block back in Q6_K's layout, its sub-blocks'
// integer sums (the offset from the k6 sums) times their scales summed
// whole, then one multiply by the block's scales.
static void q6x16_base(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, int R, float *out) {
    const int64_t k = 256 * nb;
    for (int r = 0; r < R; r++) {
        const int8_t *q = (const int8_t *)(xg + r * k);
        const float *dx = (const float *)(xg + K6_D(k, nb, r, G));
        const int32_t *sx = (const int32_t *)(xg + K6_S(k, nb, r, G));
        for (int j = 0; j < 16; j++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t rb[210], v[256];
                x16_get(14, w + b * 3360, j, rb);
                q6_values(rb, v);
                int32_t tot = 0;
                for (int s = 0; s < 16; s++) {
                    int32_t isum = sx[16 * b + s];
                    for (int i = 0; i < 16; i++) isum += v[16 * s + i] * q[256 * b + 16 * s + i];
                    tot += isum * (int8_t)rb[192 + s];
                }
                acc += h2f(rb + 208) * dx[b] * (float)tot;
            }
            out[r * 16 + j] = acc;
        }
    }
}

// ---- The x86 variants: qgemm_x86.h compiled twice. ----

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define QV(n) n##_avx2
#define QV_R 4
#include "qgemm_x86.h"
#undef QV
#undef QV_R
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")
#define QV(n) n##_vnni
#define QV_R 8
#define QV_VNNI 1
#define QV_NO_KERNELS 1 // its kernels are qgemm_avx512.h's, on 512-bit vectors
#include "qgemm_x86.h"
#include "qgemm_avx512.h"
#undef QV
#undef QV_R
#undef QV_VNNI
#undef QV_NO_KERNELS
#pragma GCC pop_options

// ---- Dispatch. ----

typedef void (*bd_quantfn)(const float *x, int64_t k, int64_t nb, int R, int64_t G, uint8_t *xg);
typedef void (*bd_rowsfn)(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, int R, float *out);

static bd_rowsfn rows_for(int type, int isa) {
#define BD_PICK(name)                                                                     \
    return isa == BD_ISA_AVX512 ? rows_##name##_vnni : rows_##name##_avx2;
    switch (type) {
    case 2: BD_PICK(q4_0)
    case 3: BD_PICK(q4_1)
    case 6: BD_PICK(q5_0)
    case 7: BD_PICK(q5_1)
    case 8: BD_PICK(q8_0)
    case 12: BD_PICK(q4_K)
    case 13: BD_PICK(q5_K)
    case 14: BD_PICK(q6_K)
    case 1: BD_PICK(f16)
    case 30: BD_PICK(bf16)
    }
    return NULL;
#undef BD_PICK
}

int bd_qgemm_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx2") &&
            __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return BD_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return BD_ISA_AVX2;
    return BD_ISA_BASE;
}

// The most rows of X one pass over a weight row carries (for x16 16, a
// vector of 16 outputs a row; for k16 8, which also keeps a block's int32
// sums in registers).
static int64_t rmax_of(const bd_qtype *t, int isa) { return t->k == 3 ? 16 : t->k >= 4 || isa != BD_ISA_AVX2 ? 8 : 4; }

// The group size for m rows: the variant's rmax, or m when smaller.
static int64_t group_of(const bd_qtype *t, int isa, int64_t m) {
    return m < rmax_of(t, isa) ? m : rmax_of(t, isa);
}

// The scratch for m rows with groups of G.
static int64_t work_for(const bd_qtype *t, int64_t k, int64_t m, int64_t G) {
    return (m + G - 1) / G * group_bytes(t, k, G);
}

int64_t bd_qgemm_work_bytes(int wtype, int64_t k, int64_t m) {
    const bd_qtype *t = qtype_of(wtype);
    if (!t) return BD_QGEMM_UNSUPPORTED;
    if (k <= 0 || m <= 0 || k > BD_QGEMM_MAX || m > BD_QGEMM_MAX || k % t->elems != 0)
        return BD_QGEMM_SIZE;
    // The most any variant takes: groups of min(m, 4) or min(m, 8) (x16:
    // min(m, 16); k16: min(m, 8)).
    int64_t most = 0;
    for (int64_t r = t->k == 3 ? 16 : t->k >= 4 ? 8 : 4; r <= (t->k == 3 ? 16 : 8); r += 4) {
        const int64_t G = m < r ? m : r, gb = group_bytes(t, k, G); // gb < 2.2·k·8
        if (gb > BD_QGEMM_MAX / ((m + G - 1) / G)) return BD_QGEMM_SIZE;
        const int64_t w = (m + G - 1) / G * gb;
        if (w > most) most = w;
    }
    return most;
}

// Rows of W one tile holds: about 512 KiB, so a tile stays in L2 while
// every group of X's rows passes over it.
#define BD_QGEMM_TILE_BYTES (512 << 10)

// One task of BD_X16(wt): rows [n0,n1) (multiples of 16) of W against
// groups [g0,g1) of X, as qgemm_task.
static void x16_task(int wt, int isa, const uint8_t *w, int64_t rowb, int64_t nb, const uint8_t *xq, int64_t gb,
        int64_t G, int64_t m, int64_t n0, int64_t n1, int64_t g0, int64_t g1, float *y, int64_t ldy,
        const float *bias) {
    int64_t tile = BD_QGEMM_TILE_BYTES / (16 * rowb);
    if (tile < 1) tile = 1;
    float out[16 * 16] __attribute__((aligned(64)));
    for (int64_t t0 = n0 / 16; t0 < n1 / 16; t0 += tile) {
        const int64_t t1 = t0 + tile < n1 / 16 ? t0 + tile : n1 / 16;
        for (int64_t g = g0; g < g1; g++) {
            const int R = (int)(m - g * G < G ? m - g * G : G);
            const uint8_t *xg = xq + g * gb;
            float *yg = y + g * G * ldy;
            for (int64_t tt = t0; tt < t1; tt++) {
                const uint8_t *wp = w + tt * 16 * rowb;
                if (wt == 12)
                    (isa == BD_ISA_AVX512 ? rows_k16_vnni : k16_base)(wp, nb, xg, G, R, out);
                else if (wt == 13)
                    (isa == BD_ISA_AVX512 ? rows_k5x16_vnni : k5x16_base)(wp, nb, xg, G, R, out);
                else if (wt == 14)
                    (isa == BD_ISA_AVX512 ? rows_q6x16_vnni : q6x16_base)(wp, nb, xg, G, R, out);
                else if (isa == BD_ISA_AVX512)
                    rows_x16_vnni(wt, wp, nb, xg, G, R, out);
                else
                    x16_base(wt, wp, nb, xg, G, R, out);
                for (int r = 0; r < R; r++)
                    for (int j = 0; j < 16; j++)
                        yg[r * ldy + 16 * tt + j] = out[r * 16 + j] + (bias ? bias[16 * tt + j] : 0.0f);
            }
        }
    }
}

// One task: rows [n0,n1) of W against groups [g0,g1) of X.
static void qgemm_task(const bd_qtype *t, int isa, bd_rowsfn rows, const uint8_t *w,
        int64_t rowb, int64_t nb, const uint8_t *xq, int64_t gb, int64_t G, int64_t m,
        int64_t n0, int64_t n1, int64_t g0, int64_t g1, float *y, int64_t ldy, const float *bias) {
    if (t->k >= 3) {
        x16_task(t->type - BD_X16(0), isa, w, rowb, nb, xq, gb, G, m, n0, n1, g0, g1, y, ldy, bias);
        return;
    }
    int64_t tile = BD_QGEMM_TILE_BYTES / rowb;
    if (tile < 8) tile = 8;
    float out[8];
    for (int64_t t0 = n0; t0 < n1; t0 += tile) {
        const int64_t t1 = t0 + tile < n1 ? t0 + tile : n1;
        for (int64_t g = g0; g < g1; g++) {
            const int R = (int)(m - g * G < G ? m - g * G : G);
            const uint8_t *xg = xq + g * gb;
            float *yg = y + g * G * ldy;
            for (int64_t n = t0; n < t1; n++) {
                const uint8_t *wr = w + n * rowb;
                if (isa == BD_ISA_BASE) {
                    for (int r = 0; r < R; r++)
                        out[r] = t->k == 2 ? dotf_base(t->type, wr, nb, (const float *)xg + r * nb)
                                : t->k   ? dotk_base(t->type, wr, nb, xg, G, r)
                                         : dot32_base(t->type, wr, nb, xg, G, r);
                } else {
                    rows(wr, nb, xg, G, R, out);
                }
                if (bias)
                    for (int r = 0; r < R; r++) yg[r * ldy + n] = out[r] + bias[n];
                else
                    for (int r = 0; r < R; r++) yg[r * ldy + n] = out[r];
            }
        }
    }
}

// Work (multiply-adds) below which one thread runs the call. A decode
// step's product streams its weights from memory, and one thread decodes
// Q8_0 at about 11 GB/s: Qwen2.5-0.5B's k and v projections (128x896,
// 115k multiply-adds) took 10-14 us on one thread against 7-9 on two on
// a 2-core host, and 14 us on one thread of a 16-core host (as long as
// the 800 KB q projection on all 16), so they now run on the team.
#define BD_QGEMM_PAR_MIN ((int64_t)1 << 16)

int bd_qgemm(int wtype, const void *w, int64_t w_bytes, int64_t n_out,
        int64_t k, const float *x, int64_t m, float *y, int64_t ldy,
        int isa, int nthreads, void *work, int64_t work_bytes) {
    const bd_qgemm_part part = {.w = w, .w_bytes = w_bytes, .n_out = n_out, .y = y, .ldy = ldy};
    return bd_qgemm_multi(wtype, &part, 1, k, x, m, isa, nthreads, work, work_bytes);
}

int bd_qgemm_multi(int wtype, const bd_qgemm_part *parts, int count, int64_t k, const float *x, int64_t m,
        int isa, int nthreads, void *work, int64_t work_bytes) {
    const bd_qtype *t = qtype_of(wtype);
    if (!t) return BD_QGEMM_UNSUPPORTED;
    const int64_t most = bd_qgemm_work_bytes(wtype, k, m);
    if (most < 0) return (int)most;
    if (count < 1 || count > BD_QGEMM_PARTS || nthreads < 1) return BD_QGEMM_SIZE;
    const int64_t unit = t->k >= 3 ? 16 : 1; // rows a task's bounds are multiples of
    const int64_t nb = k / t->elems, rowb = nb * t->bytes;
    int64_t n_all = 0; // the parts' rows together
    for (int p = 0; p < count; p++) {
        const int64_t n_out = parts[p].n_out, ldy = parts[p].ldy;
        if (n_out <= 0 || n_out > BD_QGEMM_MAX || ldy < n_out || ldy > BD_QGEMM_MAX || n_out % unit) return BD_QGEMM_SIZE;
        if (rowb > BD_QGEMM_MAX / n_out || parts[p].w_bytes != rowb * n_out) return BD_QGEMM_SIZE;
        if (m - 1 > (BD_QGEMM_MAX - n_out) / ldy) return BD_QGEMM_SIZE; // (m-1)*ldy + n_out
        n_all += n_out;
        if (n_all > BD_QGEMM_MAX) return BD_QGEMM_SIZE;
    }
    if (k > BD_QGEMM_MAX / m) return BD_QGEMM_SIZE; // m*k
    const int have = bd_qgemm_isa();
    if (isa == BD_ISA_AUTO) isa = have;
    if (isa < BD_ISA_BASE || isa > have) return BD_QGEMM_NO_ISA;
    const int64_t G = group_of(t, isa, m), gb = group_bytes(t, k, G), need = work_for(t, k, m, G);
    if (work && work_bytes < need) return BD_QGEMM_SIZE;

    // The float types read X where it is: a group is G rows of k f32.
    const int64_t gbx = t->k == 2 ? G * k * 4 : gb;
    uint8_t *xq = t->k == 2 ? (uint8_t *)x : work;
    if (!xq) {
        xq = aligned_alloc(64, (size_t)((need + 63) & ~(int64_t)63));
        if (!xq) return BD_QGEMM_NOMEM;
    }
    bd_quantfn quant = NULL;
    switch (isa) {
    case BD_ISA_AVX512: quant = t->k ? quant_ak_vnni : quant_a32_vnni; break;
    case BD_ISA_AVX2: quant = t->k ? quant_ak_avx2 : quant_a32_avx2; break;
    default: quant = t->k ? quant_ak_base : quant_a32_base; break;
    }
    if (t->k == 3) quant = isa == BD_ISA_BASE ? quant_x16_base : isa == BD_ISA_AVX2 ? quant_x16_avx2 : quant_x16_vnni;
    if (t->k == 4) quant = isa == BD_ISA_BASE ? quant_k16_base : isa == BD_ISA_AVX2 ? quant_k16_avx2 : quant_k16_vnni;
    if (t->k == 5) quant = isa == BD_ISA_BASE ? quant_k6_base : isa == BD_ISA_AVX2 ? quant_k6_avx2 : quant_k6_vnni;
    if (t->k == 2) quant = NULL;
    const bd_rowsfn rows = isa == BD_ISA_BASE ? NULL : rows_for(wtype, isa);

    // Tasks: rows of W split between threads; groups of X's rows too when
    // W has too few rows (fewer than 16 a thread) to keep every thread busy.
    const int64_t groups = (m + G - 1) / G;
    const double macs = (double)m * (double)n_all * (double)k;
    int nt = macs < (double)BD_QGEMM_PAR_MIN ? 1 : nthreads;
    int64_t tn = n_all / 16 < nt ? n_all / 16 : nt;
    if (tn < 1) tn = 1;
    // One row of X (decode) streams W from memory: four tasks a thread of
    // 64 rows or more, taken as threads come free, so a thread slowed by
    // another process does not hold the others at the barrier (a one-stream
    // Qwen2.5-0.5B Q8_0 step on a shared 2-core host: faster in 7 of 7
    // alternating runs, by 1-10%). A task's rows are whole, so the output
    // is the same.
    if (groups == 1 && nt > 1 && n_all / 64 >= 4 * nt) tn = 4 * nt;
    int64_t tm = (nt + tn - 1) / tn;
    if (tm > groups) tm = groups;
    const int64_t tasks = tn * tm;
    // One task runs on the calling thread; otherwise the team is the whole
    // pool, threads past the tasks idle (qamx.c, bd_qamx: a smaller team
    // would make libgomp end threads and create them again).
    if (tasks == 1) nt = 1;

#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        // Quantize X, a group at a time (a row of 4864 takes about a
        // microsecond); the for's barrier has every group ready.
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; g++) {
            const int R = (int)(m - g * G < G ? m - g * G : G);
            if (quant) quant(x + g * G * k, k, nb, R, G, xq + g * gb);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            const int64_t in = task % tn, im = task / tn;
            // The task's rows of the parts laid end to end.
            const int64_t v0 = n_all / unit * in / tn * unit, v1 = n_all / unit * (in + 1) / tn * unit;
            int64_t base = 0;
            for (int p = 0; p < count && base < v1; base += parts[p].n_out, p++) {
                const int64_t a = v0 > base ? v0 - base : 0;
                const int64_t b = v1 - base < parts[p].n_out ? v1 - base : parts[p].n_out;
                if (a < b)
                    qgemm_task(t, isa, rows, parts[p].w, rowb, nb, xq, gbx, G, m, a, b,
                            groups * im / tm, groups * (im + 1) / tm, parts[p].y, parts[p].ldy, parts[p].bias);
            }
        }
    }
    if (!work && t->k != 2) free(xq);
    return BD_QGEMM_OK;
}

// Whether ggml type t has a BD_X16 form.
static int x16_type(int t) { return t > 0 && t < BD_X16_BASE && qtype_of(BD_X16(t)) != NULL; }

int bd_x16_relayout(int t, void *w, int64_t n, int64_t k, int to_x16, int nthreads) {
    if (!x16_type(t)) return BD_QGEMM_UNSUPPORTED;
    if (n <= 0 || k <= 0 || n % 16 || k % qtype_of(t)->elems || n > BD_QGEMM_MAX || k > BD_QGEMM_MAX || nthreads < 1)
        return BD_QGEMM_SIZE;
    const int64_t nb = k / qtype_of(t)->elems, bytes = qtype_of(t)->bytes, rowb = nb * bytes;
    if (rowb > BD_QGEMM_MAX / n) return BD_QGEMM_SIZE;
    const int64_t tb = 16 * rowb, tiles = n / 16;
    int failed = 0;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && tiles > 1)
    {
        uint8_t *tmp = malloc((size_t)tb);
        if (!tmp) {
#pragma omp atomic
            failed++;
        }
#pragma omp barrier
        if (!failed) { // every thread reads the same count after the barrier
#pragma omp for schedule(static)
            for (int64_t tt = 0; tt < tiles; tt++) {
                uint8_t *p = (uint8_t *)w + tt * tb;
                memcpy(tmp, p, (size_t)tb);
                if (to_x16) memset(p, 0, (size_t)tb); // x16_put ORs the fifth bits in
                for (int64_t b = 0; b < nb; b++)
                    for (int j = 0; j < 16; j++) {
                        if (to_x16)
                            x16_put(t, p + b * 16 * bytes, j, tmp + j * rowb + b * bytes);
                        else
                            x16_get(t, tmp + b * 16 * bytes, j, p + j * rowb + b * bytes);
                    }
            }
        }
        free(tmp);
    }
    return failed ? BD_QGEMM_NOMEM : BD_QGEMM_OK;
}

int bd_x16_row(int t, const void *w, int64_t n, int64_t k, int64_t id, float *out) {
    if (!x16_type(t)) return BD_QGEMM_UNSUPPORTED;
    const bd_qtype *q = qtype_of(t);
    if (n <= 0 || k <= 0 || n % 16 || k % q->elems || n > BD_QGEMM_MAX || k > BD_QGEMM_MAX || id < 0 || id >= n)
        return BD_QGEMM_SIZE;
    const int64_t nb = k / q->elems, rowb = nb * q->bytes;
    if (rowb > BD_QGEMM_MAX / n) return BD_QGEMM_SIZE;
    const uint8_t *tile = (const uint8_t *)w + id / 16 * 16 * rowb;
    uint8_t rb[210]; // a block of t in ggml's layout
    for (int64_t b = 0; b < nb; b++) {
        x16_get(t, tile + b * 16 * q->bytes, (int)(id % 16), rb);
        if (bd_dequant_row(t, rb, q->bytes, out + b * q->elems, q->elems, BD_ISA_AUTO) != BD_DEQUANT_OK) return BD_QGEMM_SIZE;
    }
    return BD_QGEMM_OK;
}

// bd_qgemm_read_sum reads bytes (a multiple of 128) at p with nthreads
// OpenMP threads in 256-bit loads, as the kernels stream weights, and
// returns a sum of it: the benchmarks' reference for the host's read
// bandwidth (a scalar loop understates it).
__attribute__((target("avx2"))) uint64_t bd_qgemm_read_sum(const void *p, int64_t bytes, int nthreads) {
    const uint8_t *b = p;
    uint64_t total = 0;
#pragma omp parallel num_threads(nthreads) reduction(+ : total)
    {
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < bytes / 128; i++) {
            const __m256i *v = (const __m256i *)(b + 128 * i);
            a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(v));
            a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(v + 1));
            a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(v + 2));
            a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(v + 3));
        }
        const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
        total += (uint64_t)_mm256_extract_epi64(s, 0) + (uint64_t)_mm256_extract_epi64(s, 1) +
                (uint64_t)_mm256_extract_epi64(s, 2) + (uint64_t)_mm256_extract_epi64(s, 3);
    }
    return total;
}
