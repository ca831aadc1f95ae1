// Quantized products on AMX tiles; see qamx.h.
//
// Tiles (palette 1, each 16 rows of 64 bytes):
//   tmm0-3  C: f32 [16 weight rows][16 activation rows], one per 16 rows of
//           an m-block of up to 64 activation rows
//   tmm4    A: bf16 [16 weight rows][32 k], a strip of the panel
//           (tmm4-5 with one m tile)
//   tmm5-7  B: bf16 pairs [16 k pairs][16 activation rows][2], from xb
// So C = W·Xᵀ for 16 weight rows at a time: the weights are the A operand,
// read from the panel row-major as dequantized, and the activations, whose
// pair-interleaved layout the tile unit wants, are laid out once per call.
//
// Scratch (64-byte aligned): xb, the activations as bf16 tiles
// [m tiles][k/32][16 pairs][16 rows][2], zeros past m; then per thread
// up to 8 panels bf16 [16][k] (qa_group), an f32 row [k] for the types
// decoded through dequant.c, and the C tiles f32 [16][16] of four m tiles
// for each panel of a group.

#include "qamx.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dequant.h"
#include "qgemm.h"
#include "qx16.h"
#include "vec_avx512.h"

#define QA_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma,amx-tile,amx-bf16")))
#define QA_TARGET_I8 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma,amx-tile,amx-bf16,amx-int8")))
#define QA_INLINE static inline __attribute__((always_inline))

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

// -1 unknown, 0 no, 1 yes; qa_int8_ok (AMX-INT8 as well) is set before qa_state.
static int qa_state = -1;
static int qa_int8_ok = 0;

static void qa_cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}

int bd_qamx_available(void) {
    int s = __atomic_load_n(&qa_state, __ATOMIC_ACQUIRE);
    if (s >= 0) return s;
    int ok = 0, int8 = 0;
    unsigned r[4];
    qa_cpuid(0, 0, r);
    if (r[0] >= 7) {
        qa_cpuid(7, 0, r);
        const unsigned edx = r[3], ebx = r[1];
        const int tile = edx >> 24 & 1, bf16 = edx >> 22 & 1;
        const int f = ebx >> 16 & 1, dq = ebx >> 17 & 1, bw = ebx >> 30 & 1, vl = ebx >> 31 & 1;
        qa_cpuid(7, 1, r);
        const int avx512bf16 = r[0] >> 5 & 1;
        __builtin_cpu_init();
        ok = tile && bf16 && f && dq && bw && vl && avx512bf16 && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
        int8 = edx >> 25 & 1; // AMX-INT8
    }
    // The kernel hands out tile data per process on request (oneDNN asks
    // the same way; asking twice is harmless).
    if (ok && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) ok = 0;
    __atomic_store_n(&qa_int8_ok, ok && int8, __ATOMIC_RELAXED);
    __atomic_store_n(&qa_state, ok, __ATOMIC_RELEASE);
    return ok;
}

// The ggml type of a BD_X16 type (qgemm.h) qamx reads, else 0.
static int qa_x16(int t) {
    switch (t) {
    case BD_X16(2): case BD_X16(3): case BD_X16(6): case BD_X16(7): case BD_X16(8): case BD_X16(12): case BD_X16(13):
        return t - BD_X16_BASE;
    }
    return 0;
}

// ggml's types (and qa_x16's): elements and bytes per block.
static int qa_block(int t, int *elems, int *bytes) {
    switch (t) {
    case 1: *elems = 1, *bytes = 2; return 1;     // F16
    case 30: *elems = 1, *bytes = 2; return 1;    // BF16
    case 2: *elems = 32, *bytes = 18; return 1;   // Q4_0
    case 3: *elems = 32, *bytes = 20; return 1;   // Q4_1
    case 6: *elems = 32, *bytes = 22; return 1;   // Q5_0
    case 7: *elems = 32, *bytes = 24; return 1;   // Q5_1
    case 8: *elems = 32, *bytes = 34; return 1;   // Q8_0
    case 12: *elems = 256, *bytes = 144; return 1; // Q4_K
    case 13: *elems = 256, *bytes = 176; return 1; // Q5_K
    case 14: *elems = 256, *bytes = 210; return 1; // Q6_K
    }
    return qa_x16(t) && qa_block(t - BD_X16_BASE, elems, bytes); // relaid by 16 rows: the same blocks' bytes
}

int bd_qamx_supports(int wtype) {
    int e, b;
    return qa_block(wtype, &e, &b);
}

#define QA_MB 64 // activation rows one pass over a panel carries (4 C tiles)
// X (bf16) larger than this does not stay in a 2 MiB L2 beside a group of
// decoded panels; bd_qamx then gives threads slices of about QA_X_SLICE.
#define QA_X_L2 (1280 << 10)
#define QA_X_SLICE (640 << 10)

static int64_t qa_xb_bytes(int64_t k, int64_t m) { return (m + 15) / 16 * 16 * k * 2; }
// Per thread: the bf16 path's panels (qa_group), an f32 row and four C tiles of
// f32 (68k bytes + 4 KiB); AMX-INT8's (Q8_0) eight C tiles and a copy of a
// partial panel, 17k bytes.
static int64_t qa_group(int64_t k);
static int64_t qa_thread_bytes(int64_t k) {
    const int64_t bf16 = qa_group(k) * 16 * k * 2 + k * 4 + 8 * 4096, i8 = 8192 + 16 * (k / 32 * 34);
    return bf16 > i8 ? bf16 : i8;
}

int64_t bd_qamx_work_bytes(int wtype, int64_t k, int64_t m, int nthreads) {
    int elems, bytes;
    if (!qa_block(wtype, &elems, &bytes)) return BD_QGEMM_UNSUPPORTED;
    if (k <= 0 || m <= 0 || nthreads < 1 || nthreads > 1024 || k > BD_QGEMM_MAX / 64 || m > BD_QGEMM_MAX / 64 ||
            k % elems != 0 || k % 32 != 0)
        return BD_QGEMM_SIZE;
    if (k > BD_QGEMM_MAX / 2 / ((m + 15) / 16 * 16)) return BD_QGEMM_SIZE; // xb's bytes, and m*k
    const int64_t xb = (qa_xb_bytes(k, m) + 63) & ~(int64_t)63, th = (qa_thread_bytes(k) + 63) & ~(int64_t)63;
    if (th > BD_QGEMM_MAX / nthreads) return BD_QGEMM_SIZE;
    return xb + th * nthreads;
}

// ---- Panel decoders: one weight row of k elements to bf16. ----

QA_INLINE QA_TARGET float qa_h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// 32 f32 (lo: elements 0-15, hi: 16-31) to 32 bf16 at out.
QA_INLINE QA_TARGET void qa_store32(uint16_t *out, __m512 lo, __m512 hi) {
    _mm512_storeu_si512((void *)out, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

// 16 unsigned bytes to f32.
QA_INLINE QA_TARGET __m512 qa_u8(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)); }
// 16 signed bytes to f32.
QA_INLINE QA_TARGET __m512 qa_i8(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }

// The 6-bit scales and mins of a Q4_K/Q5_K block (qgemm.c's bd_k4_scales).
QA_INLINE void qa_k4_scales(const uint8_t *s12, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[4];
    memcpy(u, s12, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    const uint32_t mins = u[1] & 0x3f3f3f3fu;
    u[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    u[2] = mins;
    u[0] &= 0x3f3f3f3fu;
    memcpy(sc, u, 8);
    memcpy(mn, u + 2, 8);
}

// Q4_K and Q5_K by table: sub-block 2i is the low nibbles of
// qs[32i..32i+31] and 2i+1 the high ones (Q5_K adds bit 2i, 2i+1 of qh[l]
// as 16). A sub-block's weights take only 16 (32) values, d·sc·v − dmin·m,
// so each pair of sub-blocks gets its values as one table of bf16 and
// vpermw (vpermt2w for Q5_K's 64) looks the 64 weights up: fewer
// conversions than decoding each weight through f32.
// A K block's d·sc and −dmin·m for its eight sub-blocks, in memory, so the
// tables below broadcast them from a load (port 5, which the lookups and
// conversions use, stays free of broadcasts from registers).
QA_INLINE QA_TARGET void qa_k4_factors(const uint8_t *w, float ds[8], float dm[8]) {
    uint8_t sc[8], mn[8];
    qa_k4_scales(w + 4, sc, mn);
    const __m256 d = _mm256_set1_ps(qa_h2f(w)), dmin = _mm256_set1_ps(-qa_h2f(w + 2));
    _mm256_store_ps(ds, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc)))));
    _mm256_store_ps(dm, _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mn)))));
}

