#include "vecmath.h"

#include <immintrin.h>
#include <math.h>

#define BD_AVX2 __attribute__((target("avx2,fma")))

#define BD_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma")))

// level is the forms the CPU runs: 0 portable, 1 AVX2 + FMA, 2 AVX-512
// (F, DQ, VL) as well; -1 until first asked.
static int level = -1;

static int isa_level(void) {
    if (level < 0) {
        __builtin_cpu_init();
        level = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        if (level && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                __builtin_cpu_supports("avx512vl"))
            level = 2;
    }
    return level;
}

static int have_avx2(void) { return isa_level() >= 1; }

void bd_vm_force_level(int l) { level = l; }

// exp4's and exp8's constants: the clamp, log2 e, ln 2 in two parts, and
// the Taylor coefficients of e^r from r^12 down.
#define EXP_LO -746.0
#define EXP_HI 709.8
#define EXP_LOG2E 1.4426950408889634
#define EXP_LN2_HI 6.93147180369123816490e-01
#define EXP_LN2_LO 1.90821492927058770002e-10
static const double exp_taylor[13] = {1.0 / 479001600, 1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880, 1.0 / 40320,
        1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0};

// exp4 is exp of four doubles within 3 ulp of libm's: n = round(x·log2 e),
// r = x - n·ln 2 in two parts (|r| <= ln2/2), e^r by its Taylor series to
// r^12 (the next term is below 2^-52 of the sum), times 2^n in two factors
// so results down to the subnormals come out as exp gives them. Below
// -746 it is 0, above 709.8 infinity; NaN stays NaN.
BD_AVX2 static inline __m256d exp4(__m256d x) {
    const __m256d x0 = x;
    x = _mm256_max_pd(x, _mm256_set1_pd(EXP_LO));
    x = _mm256_min_pd(x, _mm256_set1_pd(EXP_HI));
    const __m256d n = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(EXP_LOG2E)),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(EXP_LN2_HI), x);
    r = _mm256_fnmadd_pd(n, _mm256_set1_pd(EXP_LN2_LO), r);
    __m256d p = _mm256_set1_pd(exp_taylor[0]);
    for (int i = 1; i < 13; i++) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(exp_taylor[i]));
    // 2^n as 2^n1 · 2^n2, n1 = floor(n/2): each factor is a normal double.
    const __m256d n1 = _mm256_floor_pd(_mm256_mul_pd(n, _mm256_set1_pd(0.5))), n2 = _mm256_sub_pd(n, n1);
    const __m256d magic = _mm256_set1_pd(6755399441055744.0); // 2^52 + 2^51: its low bits hold an integer added to it
    const __m256i bias = _mm256_set1_epi64x(1023);
    const __m256i e1 = _mm256_slli_epi64(_mm256_add_epi64(_mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(n1, magic)),
            _mm256_castpd_si256(magic)), bias), 52);
    const __m256i e2 = _mm256_slli_epi64(_mm256_add_epi64(_mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(n2, magic)),
            _mm256_castpd_si256(magic)), bias), 52);
    p = _mm256_mul_pd(_mm256_mul_pd(p, _mm256_castsi256_pd(e1)), _mm256_castsi256_pd(e2));
    const __m256d nan = _mm256_cmp_pd(x0, x0, _CMP_UNORD_Q);
    return _mm256_blendv_pd(p, x0, nan);
}

