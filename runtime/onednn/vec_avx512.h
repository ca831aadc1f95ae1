// AVX-512 vector helpers shared by the kernels that run when the CPU has
// AVX-512 (each function carries its target, as the files' default target
// is baseline x86-64).
#ifndef BD_VEC_AVX512_H
#define BD_VEC_AVX512_H

#include <immintrin.h>
#include <stdint.h>

#include "attend.h"

#define BD_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))

// bd_exp512 is a Cephes-style exp (about 2 ulp against expf).
BD_AVX512 static inline __m512 bd_exp512(__m512 x) {
    // exp(x) = 2^n · e^r, n = round(x·log2 e), |r| <= ln2/2. Below -87.3
    // the result would be subnormal: it is 0 instead, as subnormal operands
    // cost a microcode assist in every later multiply (there is no DAZ
    // under Go). Above 88.72 it would overflow.
    __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_GE_OQ);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q); // kept NaN, as expf keeps it
    const __m512 x0 = x;
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.7228391f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_mask_mov_ps(_mm512_maskz_mov_ps(normal, _mm512_scalef_ps(p, n)), nan, x0);
}

// bd_kvq_block512 puts the 32 values of the Q8_0 or Q4_0 (kvt, attend.h's
// BD_KV_*) block at src in lo and hi as f32, exactly: q·d for Q8_0 ({f16
// d; i8 q[32]}), (nibble - 8)·d for Q4_0 ({f16 d; u8 qs[16]}: element j in
// the low nibble of qs[j], j+16 in the high one).
BD_AVX512 static inline __attribute__((always_inline)) void bd_kvq_block512(const uint8_t *src, int kvt, __m512 *lo, __m512 *hi) {
    uint16_t h;
    __builtin_memcpy(&h, src, 2);
    const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)h));
    __m512i l, u;
    if (kvt == BD_KV_Q4_0) {
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(src + 2)));
        l = _mm512_sub_epi32(_mm512_and_si512(q, _mm512_set1_epi32(15)), _mm512_set1_epi32(8));
        u = _mm512_sub_epi32(_mm512_srli_epi32(q, 4), _mm512_set1_epi32(8));
    } else {
        l = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + 2)));
        u = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + 18)));
    }
    *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(l), d);
    *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(u), d);
}

BD_AVX512 static inline __attribute__((always_inline)) void bd_kvq_blocks512(const void *base, int kvt, int64_t off,
        float *dst, int64_t dim) {
    const int64_t bb = BD_KV_BLOCK(kvt);
    const uint8_t *src = (const uint8_t *)base + off / 32 * bb;
    for (int64_t b = 0; b < dim / 32; b++, src += bb) {
        __m512 lo, hi;
        bd_kvq_block512(src, kvt, &lo, &hi);
        _mm512_storeu_ps(dst + 32 * b, lo);
        _mm512_storeu_ps(dst + 32 * b + 16, hi);
    }
}

// bd_kvq_row512 widens dim values of an f16 (dim % 16 == 0), Q8_0 or Q4_0
// (dim % 32 == 0) row at element off to f32, exactly.
BD_AVX512 static inline void bd_kvq_row512(const void *base, int kvt, int64_t off, float *dst, int64_t dim) {
    if (kvt == BD_KV_F16) {
        for (int64_t i = 0; i < dim; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + off + i))));
        return;
    }
    if (kvt == BD_KV_Q4_0) // one loop a type, the type a constant in each
        bd_kvq_blocks512(base, BD_KV_Q4_0, off, dst, dim);
    else
        bd_kvq_blocks512(base, BD_KV_Q8_0, off, dst, dim);
}

// bd_kvq_ld16 is the 16 values of an f16, Q8_0 or Q4_0 (kvt, attend.h's
// BD_KV_*) row at element off, a multiple of 16, as f32: for the block
// types one half of one block; exact.
BD_AVX512 static inline __m512 bd_kvq_ld16(const void *base, int kvt, int64_t off) {
    if (kvt == BD_KV_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + off)));
    const uint8_t *b = (const uint8_t *)base + off / 32 * BD_KV_BLOCK(kvt);
    uint16_t h;
    __builtin_memcpy(&h, b, 2);
    const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)h));
    __m512i q;
    if (kvt == BD_KV_Q4_0) { // the low nibbles are the block's first half
        q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)));
        q = _mm512_sub_epi32(_mm512_and_si512(off & 16 ? _mm512_srli_epi32(q, 4) : q, _mm512_set1_epi32(15)),
                _mm512_set1_epi32(8));
    } else {
        q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2 + (off & 16))));
    }
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), d);
}

// vec_avx512.c
void bd_exp_avx512(float *x, int64_t n);
void bd_f32_to_bf16_avx512(const float *src, uint16_t *dst, int64_t n);
void bd_silu_mul_avx512(const float *g, const float *u, float *out, int64_t n);
int bd_have_avx512(void);

#endif