QA_INLINE QA_TARGET void qa_row_q4_K(const uint8_t *w, int64_t nb, uint16_t *out) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i m4 = _mm512_set1_epi16(0x0f), hi16 = _mm512_set1_epi16(0x10);
    float ds[8] __attribute__((aligned(32))), dm[8] __attribute__((aligned(32)));
    for (int64_t b = 0; b < nb; b++, w += 144, out += 256) {
        qa_k4_factors(w, ds, dm);
        for (int i = 0; i < 4; i++) {
            const __m512 ta = _mm512_fmadd_ps(iota, _mm512_set1_ps(ds[2 * i]), _mm512_set1_ps(dm[2 * i]));
            const __m512 tb = _mm512_fmadd_ps(iota, _mm512_set1_ps(ds[2 * i + 1]), _mm512_set1_ps(dm[2 * i + 1]));
            const __m512i tab = (__m512i)_mm512_cvtne2ps_pbh(tb, ta); // words 0-15: sub-block 2i, 16-31: 2i+1
            const __m512i q = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(w + 16 + 32 * i)));
            const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_or_si512(_mm512_srli_epi16(q, 4), hi16);
            _mm512_storeu_si512((void *)(out + 64 * i), _mm512_permutexvar_epi16(lo, tab));
            _mm512_storeu_si512((void *)(out + 64 * i + 32), _mm512_permutexvar_epi16(hi, tab));
        }
    }
}

QA_INLINE QA_TARGET void qa_row_q5_K(const uint8_t *w, int64_t nb, uint16_t *out) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 iota16 = _mm512_add_ps(iota, _mm512_set1_ps(16));
    const __m512i m4 = _mm512_set1_epi16(0x0f), b16 = _mm512_set1_epi16(0x10), b32 = _mm512_set1_epi16(0x20);
    float ds[8] __attribute__((aligned(32))), dm[8] __attribute__((aligned(32)));
    for (int64_t b = 0; b < nb; b++, w += 176, out += 256) {
        qa_k4_factors(w, ds, dm);
        // qh as words, shifted so bit 2i (2i+1) of each byte lands on bit 4
        // as i steps (bit 4 is 16 in the table index).
        __m512i qh = _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(w + 16))), 4);
        for (int i = 0; i < 4; i++, qh = _mm512_srli_epi16(qh, 2)) {
            const __m512 da = _mm512_set1_ps(ds[2 * i]), ma = _mm512_set1_ps(dm[2 * i]);
            const __m512 db = _mm512_set1_ps(ds[2 * i + 1]), mb = _mm512_set1_ps(dm[2 * i + 1]);
            const __m512i ta = (__m512i)_mm512_cvtne2ps_pbh(_mm512_fmadd_ps(iota16, da, ma), _mm512_fmadd_ps(iota, da, ma));
            const __m512i tb = (__m512i)_mm512_cvtne2ps_pbh(_mm512_fmadd_ps(iota16, db, mb), _mm512_fmadd_ps(iota, db, mb));
            const __m512i q = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(w + 48 + 32 * i)));
            // index: the nibble, its fifth bit as 16, and 32 for the high sub-block (tb)
            const __m512i lo = _mm512_or_si512(_mm512_and_si512(q, m4), _mm512_and_si512(qh, b16));
            const __m512i hi = _mm512_or_si512(_mm512_or_si512(_mm512_srli_epi16(q, 4), _mm512_and_si512(_mm512_srli_epi16(qh, 1), b16)), b32);
            _mm512_storeu_si512((void *)(out + 64 * i), _mm512_permutex2var_epi16(ta, lo, tb));
            _mm512_storeu_si512((void *)(out + 64 * i + 32), _mm512_permutex2var_epi16(ta, hi, tb));
        }
    }
}

// Q6_K: per half of 128, q1..q4 from ql[l], ql[l+32] and qh[l]'s bit pairs;
// each 16 elements have their own int8 scale.
QA_INLINE QA_TARGET void qa_row_q6_K(const uint8_t *w, int64_t nb, uint16_t *out) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(0x03), c32 = _mm256_set1_epi8(32);
    for (int64_t b = 0; b < nb; b++, w += 210, out += 256) {
        const float d = qa_h2f(w + 208);
        const int8_t *sc = (const int8_t *)(w + 192);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w + 64 * h, *qhp = w + 128 + 32 * h;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)qhp);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
            for (int t = 0; t < 4; t++) {
                const __m256i v = _mm256_sub_epi8(q[t], c32);
                const __m512 a = _mm512_set1_ps(d * sc[8 * h + 2 * t]), c = _mm512_set1_ps(d * sc[8 * h + 2 * t + 1]);
                qa_store32(out + 128 * h + 32 * t, _mm512_mul_ps(qa_i8(_mm256_castsi256_si128(v)), a),
                        _mm512_mul_ps(qa_i8(_mm256_extracti128_si256(v, 1)), c));
            }
        }
    }
}

// Q8_0: d (f16) and 32 int8.
QA_INLINE QA_TARGET void qa_row_q8_0(const uint8_t *w, int64_t nb, uint16_t *out) {
    for (int64_t b = 0; b < nb; b++, w += 34, out += 32) {
        const __m512 d = _mm512_set1_ps(qa_h2f(w));
        const __m256i q = _mm256_loadu_si256((const __m256i *)(w + 2));
        qa_store32(out, _mm512_mul_ps(qa_i8(_mm256_castsi256_si128(q)), d),
                _mm512_mul_ps(qa_i8(_mm256_extracti128_si256(q, 1)), d));
    }
}

// Q4_0 (d, 16 bytes: element l low nibble, l+16 high; value q-8) and Q5_0
// (d, qh u32, 16 bytes: bit l of qh is element l's fifth bit; value q-16).
QA_INLINE QA_TARGET void qa_row_q450(const uint8_t *w, int64_t nb, uint16_t *out, const int Q5) {
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m128i off = _mm_set1_epi8(Q5 ? 16 : 8), s16 = _mm_set1_epi8(0x10);
    for (int64_t b = 0; b < nb; b++, w += Q5 ? 22 : 18, out += 32) {
        const __m512 d = _mm512_set1_ps(qa_h2f(w));
        const __m128i q = _mm_loadu_si128((const __m128i *)(w + (Q5 ? 6 : 2)));
        __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
        if (Q5) {
            uint32_t qh;
            memcpy(&qh, w + 2, 4);
            lo = _mm_mask_add_epi8(lo, (__mmask16)(qh & 0xffff), lo, s16);
            hi = _mm_mask_add_epi8(hi, (__mmask16)(qh >> 16), hi, s16);
        }
        qa_store32(out, _mm512_mul_ps(qa_i8(_mm_sub_epi8(lo, off)), d), _mm512_mul_ps(qa_i8(_mm_sub_epi8(hi, off)), d));
    }
}

