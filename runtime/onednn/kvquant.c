// A KV cache in f16 (llama.cpp's and Ollama's default cache type), or in
// ggml's Q8_0 blocks ({f16 d; i8 q[32]} along each row, 17/32 of a bf16
// cache's memory) or Q4_0 blocks ({f16 d; u8 qs[16]}, 9/32), as their q8_0
// and q4_0 cache types. An f16 row is each value rounded to nearest even. Writing
// quantizes each row as ggml's quantize_row_q8_0_ref or
// quantize_row_q4_0_ref does; the attention kernels widen a row back to
// f32 (vec_avx512.h's bd_kvq_row512 and bd_kvq_ld16,
// dequant.c's decoders), and q·d is exact in f32 (at most 8 bits by 11),
// so they read what ggml's dequantize_row_q8_0 and _q4_0 would.

#include "dnnl_ops.h"
#include "vec_avx512.h"

#include <math.h>
#include <omp.h>
#include <string.h>

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// fp32_fp16 is ggml's GGML_FP32_TO_FP16 without F16C
// (ggml_compute_fp32_to_fp16): round to nearest even, subnormals kept.
static inline uint16_t fp32_fp16(float f) {
    const float scale_to_inf = 0x1.0p+112f, scale_to_zero = 0x1.0p-110f;
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = f32_bits(f), shl1_w = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = bits_f32((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = f32_bits(base);
    const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

#define Q_NAN 0x7E00 // d of a block holding an infinity or NaN

// nan_block writes a Q8_0 or Q4_0 (kvt) block of d = NaN and zero quants,
// which reads back as NaN: the block of values holding an infinity or NaN.
static void nan_block(uint8_t *y, int kvt) {
    y[0] = Q_NAN & 0xFF, y[1] = Q_NAN >> 8;
    if (kvt == BD_KV_Q4_0)
        memset(y + 2, 0x88, 16); // nibbles of 8: zero
    else
        memset(y + 2, 0, 32);
}

// q8_block is ggml's quantize_row_q8_0_ref for one block.
static void q8_block(const float *x, uint8_t *y) {
    float amax = 0.0f;
    int finite = 1;
    for (int j = 0; j < 32; j++) {
        const float v = fabsf(x[j]);
        finite &= isfinite(x[j]) != 0;
        amax = amax > v ? amax : v;
    }
    if (!finite) {
        nan_block(y, BD_KV_Q8_0);
        return;
    }
    const float d = amax / 127, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = fp32_fp16(d);
    y[0] = h & 0xFF, y[1] = h >> 8;
    for (int j = 0; j < 32; j++) {
        // Within ±127, except where 1/d overflows (amax under about 1e-36,
        // whose d is 0 as an f16): there ±inf or NaN, whose cast to int8
        // is undefined in C and 0 in ggml's x86 builds, so 0 here.
        float r = roundf(x[j] * id);
        r = isfinite(r) ? r : 0.0f;
        y[2 + j] = (uint8_t)(int8_t)r;
    }
}

// q8_block512 is q8_block in vector code, to the same bits: roundf (half
// away from zero) as truncation plus one where the dropped part is at
// least a half.
BD_AVX512 static void q8_block512(const float *x, uint8_t *y) {
    const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    // Infinities and NaNs (QNaN, +Inf, -Inf, SNaN).
    if (_mm512_fpclass_ps_mask(a, 0x99) | _mm512_fpclass_ps_mask(b, 0x99)) {
        nan_block(y, BD_KV_Q8_0);
        return;
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const float d = amax / 127, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = (uint16_t)_mm_extract_epi16(
            _mm256_castsi256_si128(_mm512_cvtps_ph(_mm512_set1_ps(d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)), 0);
    y[0] = h & 0xFF, y[1] = h >> 8;
    const __m512 vid = _mm512_set1_ps(id), half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32((int32_t)0x80000000u));
    for (int i = 0; i < 2; i++) {
        const __m512 p = _mm512_mul_ps(i ? b : a, vid);
        const __m512 t = _mm512_roundscale_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(p, t)), half, _CMP_GE_OQ);
        __m512 r = _mm512_mask_add_ps(t, up, t, _mm512_or_ps(_mm512_and_ps(p, sign), one));
        r = _mm512_maskz_mov_ps(~_mm512_fpclass_ps_mask(r, 0x99), r); // as q8_block
        _mm_storeu_si128((__m128i *)(y + 2 + 16 * i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
    }
}

// q4_block is ggml's quantize_row_q4_0_ref for one block: d = -max/8 where
// max is the first value of the largest magnitude, nibbles
// min(15, (int8)(x/d + 8.5)).
static void q4_block(const float *x, uint8_t *y) {
    float amax = 0.0f, max = 0.0f;
    int finite = 1;
    for (int j = 0; j < 32; j++) {
        finite &= isfinite(x[j]) != 0;
        if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
    }
    if (!finite) {
        nan_block(y, BD_KV_Q4_0);
        return;
    }
    const float d = max / -8, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = fp32_fp16(d);
    y[0] = h & 0xFF, y[1] = h >> 8;
    for (int j = 0; j < 16; j++) {
        // In [0, 16.5], except where 1/d overflows (amax under about
        // 2e-38): there ±inf or NaN, whose cast is undefined in C and 0 in
        // ggml's x86 builds, so 0 here.
        const float a = x[j] * id + 8.5f, b = x[16 + j] * id + 8.5f;
        const int qa = isfinite(a) ? (int)(int8_t)a : 0, qb = isfinite(b) ? (int)(int8_t)b : 0;
        y[2 + j] = (uint8_t)((qa < 15 ? qa : 15) | (qb < 15 ? qb : 15) << 4);
    }
}

#define BD_RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

// q4_block512 is q4_block in vector code, to the same bits.
BD_AVX512 static void q4_block512(const float *x, uint8_t *y) {
    const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    if (_mm512_fpclass_ps_mask(a, 0x99) | _mm512_fpclass_ps_mask(b, 0x99)) {
        nan_block(y, BD_KV_Q4_0);
        return;
    }
    // The first value of the largest magnitude, as the scalar loop finds it.
    const __m512 aa = _mm512_abs_ps(a), ab = _mm512_abs_ps(b);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(aa, ab));
    const __mmask16 ma = _mm512_cmp_ps_mask(aa, _mm512_set1_ps(amax), _CMP_EQ_OQ),
                    mb = _mm512_cmp_ps_mask(ab, _mm512_set1_ps(amax), _CMP_EQ_OQ);
    const float max = amax == 0.0f ? 0.0f : ma ? x[__builtin_ctz(ma)] : x[16 + __builtin_ctz(mb)];
    const float d = max / -8, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = (uint16_t)_mm_extract_epi16(
            _mm256_castsi256_si128(_mm512_cvtps_ph(_mm512_set1_ps(d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)), 0);
    y[0] = h & 0xFF, y[1] = h >> 8;
    const __m512 vid = _mm512_set1_ps(id), off = _mm512_set1_ps(8.5f);
    __m512i q[2];
    for (int i = 0; i < 2; i++) {
        // Two roundings, as the C: the _round forms keep the compiler from
        // contracting them into one FMA.
        const __m512 p = _mm512_add_round_ps(_mm512_mul_round_ps(i ? b : a, vid, BD_RN), off, BD_RN);
        // Truncation as (int8_t) casts in-range values; ±inf and NaN as 0.
        __m512i v = _mm512_maskz_cvttps_epi32(~_mm512_fpclass_ps_mask(p, 0x99), p);
        q[i] = _mm512_min_epi32(v, _mm512_set1_epi32(15));
    }
    const __m512i packed = _mm512_or_si512(q[0], _mm512_slli_epi32(q[1], 4));
    _mm_storeu_si128((__m128i *)(y + 2), _mm512_cvtepi32_epi8(packed));
}

BD_AVX512 static void bf16_32(const uint16_t *src, float *dst) {
    for (int i = 0; i < 32; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i))), 16)));
}