// exp8 is exp4 on eight doubles: the same steps, with scalef for 2^n
// (exact into the subnormals, 0 below them).
BD_AVX512 static inline __m512d exp8(__m512d x) {
    const __m512d x0 = x;
    x = _mm512_max_pd(x, _mm512_set1_pd(EXP_LO));
    x = _mm512_min_pd(x, _mm512_set1_pd(EXP_HI));
    const __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(EXP_LOG2E)),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(EXP_LN2_HI), x);
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(EXP_LN2_LO), r);
    __m512d p = _mm512_set1_pd(exp_taylor[0]);
    for (int i = 1; i < 13; i++) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(exp_taylor[i]));
    // 2^n in two factors, as exp4 does, so the rounding into the
    // subnormals is the same.
    const __m512d n1 = _mm512_roundscale_pd(_mm512_mul_pd(n, _mm512_set1_pd(0.5)), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    p = _mm512_scalef_pd(_mm512_scalef_pd(p, n1), _mm512_sub_pd(n, n1));
    const __mmask8 nan = _mm512_cmp_pd_mask(x0, x0, _CMP_UNORD_Q);
    return _mm512_mask_mov_pd(p, nan, x0);
}

// The scalar scan's answer from the first index of the largest non-NaN
// value: a NaN x[0] wins, as nothing compares above it.
#define ARGMAX_BODY(T)                                                        \
    int64_t best = 0;                                                         \
    for (int64_t i = 0; i < n; i++)                                           \
        if (x[i] > x[best]) best = i;                                         \
    return best;

static int64_t argmax_f32_scalar(const float *x, int64_t n) { ARGMAX_BODY(float) }
static int64_t argmax_f64_scalar(const double *x, int64_t n) { ARGMAX_BODY(double) }

// Eight running maxima of the non-NaN values (a NaN lane loads as -inf),
// then the first index holding the largest.
BD_AVX2 static int64_t argmax_f32_avx2(const float *x, int64_t n) {
    if (x[0] != x[0]) return 0;
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 m0 = ninf, m1 = ninf;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        // max_ps returns its second operand when either is NaN.
        m0 = _mm256_max_ps(a, m0);
        m1 = _mm256_max_ps(b, m1);
    }
    m0 = _mm256_max_ps(m0, m1);
    float lanes[8], m = -INFINITY;
    _mm256_storeu_ps(lanes, m0);
    for (int l = 0; l < 8; l++)
        if (lanes[l] > m) m = lanes[l];
    for (; i < n; i++)
        if (x[i] > m) m = x[i];
    if (m == -INFINITY) return argmax_f32_scalar(x, n); // all -inf or NaN: the scan's rules
    const __m256 mv = _mm256_set1_ps(m);
    for (i = 0; i + 8 <= n; i += 8) {
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), mv, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz(hit);
    }
    for (; i < n; i++)
        if (x[i] == m) return i;
    return 0; // not reached
}