// The other types through dequant.c's row decoder (f32 into tmp), then
// rounded to bf16.
QA_INLINE QA_TARGET void qa_row_generic(int t, const uint8_t *w, int64_t rowb, int64_t k, float *tmp, uint16_t *out) {
    bd_dequant_row(t, w, rowb, tmp, k, BD_ISA_AUTO);
    for (int64_t e = 0; e < k; e += 32) qa_store32(out + e, _mm512_loadu_ps(tmp + e), _mm512_loadu_ps(tmp + e + 16));
}

static QA_TARGET void qa_row(int t, const uint8_t *w, int64_t rowb, int64_t k, float *tmp, uint16_t *out) {
    switch (t) {
    case 12: qa_row_q4_K(w, k / 256, out); break;
    case 13: qa_row_q5_K(w, k / 256, out); break;
    case 14: qa_row_q6_K(w, k / 256, out); break;
    case 8: qa_row_q8_0(w, k / 32, out); break;
    case 2: qa_row_q450(w, k / 32, out, 0); break;
    case 6: qa_row_q450(w, k / 32, out, 1); break;
    default: qa_row_generic(t, w, rowb, k, tmp, out); break;
    }
}

// ---- The activations as B tiles. ----

// A 16x16 transpose of 32-bit elements: r[i] lane j becomes r[j] lane i.
// Two rounds of unpacks leave 4x4 blocks transposed in each 128-bit lane
// (r[4g+j] lane L holds rows 4g..4g+3 of column 4L+j); two rounds of
// 128-bit shuffles gather column p = 4L+j from r[j], r[4+j], r[8+j], r[12+j].
QA_INLINE QA_TARGET void qa_transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        const __m512i u = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44), v = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44);
        const __m512i u2 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xee), v2 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xee);
        t[j] = _mm512_shuffle_i32x4(u, v, 0x88);
        t[4 + j] = _mm512_shuffle_i32x4(u, v, 0xdd);
        t[8 + j] = _mm512_shuffle_i32x4(u2, v2, 0x88);
        t[12 + j] = _mm512_shuffle_i32x4(u2, v2, 0xdd);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

// xb[mt][kc][p][r][2] = x[16mt + r][32kc + 2p + e], zeros for rows >= m:
// each strip's 16 rows go to bf16 (a row's 16 pairs are one vector) and
// are transposed in registers, so the tile's 1 KiB is written whole (16
// scatters a strip took about 5% of a 512-token Q8_0 prefill).
static QA_TARGET void qa_layout_x(const float *x, int64_t m, int64_t k, uint16_t *xb, int64_t mt0, int64_t mt1) {
    const int64_t nkc = k / 32;
    for (int64_t mt = mt0; mt < mt1; mt++) {
        const int rows = (int)(m - 16 * mt < 16 ? m - 16 * mt : 16);
        const float *src = x + 16 * mt * k;
        uint16_t *dst = xb + mt * nkc * 512;
        for (int64_t kc = 0; kc < nkc; kc++) {
            __m512i v[16];
            for (int r = 0; r < 16; r++)
                v[r] = r < rows ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + r * k + 32 * kc + 16),
                                          _mm512_loadu_ps(src + r * k + 32 * kc))
                                : _mm512_setzero_si512();
            qa_transpose16(v);
            for (int p = 0; p < 16; p++) _mm512_storeu_si512((void *)(dst + kc * 512 + 32 * p), v[p]);
        }
    }
}

// ---- Panels of weights relaid by 16 rows (BD_X16, qx16.h). ----
//
// A relaid matrix's panel is one tile. It decodes a unit at a time, 64
// elements of each of its rows: two 32-element blocks, or a pair of a Q4_K
// or Q5_K block's sub-blocks (Q6_K's relaid tiles are not read here). The
// unit's 16 vectors of quants (each holding four elements of every row:
// qx16.h's x16_unpack for the 32-element types) are transposed in registers into one vector a row, whose 64 values are
// then scaled as qa_row scales the same weights in GGUF's layout: the
// panel is the same bf16, bit for bit (TestQamxPanelX16).

// Quarter i (16 bytes) of a row's 64 quants as f32, signed (the
// offset already taken off) or unsigned (Q4_K's).
#define QA_I8Q(v, i) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32((v), (i))))
#define QA_U8Q(v, i) _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32((v), (i))))

// 32 of a row's values from quarters (i, i+1) of v: q·d, or for Q4_1 and
// Q5_1 q·d + m as dequant.c computes them (q·d is exact in f32, q being
// at most 8 bits and d an f16, so an FMA gives the same).
#define QA_X16_HALF(out, v, i, d, m, mins)                                                          \
    do {                                                                                            \
        __m512 a_ = _mm512_mul_ps(QA_I8Q(v, i), d), b_ = _mm512_mul_ps(QA_I8Q(v, (i) + 1), d);       \
        if (mins) a_ = _mm512_add_ps(a_, m), b_ = _mm512_add_ps(b_, m);                             \
        qa_store32(out, a_, b_);                                                                    \
    } while (0)

// Units [u0, u1) of the 32-element type T's tile at w (k elements a row)
// into panel (bf16 [16][k]). A last unit of one block (k an odd number of
// blocks) transposes zeros in place of the second.
static QA_TARGET void qa_tile_x16(int T, const uint8_t *w, int64_t k, int64_t u0, int64_t u1, uint16_t *panel) {
    const int64_t nb = k / 32, bb = X16_BLOCK(T);
    const int mins = T == 3 || T == 7;
    const __m512i off = _mm512_set1_epi8((char)X16_OFF(T)); // Q8_0's 128: the XOR back to int8
    float d[2][16] __attribute__((aligned(64))), mn[2][16] __attribute__((aligned(64)));
    for (int64_t u = u0; u < u1; u++) {
        const int64_t b0 = 2 * u;
        const int two = b0 + 1 < nb;
        __m512i r[16];
        for (int h = 0; h < 2; h++) {
            if (h && !two) {
                for (int c = 8; c < 16; c++) r[c] = _mm512_setzero_si512();
                break;
            }
            const uint8_t *wb = w + (b0 + h) * bb;
            x16_unpack(wb, T, r + 8 * h);
            for (int c = 8 * h; c < 8 * h + 8; c++) r[c] = _mm512_sub_epi8(r[c], off); // the int8 q - off
            _mm512_store_ps(d[h], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb)));
            if (mins) _mm512_store_ps(mn[h], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wb + X16_MIN))));
        }
        qa_transpose16(r); // r[j]: row j's 32 elements of block b0, then b0+1's
        for (int j = 0; j < 16; j++) {
            uint16_t *out = panel + j * k + 32 * b0;
            QA_X16_HALF(out, r[j], 0, _mm512_set1_ps(d[0][j]), _mm512_set1_ps(mn[0][j]), mins);
            if (two) QA_X16_HALF(out + 32, r[j], 2, _mm512_set1_ps(d[1][j]), _mm512_set1_ps(mn[1][j]), mins);
        }
    }
}