// f16_row16 converts 16 values (f32, or bf16 when x_bf16) to f16, rounded
// to nearest even as ggml's GGML_FP32_TO_FP16 and F16C do.
BD_AVX512 static void f16_row16(const void *x, int x_bf16, uint16_t *y) {
    const __m512 v = x_bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(
                                      _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)x)), 16))
                            : _mm512_loadu_ps((const float *)x);
    _mm256_storeu_si256((__m256i *)y, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// f16_row is an f16 cache's row: n values of x (f32, or bf16 when x_bf16)
// converted, 16 at a time in vector code where vec is set.
static void f16_row(const void *x, int x_bf16, int64_t n, uint16_t *y, int vec) {
    const int64_t es = x_bf16 ? 2 : 4;
    int64_t i = 0;
    if (vec)
        for (; i + 16 <= n; i += 16) f16_row16((const char *)x + i * es, x_bf16, y + i);
    for (; i < n; i++)
        y[i] = fp32_fp16(x_bf16 ? bits_f32((uint32_t)((const uint16_t *)x)[i] << 16) : ((const float *)x)[i]);
}

static void quant_row(int kvt, const void *x, int x_bf16, int64_t n, uint8_t *y, int vec) {
    if (kvt == BD_KV_F16) {
        f16_row(x, x_bf16, n, (uint16_t *)y, vec);
        return;
    }
    const int64_t bb = BD_KV_BLOCK(kvt);
    float tmp[32];
    for (int64_t b = 0; b < n / 32; b++) {
        const float *src = (const float *)x + 32 * b;
        if (x_bf16) {
            const uint16_t *s = (const uint16_t *)x + 32 * b;
            if (vec) {
                bf16_32(s, tmp);
            } else {
                for (int j = 0; j < 32; j++) tmp[j] = bits_f32((uint32_t)s[j] << 16);
            }
            src = tmp;
        }
        if (kvt == BD_KV_Q4_0)
            (vec ? q4_block512 : q4_block)(src, y + bb * b);
        else
            (vec ? q8_block512 : q8_block)(src, y + bb * b);
    }
}

BD_AVX512 static void kvq_ld16_row512(const void *base, int kvt, int64_t off, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(dst + i, bd_kvq_ld16(base, kvt, off + i));
}

int bd_kvq_ld16_row(const void *base, int kvt, int64_t off, float *dst, int64_t n) {
    if (!bd_have_avx512()) return 0;
    kvq_ld16_row512(base, kvt, off, dst, n);
    return 1;
}

void bd_quant_kv(int kvt, const float *x, int64_t n, uint8_t *y, int vec) {
    quant_row(kvt, x, 0, n, y, vec && bd_have_avx512());
}

int64_t bd_kv_write_q(const bd_device *d, int kvt, const void *x, int x_bf16, const int32_t *slots,
        int64_t t, int64_t row, void *cache, int64_t nslots) {
    for (int64_t i = 0; i < t; i++)
        if ((int64_t)slots[i] >= nslots) return i;
    const int vec = bd_have_avx512();
    const int64_t in = row * (x_bf16 ? 2 : 4), out = kvt == BD_KV_F16 ? row * 2 : row / 32 * BD_KV_BLOCK(kvt);
    uint8_t *c = cache;
    const char *src = x;
    if (t * row < 4096) {
        for (int64_t i = 0; i < t; i++)
            if (slots[i] >= 0) quant_row(kvt, src + i * in, x_bf16, row, c + (int64_t)slots[i] * out, vec);
        return -1;
    }
    // As bd_kv_write: a thread takes the rows whose slots fall in its runs
    // of about a page, in order, so rows of one slot stay on one thread.
    const int64_t run = out >= 4096 ? 1 : 4096 / out;
    omp_set_num_threads(d->nthreads);
#pragma omp parallel
    {
        const int me = omp_get_thread_num(), all = omp_get_num_threads();
        for (int64_t i = 0; i < t; i++)
            if (slots[i] >= 0 && (int64_t)slots[i] / run % all == me)
                quant_row(kvt, src + i * in, x_bf16, row, c + (int64_t)slots[i] * out, vec);
    }
    return -1;
}