BD_AVX2 static int64_t argmax_f64_avx2(const double *x, int64_t n) {
    if (x[0] != x[0]) return 0;
    const __m256d ninf = _mm256_set1_pd(-INFINITY);
    __m256d m0 = ninf, m1 = ninf;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        m0 = _mm256_max_pd(_mm256_loadu_pd(x + i), m0);
        m1 = _mm256_max_pd(_mm256_loadu_pd(x + i + 4), m1);
    }
    m0 = _mm256_max_pd(m0, m1);
    double lanes[4], m = -INFINITY;
    _mm256_storeu_pd(lanes, m0);
    for (int l = 0; l < 4; l++)
        if (lanes[l] > m) m = lanes[l];
    for (; i < n; i++)
        if (x[i] > m) m = x[i];
    if (m == -INFINITY) return argmax_f64_scalar(x, n);
    const __m256d mv = _mm256_set1_pd(m);
    for (i = 0; i + 4 <= n; i += 4) {
        int hit = _mm256_movemask_pd(_mm256_cmp_pd(_mm256_loadu_pd(x + i), mv, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz(hit);
    }
    for (; i < n; i++)
        if (x[i] == m) return i;
    return 0;
}

int64_t bd_vm_argmax_f32(const float *x, int64_t n) {
    return have_avx2() ? argmax_f32_avx2(x, n) : argmax_f32_scalar(x, n);
}

int64_t bd_vm_argmax_f64(const double *x, int64_t n) {
    return have_avx2() ? argmax_f64_avx2(x, n) : argmax_f64_scalar(x, n);
}

BD_AVX2 static double exp_weights_avx2(double *x, int64_t n, double m, double t, double min_p, int32_t *idx,
        int64_t *count) {
    const __m256d mv = _mm256_set1_pd(m), tv = _mm256_set1_pd(t), pv = _mm256_set1_pd(min_p),
                  zero = _mm256_setzero_pd();
    __m256d s0 = zero;
    int64_t c = 0, i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m256d p = exp4(_mm256_div_pd(_mm256_sub_pd(_mm256_loadu_pd(x + i), mv), tv));
        _mm256_storeu_pd(x + i, p);
        const __m256d keep = _mm256_and_pd(_mm256_cmp_pd(p, pv, _CMP_GE_OQ), _mm256_cmp_pd(p, zero, _CMP_GT_OQ));
        s0 = _mm256_add_pd(s0, _mm256_and_pd(p, keep));
        const int bits = _mm256_movemask_pd(keep);
        if (bits == 15) { // all four: the common case without min-p
            _mm_storeu_si128((__m128i *)(idx + c), _mm_add_epi32(_mm_set1_epi32((int32_t)i), _mm_setr_epi32(0, 1, 2, 3)));
            c += 4;
        } else {
            for (int b = bits; b; b &= b - 1) idx[c++] = (int32_t)(i + __builtin_ctz(b));
        }
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, s0);
    double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; i++) {
        double z[4] = {(x[i] - m) / t, 0, 0, 0}, p[4];
        _mm256_storeu_pd(p, exp4(_mm256_loadu_pd(z)));
        x[i] = p[0];
        if (p[0] >= min_p && p[0] > 0) {
            idx[c++] = (int32_t)i;
            sum += p[0];
        }
    }
    *count = c;
    return sum;
}

BD_AVX512 static double exp_weights_avx512(double *x, int64_t n, double m, double t, double min_p, int32_t *idx,
        int64_t *count) {
    const __m512d mv = _mm512_set1_pd(m), tv = _mm512_set1_pd(t), pv = _mm512_set1_pd(min_p), zero = _mm512_setzero_pd();
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m512d s0 = zero;
    int64_t c = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m512d p = exp8(_mm512_div_pd(_mm512_sub_pd(_mm512_loadu_pd(x + i), mv), tv));
        _mm512_storeu_pd(x + i, p);
        const __mmask8 keep = _mm512_cmp_pd_mask(p, pv, _CMP_GE_OQ) & _mm512_cmp_pd_mask(p, zero, _CMP_GT_OQ);
        s0 = _mm512_mask_add_pd(s0, keep, s0, p);
        _mm256_mask_compressstoreu_epi32(idx + c, keep, _mm256_add_epi32(_mm256_set1_epi32((int32_t)i), iota));
        c += __builtin_popcount(keep);
    }
    double sum = _mm512_reduce_add_pd(s0);
    if (i < n) {
        const __mmask8 tail = (__mmask8)((1u << (n - i)) - 1);
        const __m512d p = exp8(_mm512_div_pd(_mm512_sub_pd(_mm512_maskz_loadu_pd(tail, x + i), mv), tv));
        _mm512_mask_storeu_pd(x + i, tail, p);
        const __mmask8 keep = tail & _mm512_cmp_pd_mask(p, pv, _CMP_GE_OQ) & _mm512_cmp_pd_mask(p, zero, _CMP_GT_OQ);
        sum += _mm512_reduce_add_pd(_mm512_maskz_mov_pd(keep, p));
        _mm256_mask_compressstoreu_epi32(idx + c, keep, _mm256_add_epi32(_mm256_set1_epi32((int32_t)i), iota));
        c += __builtin_popcount(keep);
    }
    *count = c;
    return sum;
}