// qa_tile_x16 for BD_X16(12) and (13), Q4_K and Q5_K (T): unit u is block
// u/4's sub-blocks 2p and 2p+1 (p = u%4), elements 64p..64p+63, valued
// d·sc·q − dmin·m as qa_row_q4_K's and qa_row_q5_K's tables value them
// (one FMA from the same d·sc and −dmin·m).
static QA_TARGET void qa_tile_k16(int T, const uint8_t *w, int64_t k, int64_t u0, int64_t u1, uint16_t *panel) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m6 = _mm512_set1_epi32(0x3f3f3f3f), m0f = _mm512_set1_epi32(0x0f0f0f0f),
                  m03 = _mm512_set1_epi32(0x03030303), mff = _mm512_set1_epi32(0xff);
    float ds[8][16] __attribute__((aligned(64))), dm[8][16] __attribute__((aligned(64)));
    int64_t have = -1; // the block whose factors ds and dm hold
    for (int64_t u = u0; u < u1; u++) {
        const int64_t b = u / 4, p = u % 4;
        const uint8_t *wb = w + b * X16_BLOCK(T);
        if (b != have) {
            // The 16 rows' 6-bit scales and mins, lane by lane, as kz_k16
            // unpacks them (qgemm.c's bd_k4_scales).
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
            const __m512 ndmin = _mm512_xor_ps(_mm512_set1_ps(-0.0f), // −dmin, as qa_row_q4_K negates it (a zero's sign too)
                    _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wb + X16_MIN))));
            const __m512i v0 = _mm512_loadu_si512((const void *)(wb + K16_SC)),
                          v1 = _mm512_loadu_si512((const void *)(wb + K16_SC + 64)),
                          v2 = _mm512_loadu_si512((const void *)(wb + K16_SC + 128));
            const __m512i sc[2] = {_mm512_and_si512(v0, m6),
                    _mm512_or_si512(_mm512_and_si512(v2, m0f), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(v0, 6), m03), 4))};
            const __m512i mn[2] = {_mm512_and_si512(v1, m6),
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(v2, 4), m0f),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(v1, 6), m03), 4))};
            for (int s = 0; s < 8; s++) {
                const __m512 scs = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(sc[s / 4], 8 * (s & 3)), mff));
                const __m512 mns = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(mn[s / 4], 8 * (s & 3)), mff));
                _mm512_store_ps(ds[s], _mm512_mul_ps(d, scs));
                _mm512_store_ps(dm[s], _mm512_mul_ps(ndmin, mns));
            }
            have = b;
        }
        const uint8_t *qp = wb + K16_QSOF(T) + 512 * p;
        __m512i r[16];
        for (int c = 0; c < 8; c++) {
            const __m512i v = _mm512_loadu_si512((const void *)(qp + 64 * c));
            r[c] = _mm512_and_si512(v, m4);
            r[c + 8] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            if (T == 13) { // Q5_K's fifth bits: sub-block 2p's, then 2p+1's
                uint64_t lo, hi;
                memcpy(&lo, wb + K5_QH + 64 * (2 * p) + 8 * c, 8);
                memcpy(&hi, wb + K5_QH + 64 * (2 * p + 1) + 8 * c, 8);
                r[c] = _mm512_mask_add_epi8(r[c], (__mmask64)lo, r[c], _mm512_set1_epi8(0x10));
                r[c + 8] = _mm512_mask_add_epi8(r[c + 8], (__mmask64)hi, r[c + 8], _mm512_set1_epi8(0x10));
            }
        }
        qa_transpose16(r); // r[j]: row j's sub-block 2p, then 2p+1
        const float *sa = ds[2 * p], *sb = ds[2 * p + 1], *ma = dm[2 * p], *mb = dm[2 * p + 1];
        for (int j = 0; j < 16; j++) {
            uint16_t *out = panel + j * k + 256 * b + 64 * p;
            const __m512 da = _mm512_set1_ps(sa[j]), db = _mm512_set1_ps(sb[j]);
            const __m512 ea = _mm512_set1_ps(ma[j]), eb = _mm512_set1_ps(mb[j]);
            qa_store32(out, _mm512_fmadd_ps(QA_U8Q(r[j], 0), da, ea), _mm512_fmadd_ps(QA_U8Q(r[j], 1), da, ea));
            qa_store32(out + 32, _mm512_fmadd_ps(QA_U8Q(r[j], 2), db, eb), _mm512_fmadd_ps(QA_U8Q(r[j], 3), db, eb));
        }
    }
}

// ---- The product. ----

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) qa_tilecfg;

// TDPBF16PS takes about 16 cycles a tile but its result comes some 50
// later, so a pass keeps four products in flight: with one m tile the
// four C tiles take every fourth strip of k, with two each m tile has two
// C tiles (even and odd strips), and with three or four one each.
#define QA_DP(c, t, xk)                                   \
    do {                                                  \
        _tile_loadd(5, (xk) + (t) * xstride, 64);         \
        _tile_dpbf16ps(c, 4, 5);                          \
    } while (0)

// A panel being decoded a few rows at a time between the tile products of
// the panel before it, so the decoding runs while the tile unit works
// (one after the other, they took about the sum of their times: Q4_K
// 2816x1024 on one thread, 1.19 against 0.66 ms at 64 rows, 0.46-0.67
// against 0.43 at 16).
// A relaid panel (x16, its ggml type) decodes by units of 64 elements
// of all 16 rows instead, upto rows' share of them.
typedef struct {
    int t, x16;
    const uint8_t *w; // the panel's first row
    int64_t rowb, k;
    float *tmp;
    uint16_t *panel;
    int64_t next; // rows decoded (relaid: units)
    int rows;     // rows of the panel (the rest are zeros)
} qa_fill;

static QA_TARGET void qa_fill_to(qa_fill *f, int upto) {
    if (upto > f->rows) upto = f->rows;
    if (f->x16) {
        const int64_t want = (upto * ((f->k + 63) / 64) + 15) / 16;
        if (want <= f->next) return;
        if (f->x16 == 12 || f->x16 == 13)
            qa_tile_k16(f->x16, f->w, f->k, f->next, want, f->panel);
        else
            qa_tile_x16(f->x16, f->w, f->k, f->next, want, f->panel);
        f->next = want;
        return;
    }
    for (; f->next < upto; f->next++) {
        const uint8_t *wr = f->w + f->next * f->rowb;
        // Prefetch the next row while this one decodes.
        for (int64_t o = 0; o < f->rowb; o += 64) _mm_prefetch((const char *)(wr + f->rowb + o), _MM_HINT_T0);
        qa_row(f->t, wr, f->rowb, f->k, f->tmp, f->panel + f->next * f->k);
    }
}

static void qa_fill_start(qa_fill *f, int t, const uint8_t *w, int64_t rowb, int64_t n_out, int64_t k, float *tmp,
        uint16_t *panel, int64_t p) {
    const int64_t n0 = 16 * p;
    f->t = t, f->x16 = qa_x16(t), f->w = w + n0 * rowb, f->rowb = rowb, f->k = k, f->tmp = tmp, f->panel = panel, f->next = 0;
    f->rows = (int)(n_out - n0 < 16 ? n_out - n0 : 16);
    if (f->rows > 0 && f->rows < 16) memset(panel + f->rows * k, 0, (size_t)((16 - f->rows) * k * 2));
}

