// AVX-512 forms of elementwise loops that dominate a prefill step when
// compiled for baseline x86-64: exp, f32 → bf16, SiLU·up.
#include "vec_avx512.h"

int bd_have_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma");
}

// bd_exp_avx512 is exp over n floats in place (swiglu, decode attention).
BD_AVX512 void bd_exp_avx512(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, bd_exp512(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, m, bd_exp512(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

// bd_f32_to_bf16_avx512 rounds to nearest even and keeps NaNs quiet NaNs,
// bit for bit as bd_f32_to_bf16.
BD_AVX512 static inline __m256i bf16x16(__m512i u) {
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
            _mm512_set1_epi32(0x7f800000));
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q));
}

BD_AVX512 void bd_f32_to_bf16_avx512(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), bf16x16(_mm512_loadu_si512(src + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(dst + i, m, bf16x16(_mm512_maskz_loadu_epi32(m, src + i)));
    }
}

// bd_silu_mul_avx512 is out[i] = g[i]·u[i] / (1 + exp(-g[i])), SwiGLU's
// gate; out may be g.
BD_AVX512 void bd_silu_mul_avx512(const float *g, const float *u, float *out, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 e = bd_exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        __m512 e = bd_exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(m, u + i)));
    }
}