static double exp_weights_scalar(double *x, int64_t n, double m, double t, double min_p, int32_t *idx,
        int64_t *count) {
    double sum = 0;
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) {
        const double p = exp((x[i] - m) / t);
        x[i] = p;
        if (p >= min_p && p > 0) {
            idx[c++] = (int32_t)i;
            sum += p;
        }
    }
    *count = c;
    return sum;
}

double bd_vm_exp_weights(double *x, int64_t n, double m, double t, double min_p, int32_t *idx, int64_t *count) {
    switch (isa_level()) {
    case 2: return exp_weights_avx512(x, n, m, t, min_p, idx, count);
    case 1: return exp_weights_avx2(x, n, m, t, min_p, idx, count);
    }
    return exp_weights_scalar(x, n, m, t, min_p, idx, count);
}

BD_AVX2 static double logsumexp_f32_avx2(const float *x, int64_t n) {
    // The largest value, NaN if any is NaN (max_ps drops a NaN first operand).
    __m256 mx = _mm256_set1_ps(-INFINITY), bad = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        mx = _mm256_max_ps(v, mx);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float lanes[8], m = -INFINITY;
    _mm256_storeu_ps(lanes, mx);
    for (int l = 0; l < 8; l++)
        if (lanes[l] > m) m = lanes[l];
    int nan = _mm256_movemask_ps(bad) != 0;
    for (int64_t j = i; j < n; j++) {
        if (x[j] != x[j]) nan = 1;
        if (x[j] > m) m = x[j];
    }
    if (nan) return NAN;
    const __m256d mv = _mm256_set1_pd((double)m);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0;
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        s0 = _mm256_add_pd(s0, exp4(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), mv)));
        s1 = _mm256_add_pd(s1, exp4(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), mv)));
    }
    double d[4];
    _mm256_storeu_pd(d, _mm256_add_pd(s0, s1));
    double sum = (d[0] + d[1]) + (d[2] + d[3]);
    for (; i < n; i++) {
        double z[4] = {(double)x[i] - m, 0, 0, 0}, p[4];
        _mm256_storeu_pd(p, exp4(_mm256_loadu_pd(z)));
        sum += p[0];
    }
    return (double)m + log(sum);
}

BD_AVX512 static double logsumexp_f32_avx512(const float *x, int64_t n) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    __mmask16 bad = 0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        mx = _mm512_max_ps(v, mx);
        bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    if (i < n) {
        const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail, x + i);
        mx = _mm512_max_ps(v, mx);
        bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    if (bad) return NAN;
    const float m = _mm512_reduce_max_ps(mx);
    const __m512d mv = _mm512_set1_pd((double)m);
    __m512d s0 = _mm512_setzero_pd(), s1 = s0;
    for (i = 0; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        s0 = _mm512_add_pd(s0, exp8(_mm512_sub_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)), mv)));
        s1 = _mm512_add_pd(s1, exp8(_mm512_sub_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)), mv)));
    }
    double sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    for (; i < n; i++) {
        double z[8] = {(double)x[i] - m, 0, 0, 0, 0, 0, 0, 0}, p[8];
        _mm512_storeu_pd(p, exp8(_mm512_loadu_pd(z)));
        sum += p[0];
    }
    return (double)m + log(sum);
}

static double logsumexp_f32_scalar(const float *x, int64_t n) {
    float m = x[0];
    for (int64_t i = 0; i < n; i++) {
        if (x[i] != x[i]) return NAN;
        if (x[i] > m) m = x[i];
    }
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += exp((double)x[i] - m);
    return (double)m + log(sum);
}

double bd_vm_logsumexp_f32(const float *x, int64_t n) {
    switch (isa_level()) {
    case 2: return logsumexp_f32_avx512(x, n);
    case 1: return logsumexp_f32_avx2(x, n);
    }
    return logsumexp_f32_scalar(x, n);
}

int bd_vm_level(void) { return isa_level(); }