// One pass of up to QA_MB activation rows (mt m tiles from xm) over a
// decoded panel: the products over the whole k, their C tiles combined
// into cbuf (m tile c at cbuf + 256c, f32 [16 weight rows][16 rows]).
// With f, the next panel decodes between the strips.
static QA_TARGET void qa_pass(const uint16_t *panel, int64_t k, const uint8_t *xm, int64_t xstride, int mt,
        qa_fill *f, float *cbuf) {
    const int64_t nkc = k / 32;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    int64_t kc = 0;
    if (mt == 1) {
        for (; kc + 4 <= nkc; kc += 4) {
            const uint8_t *xk = xm + kc * 1024;
            _tile_loadd(4, panel + 32 * kc, k * 2);
            _tile_loadd(6, xk, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_loadd(5, panel + 32 * (kc + 1), k * 2);
            _tile_loadd(7, xk + 1024, 64);
            _tile_dpbf16ps(1, 5, 7);
            _tile_loadd(4, panel + 32 * (kc + 2), k * 2);
            _tile_loadd(6, xk + 2048, 64);
            _tile_dpbf16ps(2, 4, 6);
            _tile_loadd(5, panel + 32 * (kc + 3), k * 2);
            _tile_loadd(7, xk + 3072, 64);
            _tile_dpbf16ps(3, 5, 7);
            if (f) qa_fill_to(f, (int)((kc + 4) * 16 / nkc));
        }
    } else if (mt == 2) {
        for (; kc + 2 <= nkc; kc += 2) {
            const uint8_t *xk = xm + kc * 1024;
            _tile_loadd(4, panel + 32 * kc, k * 2);
            QA_DP(0, 0, xk);
            QA_DP(1, 1, xk);
            _tile_loadd(4, panel + 32 * (kc + 1), k * 2);
            QA_DP(2, 0, xk + 1024);
            QA_DP(3, 1, xk + 1024);
            if (f) qa_fill_to(f, (int)((kc + 2) * 16 / nkc));
        }
    }
    for (; kc < nkc; kc++) { // mt 3 and 4, and the strips left over
        const uint8_t *xk = xm + kc * 1024;
        _tile_loadd(4, panel + 32 * kc, k * 2);
        QA_DP(0, 0, xk);
        if (mt > 1) QA_DP(1, 1, xk);
        if (mt > 2) QA_DP(2, 2, xk);
        if (mt > 3) QA_DP(3, 3, xk);
        if (f) qa_fill_to(f, (int)((kc + 1) * 16 / nkc));
    }
    _tile_stored(0, cbuf, 64);
    _tile_stored(1, cbuf + 256, 64);
    _tile_stored(2, cbuf + 512, 64);
    _tile_stored(3, cbuf + 768, 64);
    // C tile c holds m tile c, or (mt 1) strips c mod 4, or (mt 2) m tile
    // c mod 2 for even strips and c-2 for odd ones.
    if (mt == 1) {
        for (int i = 0; i < 256; i += 16)
            _mm512_storeu_ps(cbuf + i, _mm512_add_ps(_mm512_add_ps(_mm512_loadu_ps(cbuf + i), _mm512_loadu_ps(cbuf + 256 + i)),
                    _mm512_add_ps(_mm512_loadu_ps(cbuf + 512 + i), _mm512_loadu_ps(cbuf + 768 + i))));
    } else if (mt == 2) {
        for (int tt = 0; tt < 2; tt++)
            for (int i = 0; i < 256; i += 16)
                _mm512_storeu_ps(cbuf + 256 * tt + i,
                        _mm512_add_ps(_mm512_loadu_ps(cbuf + 256 * tt + i), _mm512_loadu_ps(cbuf + 512 + 256 * tt + i)));
    }
}

// cbuf's m tiles (a pass from row m0) into y's columns n0..n0+nr: each
// tile transposed in registers and written a row of y at a time (element
// by element, the strided stores took a fifth of qa_panels' time at 512
// rows).
static QA_TARGET void qa_out(const float *cbuf, int mt, int64_t m0, int64_t m, float *y, int64_t ldy, int64_t n0, int nr) {
    const __mmask16 cols = (__mmask16)((1u << nr) - 1);
    for (int tt = 0; tt < mt; tt++) {
        const float *c = cbuf + 256 * tt;
        const int64_t r0 = m0 + 16 * tt;
        const int rr = (int)(m - r0 < 16 ? m - r0 : 16);
        __m512i v[16];
        for (int n = 0; n < 16; n++) v[n] = _mm512_loadu_si512((const void *)(c + 16 * n));
        qa_transpose16(v);
        for (int r = 0; r < rr; r++) _mm512_mask_storeu_ps(y + (r0 + r) * ldy + n0, cols, _mm512_castsi512_ps(v[r]));
    }
}

// qa_out's SwiGLU form: the C tiles of a gate panel (cg) and of its up
// panel (cu), 16 columns, to y as silu(gate)·up by bd_silu_mul_avx512,
// bd_swiglu's own kernel.
static QA_TARGET void qa_out_swiglu(const float *cg, const float *cu, int mt, int64_t m0, int64_t m, float *y,
        int64_t ldy, int64_t n0) {
    float g[256] __attribute__((aligned(64))), u[256] __attribute__((aligned(64)));
    for (int tt = 0; tt < mt; tt++) {
        const int64_t r0 = m0 + 16 * tt;
        const int rr = (int)(m - r0 < 16 ? m - r0 : 16);
        __m512i v[16];
        for (int n = 0; n < 16; n++) v[n] = _mm512_loadu_si512((const void *)(cg + 256 * tt + 16 * n));
        qa_transpose16(v);
        for (int r = 0; r < 16; r++) _mm512_store_si512((void *)(g + 16 * r), v[r]);
        for (int n = 0; n < 16; n++) v[n] = _mm512_loadu_si512((const void *)(cu + 256 * tt + 16 * n));
        qa_transpose16(v);
        for (int r = 0; r < 16; r++) _mm512_store_si512((void *)(u + 16 * r), v[r]);
        bd_silu_mul_avx512(g, u, g, 16 * rr);
        for (int r = 0; r < rr; r++) _mm512_storeu_ps(y + (r0 + r) * ldy + n0, _mm512_load_ps(g + 16 * r));
    }
}

// Panels a group holds (qa_pass_group): as many as fit in about 1 MiB,
// from 2 to 8. A 64-row pass's activations (64 rows x k bf16: 608 KiB at
// k 4864) do not stay in the L2 from one panel to the next, so a pass runs
// over a group of decoded panels: the activations are read from further
// out once a group, not once a panel (Q8_0 896x4864 at 512 rows, one
// thread: 3.1 ns a weight with one panel a pass, 2.7 with groups).
static int64_t qa_group(int64_t k) {
    const int64_t g = (1 << 20) / (16 * k * 2);
    return g < 2 ? 2 : g > 8 ? 8 : g;
}

// Whether a thread's panels decode one at a time, each while the one
// before runs its products (qa_pass with a fill), or a group at a time
// before the group's passes (qa_pass_group). Overlapping pays where the
// decoding is a large part of the work: fewer than 64 rows, and rows of
// up to 1024 (two panels in 64 KiB; with longer rows the second buffer
// pushed the first further out of the caches and cost more than the
// overlap gave: Q6_K, k 2816, 1.3x slower). From 64 rows the chunked
// group passes win: Q8_0 at 512 rows, one thread, 1024x1024 1.70 -> 1.43
// ns a weight, 9728x896 1.79 -> 1.47 (bench/qkernels, min of 3).
static int qa_overlap(int64_t k, int64_t m) { return k <= 1024 && m < QA_MB; }

// A pass of four m tiles (64 rows from xm) over np decoded panels, a chunk
// of QA_KCH strips at a time: the chunk's B tiles (32 KiB) stay in the L1
// while every panel of the group takes them, and each panel's C tiles are
// kept in cg between chunks. Run whole over k, a pass read its B tiles
// from the L2 once a panel: five tile loads for four products, more than
// the L2 gives at the tile unit's rate.
#define QA_KCH 8
static QA_TARGET void qa_pass_group(const uint16_t *panels, int np, int64_t k, const uint8_t *xm, int64_t xstride,
        float *cg) {
    const int64_t nkc = k / 32;
    for (int64_t kc0 = 0; kc0 < nkc; kc0 += QA_KCH) {
        const int64_t kc1 = kc0 + QA_KCH < nkc ? kc0 + QA_KCH : nkc;
        for (int j = 0; j < np; j++) {
            const uint16_t *panel = panels + j * 16 * k;
            float *c = cg + j * 1024;
            if (kc0 == 0) {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
            } else {
                _tile_loadd(0, c, 64);
                _tile_loadd(1, c + 256, 64);
                _tile_loadd(2, c + 512, 64);
                _tile_loadd(3, c + 768, 64);
            }
            for (int64_t kc = kc0; kc < kc1; kc++) {
                const uint8_t *xk = xm + kc * 1024;
                _tile_loadd(4, panel + 32 * kc, k * 2);
                _tile_loadd(5, xk, 64);
                _tile_dpbf16ps(0, 4, 5);
                _tile_loadd(6, xk + xstride, 64);
                _tile_dpbf16ps(1, 4, 6);
                _tile_loadd(7, xk + 2 * xstride, 64);
                _tile_dpbf16ps(2, 4, 7);
                _tile_loadd(5, xk + 3 * xstride, 64);
                _tile_dpbf16ps(3, 4, 5);
            }
            _tile_stored(0, c, 64);
            _tile_stored(1, c + 256, 64);
            _tile_stored(2, c + 512, 64);
            _tile_stored(3, c + 768, 64);
        }
    }
}

// qa_panels runs panels [p0,p1) of W; with swiglu, pairs [p0,p1): pair j
// is gate panel j and up panel j + n_out/32, decoded side by side in a
// group, and y gets silu(gate)·up (m >= QA_MB: the group passes only).
static QA_TARGET void qa_panels(int t, const uint8_t *w, int64_t rowb, int64_t n_out, int64_t k, const uint16_t *xb,
        int64_t m, float *y, int64_t ldy, int64_t p0, int64_t p1, uint8_t *mine, int swiglu) {
    const int overlap = qa_overlap(k, m);
    const int64_t G = overlap ? 2 : qa_group(k);
    uint16_t *panels = (uint16_t *)mine; // G panels of bf16 [16][k]
    float *tmp = (float *)(mine + G * 16 * k * 2);
    float *cbuf = (float *)(mine + G * 16 * k * 2 + k * 4); // 4 tiles of f32 [16][16] (8 panels' in qa_pass_group)
    const int64_t nkc = k / 32, xstride = nkc * 1024;       // bytes between m tiles of one strip
    qa_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.rows[i] = 16, cfg.colsb[i] = 64;
    _tile_loadconfig(&cfg);
    qa_fill f = {0};
    // With panels of up to 32 KiB (k up to 1024) the next panel decodes
    // into the other buffer as this one's strips go to the tile unit.
    if (overlap) {
        if (p0 < p1) {
            qa_fill_start(&f, t, w, rowb, n_out, k, tmp, panels, p0);
            qa_fill_to(&f, 16);
        }
        for (int64_t p = p0; p < p1; p++) {
            const int64_t n0 = 16 * p;
            const int nr = (int)(n_out - n0 < 16 ? n_out - n0 : 16);
            uint16_t *panel = panels + ((p - p0) & 1) * 16 * k;
            const int more = p + 1 < p1;
            if (more) qa_fill_start(&f, t, w, rowb, n_out, k, tmp, panels + ((p - p0 + 1) & 1) * 16 * k, p + 1);
            for (int64_t m0 = 0; m0 < m; m0 += QA_MB) {
                const int mt = (int)((m - m0 + 15) / 16 < 4 ? (m - m0 + 15) / 16 : 4);
                qa_pass(panel, k, (const uint8_t *)xb + (m0 / 16) * xstride, xstride, mt, more ? &f : NULL, cbuf);
                qa_out(cbuf, mt, m0, m, y, ldy, n0, nr);
            }
            if (more) qa_fill_to(&f, 16);
        }
    } else if (swiglu) {
        // As below, a group holding G/2 pairs of gate and up panels.
        const int64_t half = n_out / 32, GP = G / 2;
        for (int64_t g0 = p0; g0 < p1; g0 += GP) {
            const int np = (int)(p1 - g0 < GP ? p1 - g0 : GP);
            for (int j = 0; j < 2 * np; j++) {
                qa_fill_start(&f, t, w, rowb, n_out, k, tmp, panels + j * 16 * k, g0 + j / 2 + (j & 1) * half);
                qa_fill_to(&f, 16);
            }
            for (int64_t m0 = 0; m0 < m; m0 += QA_MB) {
                const int mt = (int)((m - m0 + 15) / 16 < 4 ? (m - m0 + 15) / 16 : 4);
                const uint8_t *xm = (const uint8_t *)xb + (m0 / 16) * xstride;
                if (mt == 4) qa_pass_group(panels, 2 * np, k, xm, xstride, cbuf);
                for (int j = 0; j < np; j++) {
                    const float *cg = cbuf + 2 * j * 1024, *cu = cg + 1024;
                    if (mt < 4) {
                        qa_pass(panels + 2 * j * 16 * k, k, xm, xstride, mt, NULL, cbuf);
                        qa_pass(panels + (2 * j + 1) * 16 * k, k, xm, xstride, mt, NULL, cbuf + 1024);
                        cg = cbuf, cu = cbuf + 1024;
                    }
                    qa_out_swiglu(cg, cu, mt, m0, m, y, ldy, 16 * (g0 + j));
                }
            }
        }
    } else {
        // A group of panels decoded whole, then each pass over all of them.
        for (int64_t g0 = p0; g0 < p1; g0 += G) {
            const int np = (int)(p1 - g0 < G ? p1 - g0 : G);
            for (int j = 0; j < np; j++) {
                qa_fill_start(&f, t, w, rowb, n_out, k, tmp, panels + j * 16 * k, g0 + j);
                qa_fill_to(&f, 16);
            }
            for (int64_t m0 = 0; m0 < m; m0 += QA_MB) {
                const int mt = (int)((m - m0 + 15) / 16 < 4 ? (m - m0 + 15) / 16 : 4);
                const uint8_t *xm = (const uint8_t *)xb + (m0 / 16) * xstride;
                if (mt == 4) qa_pass_group(panels, np, k, xm, xstride, cbuf);
                for (int j = 0; j < np; j++) {
                    const int64_t n0 = 16 * (g0 + j);
                    if (mt < 4) qa_pass(panels + j * 16 * k, k, xm, xstride, mt, NULL, cbuf);
                    qa_out(mt < 4 ? cbuf : cbuf + j * 1024, mt, m0, m, y, ldy, n0, (int)(n_out - n0 < 16 ? n_out - n0 : 16));
                }
            }
        }
    }
    _tile_release();
}

// ---- Q8_0 on AMX-INT8: the weights' own int8, no decoding. ----
//
// Tiles (palette 1):
//   tmm0-3  C: int32 [16 weight rows][16 activation rows], one 32-block each
//   tmm4-5  A: int8 [16 weight rows][32], one block of 16 rows, loaded from
//           the weights as they are (the row stride skips each next
//           block's scale)
//   tmm6-7  B: int8 [8 quads][16 activation rows][4], the same block of X
// A block's integer sums are scaled by its weight scale (per row) and
// activation scale (per column) into f32 accumulators that stay in
// registers for a 16×16 output, so TDPBSSD runs at K = 32, half its
// width, and the scaling costs three vector operations a row a block. In
// exchange nothing is decoded: the bf16 path converts every weight.
//
// The activations are quantized as ggml's quantize_row_q8_0 does (d =
// amax/127, q = round(x/d)), f32 scales, as qgemm does for its int8 dot
// products: the error bound is qgemm's (qgemm.c).
//
// Scratch: xq int8 [m tiles][nb][8][16][4], sx f32 [m tiles][nb][16]
// (zeros past m: 18k bytes an m tile, within the bf16 path's 32k); per
// thread two sets of four C tiles and a copy of the last, partial panel
// padded with zero rows (qa_thread_bytes).

static QA_TARGET_I8 void qa_quant_x(const float *x, int64_t m, int64_t k, int8_t *xq, float *sx, int64_t mt0, int64_t mt1) {
    const int64_t nb = k / 32;
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t mt = mt0; mt < mt1; mt++) {
        for (int r = 0; r < 16; r++) {
            const int64_t row = 16 * mt + r;
            int8_t *dq = xq + mt * nb * 512 + 4 * r;
            float *ds = sx + mt * nb * 16 + r;
            if (row >= m) {
                for (int64_t b = 0; b < nb; b++) {
                    for (int i = 0; i < 8; i++) memset(dq + b * 512 + 64 * i, 0, 4);
                    ds[16 * b] = 0.0f;
                }
                continue;
            }
            const float *src = x + row * k;
            for (int64_t b = 0; b < nb; b++) {
                const __m512 lo = _mm512_loadu_ps(src + 32 * b), hi = _mm512_loadu_ps(src + 32 * b + 16);
                const __m512 alo = _mm512_and_ps(lo, absmask), ahi = _mm512_and_ps(hi, absmask);
                const float amax = _mm512_reduce_max_ps(_mm512_max_ps(alo, ahi));
                // vmaxps drops NaNs, so they are looked for apart.
                const __m512 big = _mm512_set1_ps(FLT_MAX);
                const __mmask16 bad = _mm512_cmp_ps_mask(alo, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(ahi, big, _CMP_NLE_UQ);
                __m128i q0 = _mm_setzero_si128(), q1 = _mm_setzero_si128();
                float d;
                if (bad) {
                    d = NAN; // a non-finite activation: NaN in its column
                } else {
                    d = amax / 127.0f;
                    const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
                    q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(lo, id)));
                    q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(hi, id)));
                }
                // Element 4i..4i+3 is quad i of this row.
                int8_t *o = dq + b * 512;
                for (int i = 0; i < 4; i++) {
                    const int32_t a = _mm_extract_epi32(q0, 0), c = _mm_extract_epi32(q1, 0);
                    memcpy(o + 64 * i, &a, 4);
                    memcpy(o + 64 * (i + 4), &c, 4);
                    q0 = _mm_srli_si128(q0, 4), q1 = _mm_srli_si128(q1, 4);
                }
                ds[16 * b] = d;
            }
        }
    }
}

// Four blocks' products, b0..b0+3, into C tiles 0-3. A is read straight
// from the weights: a block's 32 quants of 16 rows, rowb apart.
#define QA_I8_DP(c, a, bt, blk)                                   \
    do {                                                          \
        _tile_zero(c);                                            \
        _tile_loadd(a, wp + (blk) * 34 + 2, rowb);                \
        _tile_loadd(bt, xqm + (blk) * 512, 64);                   \
        _tile_dpbssd(c, a, bt);                                   \
    } while (0)
#define QA_I8_DP4(b0)                  \
    do {                               \
        QA_I8_DP(0, 4, 6, (b0));       \
        QA_I8_DP(1, 5, 7, (b0) + 1);   \
        QA_I8_DP(2, 4, 6, (b0) + 2);   \
        QA_I8_DP(3, 5, 7, (b0) + 3);   \
    } while (0)

// acc[r] += (C[r] · sx) · sw[r] for block blk's C tile at cbuf, sw being
// the 16 rows' f16 scales gathered from the weights.
#define QA_I8_SCALE(cbuf, blk)                                                                                  \
    do {                                                                                                        \
        const __m512 s_ = _mm512_load_ps(sxm + (blk) * 16);                                                     \
        float w_[16] __attribute__((aligned(64)));                                                              \
        _mm512_store_ps(w_, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(sidx, wp + (blk) * 34, 1)))); \
        for (int r_ = 0; r_ < 16; r_++)                                                                         \
            acc[r_] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512((cbuf) + 16 * r_)), s_),  \
                    _mm512_set1_ps(w_[r_]), acc[r_]);                                                           \
    } while (0)

static QA_TARGET_I8 void qa_panels_q8(const uint8_t *w, int64_t rowb, int64_t n_out, int64_t k, const int8_t *xq,
        const float *sx, int64_t m, float *y, int64_t ldy, int64_t p0, int64_t p1, uint8_t *mine) {
    const int64_t nb = k / 32, ng = nb / 4;
    int32_t *cb = (int32_t *)mine;       // two sets of four C tiles, 8 KiB
    uint8_t *part = mine + 8192;         // the last panel's rows, zero-padded to 16
    qa_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 4; i++) cfg.rows[i] = 16, cfg.colsb[i] = 64;
    cfg.rows[4] = cfg.rows[5] = 16, cfg.colsb[4] = cfg.colsb[5] = 32;
    cfg.rows[6] = cfg.rows[7] = 8, cfg.colsb[6] = cfg.colsb[7] = 64;
    _tile_loadconfig(&cfg);
    const __m512i gidx = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
    const __m512i sidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32((int)rowb));
    // The next panel is prefetched a slice per group of four blocks.
    const int64_t lines = (16 * rowb + 63) / 64, per = ng ? (lines + ng - 1) / ng : lines;
    for (int64_t p = p0; p < p1; p++) {
        const int64_t n0 = 16 * p;
        const int nr = (int)(n_out - n0 < 16 ? n_out - n0 : 16);
        const uint8_t *wp = w + n0 * rowb;
        const char *next = (const char *)(wp + 16 * rowb); // prefetches do not fault past W
        if (nr < 16) {
            memcpy(part, wp, (size_t)(nr * rowb));
            memset(part + nr * rowb, 0, (size_t)((16 - nr) * rowb));
            wp = part;
        }
        if (!ng)
            for (int64_t l = 0; l < lines; l++) _mm_prefetch(next + 64 * l, _MM_HINT_T0);
        for (int64_t mt = 0; mt * 16 < m; mt++) {
            const int8_t *xqm = xq + mt * nb * 512;
            const float *sxm = sx + mt * nb * 16;
            __m512 acc[16];
            for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
            // Software-pipelined: group g+1's products are issued before
            // group g's C tiles are scaled, so the tile unit and the
            // vector units work at once.
            if (ng) QA_I8_DP4(0);
            for (int64_t g = 0; g < ng; g++) {
                int32_t *c = cb + (g & 1) * 1024;
                _tile_stored(0, c, 64);
                _tile_stored(1, c + 256, 64);
                _tile_stored(2, c + 512, 64);
                _tile_stored(3, c + 768, 64);
                if (g + 1 < ng) QA_I8_DP4(4 * (g + 1));
                if (mt == 0)
                    for (int64_t l = g * per; l < (g + 1) * per && l < lines; l++) _mm_prefetch(next + 64 * l, _MM_HINT_T0);
                QA_I8_SCALE(c, 4 * g);
                QA_I8_SCALE(c + 256, 4 * g + 1);
                QA_I8_SCALE(c + 512, 4 * g + 2);
                QA_I8_SCALE(c + 768, 4 * g + 3);
            }
            for (int64_t b = 4 * ng; b < nb; b++) {
                QA_I8_DP(0, 4, 6, b);
                _tile_stored(0, cb, 64);
                QA_I8_SCALE(cb, b);
            }
            // acc[r] is weight row n0+r against activation rows 16mt..+15;
            // y wants it transposed.
            float *t = (float *)cb;
            for (int r = 0; r < 16; r++) _mm512_store_ps(t + 16 * r, acc[r]);
            const int rr = (int)(m - 16 * mt < 16 ? m - 16 * mt : 16);
            const __mmask16 keep = (__mmask16)((1u << nr) - 1);
            for (int c = 0; c < rr; c++)
                _mm512_mask_storeu_ps(y + (16 * mt + c) * ldy + n0, keep, _mm512_i32gather_ps(gidx, t + c, 4));
        }
    }
    _tile_release();
}

int bd_qamx_int8(int wtype, int64_t m) {
    return wtype == 8 && m >= 1 && m <= 16 && bd_qamx_available() && __atomic_load_n(&qa_int8_ok, __ATOMIC_RELAXED);
}

int bd_qamx(int wtype, const void *w, int64_t w_bytes, int64_t n_out, int64_t k, const float *x, int64_t m, float *y,
        int64_t ldy, int nthreads, int flags, void *work, int64_t work_bytes) {
    const int64_t need = bd_qamx_work_bytes(wtype, k, m, nthreads);
    if (need < 0) return (int)need;
    int elems = 1, bytes = 1; // set by qa_block, which bd_qamx_work_bytes has accepted
    qa_block(wtype, &elems, &bytes);
    const int swiglu = flags & BD_QAMX_SWIGLU;
    // With swiglu, y has n_out/2 columns, and the group passes must run.
    const int64_t ny = swiglu ? n_out / 2 : n_out;
    if (swiglu && (n_out % 32 != 0 || m < QA_MB)) return BD_QGEMM_SIZE;
    if (n_out <= 0 || n_out > BD_QGEMM_MAX || ldy < ny || ldy > BD_QGEMM_MAX) return BD_QGEMM_SIZE;
    const int64_t rowb = k / elems * bytes;
    if (rowb > BD_QGEMM_MAX / n_out || w_bytes != rowb * n_out) return BD_QGEMM_SIZE;
    if (qa_x16(wtype) && n_out % 16 != 0) return BD_QGEMM_SIZE; // whole tiles
    if (m - 1 > (BD_QGEMM_MAX - ny) / ldy) return BD_QGEMM_SIZE;
    if (work && work_bytes < need) return BD_QGEMM_SIZE;
    if (!bd_qamx_available()) return BD_QAMX_NO_AMX;
    uint8_t *ws = work;
    if (!ws) {
        ws = aligned_alloc(64, (size_t)need);
        if (!ws) return BD_QGEMM_NOMEM;
    }
    const int64_t xbb = (qa_xb_bytes(k, m) + 63) & ~(int64_t)63, th = (qa_thread_bytes(k) + 63) & ~(int64_t)63;
    uint16_t *xb = (uint16_t *)ws;
    // The units handed out: panels of 16 rows, or pairs of them (swiglu).
    const int64_t panels = swiglu ? n_out / 32 : (n_out + 15) / 16, mts = (m + 15) / 16;
    // The team is always the device's nthreads (threads past the work get
    // none): libgomp ends a pool's surplus threads when a smaller team
    // starts and creates them again for the next full one, which cost
    // 0.1-0.4 ms an op on a 16-core host (a Qwen decode step's k and v
    // projections have 8 panels between products of 56).
    const int nt = nthreads;
    const int64_t workers = panels < nt ? panels : nt;
    // (The scales' gather indexes rows by int32 offsets: 15 rows must fit.
    // AMX-INT8 runs up to 16 rows, below swiglu's 64.)
    if (!(flags & BD_QAMX_NO_INT8) && !swiglu && bd_qamx_int8(wtype, m) && rowb <= INT32_MAX / 16) {
        int8_t *xq = (int8_t *)ws;
        float *sx = (float *)(ws + mts * 16 * k);
#pragma omp parallel num_threads(nt) if (nt > 1)
        {
            const int me = omp_get_thread_num(), all = omp_get_num_threads();
            qa_quant_x(x, m, k, xq, sx, mts * me / all, mts * (me + 1) / all);
#pragma omp barrier
            qa_panels_q8(w, rowb, n_out, k, xq, sx, m, y, ldy, panels * me / all, panels * (me + 1) / all,
                    ws + xbb + th * me);
        }
        if (!work) free(ws);
        return BD_QGEMM_OK;
    }
    // Panels are handed out in chunks as threads ask: a prefill's product
    // runs for milliseconds, and on a shared host one core is often slowed
    // by another tenant, which left the other waiting at the barrier under
    // a static split. About four chunks a thread, at most a decode group
    // each (whole groups of 8 on 16 threads left 176 panels in 22 chunks:
    // two rounds for six threads, one for ten).
    const int overlap = qa_overlap(k, m);
    const int64_t grp = overlap ? panels : swiglu ? qa_group(k) / 2 : qa_group(k);
    int64_t chunk = (panels + 4 * workers - 1) / (4 * workers);
    if (chunk > grp) chunk = grp;
    // A task is a chunk of panels over all of X's rows, unless that leaves
    // a thread less than a whole group while X is larger than the L2 holds
    // beside it: then each pass over one panel reads X from the L3, which
    // 16 threads share (Qwen2.5-0.5B's down projection at 512 rows: 56
    // panels, 5 MiB of X). Such tasks are whole groups over slices of X's
    // rows that stay in the L2; a group is decoded once a slice instead of
    // once, which costs less than X's reads saved.
    int64_t rows = m;
    if (!overlap && chunk < grp && 2 * k * m > QA_X_L2) {
        chunk = grp;
        rows = QA_X_SLICE / (2 * k) / QA_MB * QA_MB;
        if (rows < QA_MB) rows = QA_MB;
        if (rows > m) rows = m; // (k past 10k: X outgrows the L2 below 64 rows)
    } else if (!overlap && !swiglu && chunk == 1 && m >= 2 * QA_MB) {
        // One panel a task (at most four panels a thread: Qwen's k and v
        // projections have 8) streams all of X's B tiles for 16 outputs.
        // Tasks of up to four panels over slices of X's rows instead, the
        // rows halved while there would be fewer than two tasks a thread,
        // then the panels while fewer than one. On a 16-core host Qwen2.5-
        // 0.5B's k and v product at 512 rows took 83-112 us against 156-183
        // (llama-12x1024's 141-175 against 216-273); its q and o (56 panels)
        // take this path too, within the noise of the old split. SwiGLU's
        // pairs lost (llama's at 16 threads: 1.77-1.83 ms against
        // 1.36-1.65), so they keep the split above.
        chunk = grp < 4 ? grp : 4;
        while ((panels + chunk - 1) / chunk * (m / rows) < 2 * nt && rows > QA_MB) {
            rows = rows / 2 / QA_MB * QA_MB;
            if (rows < QA_MB) rows = QA_MB;
        }
        while ((panels + chunk - 1) / chunk * (m / rows) < nt && chunk > 1) chunk /= 2;
    }
    // Slices of whole passes; the last one takes the rest (swiglu's group
    // passes need at least QA_MB rows).
    const int64_t pcs = (panels + chunk - 1) / chunk, slices = m / rows, tasks = pcs * slices;
    const int64_t xstride = k / 32 * 1024;
    int64_t next = 0;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const int me = omp_get_thread_num(), all = omp_get_num_threads();
        qa_layout_x(x, m, k, xb, mts * me / all, mts * (me + 1) / all);
#pragma omp barrier
        for (;;) {
            int64_t t;
#pragma omp atomic capture
            t = next++;
            if (t >= tasks) break;
            // Consecutive tasks share a slice: the threads running at once
            // read the same rows of X.
            const int64_t s = t / pcs, p0 = t % pcs * chunk, m0 = s * rows;
            const int64_t mr = s == slices - 1 ? m - m0 : rows;
            qa_panels(wtype, w, rowb, n_out, k, (const uint16_t *)((const uint8_t *)xb + m0 / 16 * xstride), mr,
                    y + m0 * ldy, ldy, p0, p0 + chunk < panels ? p0 + chunk : panels, ws + xbb + th * me, swiglu);
        }
    }
    if (!work) free(ws);
    return BD_QGEMM_OK;
}

int bd_qamx_panel(int wtype, const void *w, int64_t w_bytes, int64_t n_out, int64_t k, int64_t p, int steps,
        uint16_t *out) {
    int elems, bytes;
    if (!qa_block(wtype, &elems, &bytes)) return BD_QGEMM_UNSUPPORTED;
    if (k <= 0 || k > BD_QGEMM_MAX / 64 || k % elems != 0 || k % 32 != 0 || n_out <= 0 || n_out > BD_QGEMM_MAX ||
            steps < 1 || steps > 16 || p < 0 || p >= (n_out + 15) / 16 || (qa_x16(wtype) && n_out % 16 != 0))
        return BD_QGEMM_SIZE;
    const int64_t rowb = k / elems * bytes;
    if (rowb > BD_QGEMM_MAX / n_out || w_bytes != rowb * n_out) return BD_QGEMM_SIZE;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512bw") ||
            !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq") ||
            !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c"))
        return BD_QAMX_NO_AMX;
    float *tmp = malloc((size_t)k * sizeof(float));
    if (!tmp) return BD_QGEMM_NOMEM;
    qa_fill f = {0};
    qa_fill_start(&f, wtype, w, rowb, n_out, k, tmp, out, p);
    for (int i = 1; i <= steps; i++) qa_fill_to(&f, 16 * i / steps);
    free(tmp);
    return BD_QGEMM_OK;
}
