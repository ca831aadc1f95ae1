// Paged attention for many query rows at once (prefill), AVX-512.
//
// bd_paged_attention (dnnl_ops.c) hands this kernel up to 16 query rows
// (query tokens of one sequence × query heads of one kv head) and it runs
// FlashAttention's loop over tiles of 16 cache positions with the rows in
// the vector lanes: the scores of one key are S[k] = Σ_d K[k][d]·Qᵀ[d]
// (a broadcast of the key times 16 rows of Q), so the online softmax's max,
// exp and sums are all lane-wise, and PV accumulates Oᵀ[d] += V[k][d]·P[k]
// the same way. Each key and value is read once per 16 rows, where the
// per-row loop of attend_body reads it once per token. The exp is
// vec_avx512.h's; expf was a tenth of a prefill step.

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attend.h"
#include "vec_avx512.h"
#define BD_FA_KEYS 16

BD_AVX512 static inline void bf16_row(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
}

// widen_row puts the cache row at element off of a bf16, f16, Q8_0 or Q4_0
// cache in dst as f32.
BD_AVX512 static inline void widen_row(const void *base, int kvt, int64_t off, float *dst, int64_t dim) {
    if (kvt == BD_KV_BF16)
        bf16_row((const uint16_t *)base + off, dst, dim);
    else
        bd_kvq_row512(base, kvt, off, dst, dim);
}

// tile_f32 points kp[k] and vp[k] at the f32 key and value rows of cache
// position p0+k of kv head g (row: its block-table row) for k < pn, and
// past pn at position p0's (read, then masked). A bf16, f16, Q8_0 or Q4_0
// cache's rows are widened into kf and vf ([BD_FA_KEYS][dim]).
BD_AVX512 static inline void tile_f32(const void *kc, const void *vc, int kvt, const int32_t *row, int64_t p0, int64_t pn,
        int64_t g, int64_t hkv, int64_t dim, int64_t bs, float *kf, float *vf, const float **kp, const float **vp) {
    for (int64_t k = 0; k < BD_FA_KEYS; k++) {
        const int64_t p = p0 + (k < pn ? k : 0);
        const int64_t off = ((int64_t)row[p / bs] * bs + p % bs) * hkv * dim + g * dim;
        if (kvt != BD_KV_F32) {
            if (k < pn) {
                widen_row(kc, kvt, off, kf + k * dim, dim);
                widen_row(vc, kvt, off, vf + k * dim, dim);
            }
            kp[k] = kf + (k < pn ? k : 0) * dim;
            vp[k] = vf + (k < pn ? k : 0) * dim;
        } else {
            kp[k] = (const float *)kc + off;
            vp[k] = (const float *)vc + off;
        }
    }
}

// rows_softmax is the row kernels' online softmax over a tile of 16 keys
// (s[k]: key p0+k's scores, the rows in the lanes): the causal mask (and
// the tile's tail, and unused lanes: key p0+k is seen by the rows with
// p0+k < n), then s[k] becomes the weights P[k] and m, l the running max
// and sum. It returns the rescale of the output so far.
BD_AVX512 static inline __attribute__((always_inline)) __m512 rows_softmax(__m512 s[BD_FA_KEYS], __m512i n,
        int64_t p0, __m512 *m, __m512 *l) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __mmask16 valid[BD_FA_KEYS];
    __m512 mt = *m;
    for (int64_t k = 0; k < BD_FA_KEYS; k++) {
        valid[k] = _mm512_cmplt_epi32_mask(_mm512_set1_epi32((int32_t)(p0 + k)), n);
        s[k] = _mm512_mask_blend_ps(valid[k], ninf, s[k]);
        mt = _mm512_max_ps(mt, s[k]);
    }
    // Rows that have seen no key yet keep m = -inf; their c must not be
    // exp(-inf - -inf) = NaN.
    __mmask16 live = _mm512_cmp_ps_mask(mt, ninf, _CMP_NEQ_OQ);
    __m512 c = _mm512_mask_blend_ps(live, _mm512_set1_ps(1.0f), bd_exp512(_mm512_sub_ps(*m, mt)));
    __m512 sum = _mm512_mul_ps(*l, c);
    for (int64_t k = 0; k < BD_FA_KEYS; k++) {
        s[k] = _mm512_maskz_mov_ps(valid[k], bd_exp512(_mm512_sub_ps(s[k], mt)));
        sum = _mm512_add_ps(sum, s[k]);
    }
    *m = mt, *l = sum;
    return c;
}

// rows_finish writes the row kernels' rows = tn·hc outputs from Oᵀ (acc,
// [d][row]) and the softmax sums l, through row_f when out is bf16.
BD_AVX512 static inline void rows_finish(const float *acc, __m512 l, int q_bf16, int64_t rows, int64_t t0,
        int64_t h0, int64_t hc, int64_t hq, int64_t dim, float *row_f, void *out) {
    // Every used row saw at least key 0, so l > 0 there.
    float inv[16] __attribute__((aligned(64)));
    _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_mask_blend_ps(
            _mm512_cmp_ps_mask(l, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_ps(1.0f), l)));
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = t0 + r / hc, h = h0 + r % hc;
        int64_t off = (t * hq + h) * dim;
        float *o = q_bf16 ? row_f : (float *)out + off;
        for (int64_t d = 0; d < dim; d++) o[d] = acc[d * 16 + r] * inv[r];
        if (q_bf16) bd_f32_to_bf16_avx512(row_f, (uint16_t *)out + off, dim);
    }
}

// bd_attend_rows_avx512 computes rows = tn·hc query rows: tokens t0..t0+tn-1
// (all of one sequence, whose block-table row is row) × query heads
// h0..h0+hc-1 (all of kv head g); tn·hc <= 16, dim % 16 == 0 and
// dim <= BD_FA_MAXDIM. pos[t] is token t's position: it sees cache
// positions 0..pos[t]. It uses 65 KiB of stack at dim 256.
BD_AVX512 void bd_attend_rows_avx512(const void *q, int q_bf16, const void *kc, const void *vc,
        int kvt, const int32_t *row, const int32_t *pos, int64_t t0, int64_t tn,
        int64_t h0, int64_t hc, int64_t g, int64_t hq, int64_t hkv, int64_t dim, int64_t bs,
        float scale, void *out) {
    const int64_t rows = tn * hc;
    float qt[BD_FA_MAXDIM * 16] __attribute__((aligned(64)));  // Qᵀ·scale: [d][row]
    float acc[BD_FA_MAXDIM * 16] __attribute__((aligned(64))); // Oᵀ: [d][row]
    float kf[BD_FA_KEYS * BD_FA_MAXDIM] __attribute__((aligned(64)));
    float vf[BD_FA_KEYS * BD_FA_MAXDIM] __attribute__((aligned(64)));
    int32_t nv[16] __attribute__((aligned(64)));
    float row_f[BD_FA_MAXDIM] __attribute__((aligned(64))); // one row in f32
    int64_t nmax = 0;
    memset(qt, 0, (size_t)dim * 16 * sizeof(float));
    for (int64_t r = 0; r < 16; r++) {
        nv[r] = 0; // unused lanes see no key
        if (r >= rows) continue;
        int64_t t = t0 + r / hc, h = h0 + r % hc;
        nv[r] = pos[t] + 1;
        if (nv[r] > nmax) nmax = nv[r];
        int64_t off = (t * hq + h) * dim;
        const float *qr = (const float *)q + off;
        if (q_bf16) {
            bf16_row((const uint16_t *)q + off, row_f, dim);
            qr = row_f;
        }
        for (int64_t d = 0; d < dim; d++) qt[d * 16 + r] = qr[d] * scale;
    }
    for (int64_t d = 0; d < dim; d++) _mm512_store_ps(acc + d * 16, _mm512_setzero_ps());
    const __m512i n = _mm512_load_si512(nv);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 m = ninf, l = _mm512_setzero_ps();
    for (int64_t p0 = 0; p0 < nmax; p0 += BD_FA_KEYS) {
        const float *kp[BD_FA_KEYS], *vp[BD_FA_KEYS];
        tile_f32(kc, vc, kvt, row, p0, nmax - p0 < BD_FA_KEYS ? nmax - p0 : BD_FA_KEYS, g, hkv, dim, bs, kf, vf, kp, vp);
        // Scores, 8 keys at a time: 8 independent FMA chains.
        __m512 s[BD_FA_KEYS];
        for (int64_t k0 = 0; k0 < BD_FA_KEYS; k0 += 8) {
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            const float *k_0 = kp[k0], *k_1 = kp[k0 + 1], *k_2 = kp[k0 + 2], *k_3 = kp[k0 + 3];
            const float *k_4 = kp[k0 + 4], *k_5 = kp[k0 + 5], *k_6 = kp[k0 + 6], *k_7 = kp[k0 + 7];
            for (int64_t d = 0; d < dim; d++) {
                __m512 x = _mm512_load_ps(qt + d * 16);
                a0 = _mm512_fmadd_ps(_mm512_set1_ps(k_0[d]), x, a0);
                a1 = _mm512_fmadd_ps(_mm512_set1_ps(k_1[d]), x, a1);
                a2 = _mm512_fmadd_ps(_mm512_set1_ps(k_2[d]), x, a2);
                a3 = _mm512_fmadd_ps(_mm512_set1_ps(k_3[d]), x, a3);
                a4 = _mm512_fmadd_ps(_mm512_set1_ps(k_4[d]), x, a4);
                a5 = _mm512_fmadd_ps(_mm512_set1_ps(k_5[d]), x, a5);
                a6 = _mm512_fmadd_ps(_mm512_set1_ps(k_6[d]), x, a6);
                a7 = _mm512_fmadd_ps(_mm512_set1_ps(k_7[d]), x, a7);
            }
            s[k0] = a0, s[k0 + 1] = a1, s[k0 + 2] = a2, s[k0 + 3] = a3;
            s[k0 + 4] = a4, s[k0 + 5] = a5, s[k0 + 6] = a6, s[k0 + 7] = a7;
        }
        const __m512 c = rows_softmax(s, n, p0, &m, &l);
        // Oᵀ[d] = Oᵀ[d]·c + Σ_k V[k][d]·P[k], 8 dims at a time.
        for (int64_t d = 0; d < dim; d += 8) {
            __m512 o0 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 0) * 16), c);
            __m512 o1 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 1) * 16), c);
            __m512 o2 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 2) * 16), c);
            __m512 o3 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 3) * 16), c);
            __m512 o4 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 4) * 16), c);
            __m512 o5 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 5) * 16), c);
            __m512 o6 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 6) * 16), c);
            __m512 o7 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 7) * 16), c);
            for (int64_t k = 0; k < BD_FA_KEYS; k++) {
                const float *v = vp[k] + d;
                o0 = _mm512_fmadd_ps(_mm512_set1_ps(v[0]), s[k], o0);
                o1 = _mm512_fmadd_ps(_mm512_set1_ps(v[1]), s[k], o1);
                o2 = _mm512_fmadd_ps(_mm512_set1_ps(v[2]), s[k], o2);
                o3 = _mm512_fmadd_ps(_mm512_set1_ps(v[3]), s[k], o3);
                o4 = _mm512_fmadd_ps(_mm512_set1_ps(v[4]), s[k], o4);
                o5 = _mm512_fmadd_ps(_mm512_set1_ps(v[5]), s[k], o5);
                o6 = _mm512_fmadd_ps(_mm512_set1_ps(v[6]), s[k], o6);
                o7 = _mm512_fmadd_ps(_mm512_set1_ps(v[7]), s[k], o7);
            }
            _mm512_store_ps(acc + (d + 0) * 16, o0);
            _mm512_store_ps(acc + (d + 1) * 16, o1);
            _mm512_store_ps(acc + (d + 2) * 16, o2);
            _mm512_store_ps(acc + (d + 3) * 16, o3);
            _mm512_store_ps(acc + (d + 4) * 16, o4);
            _mm512_store_ps(acc + (d + 5) * 16, o5);
            _mm512_store_ps(acc + (d + 6) * 16, o6);
            _mm512_store_ps(acc + (d + 7) * 16, o7);
        }
    }
    rows_finish(acc, l, q_bf16, rows, t0, h0, hc, hq, dim, row_f, out);
}

// reduce16 returns the vector whose lane i is the sum of v[i]'s 16 lanes:
// pairs, then quads within each 128-bit lane, then across the four lanes.
BD_AVX512 static inline __m512 reduce16(const __m512 v[16]) {
    __m512 a[8], b[4];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    // b[i]'s 128-bit lane L: partial sums (over lane L) of v[4i..4i+3].
    const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], _MM_SHUFFLE(2, 0, 2, 0)),
            _mm512_shuffle_f32x4(b[0], b[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], _MM_SHUFFLE(2, 0, 2, 0)),
            _mm512_shuffle_f32x4(b[2], b[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, _MM_SHUFFLE(2, 0, 2, 0)),
            _mm512_shuffle_f32x4(d0, d1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// group_softmax is the group kernels' online softmax over a tile: every
// head's at once (sv[j]: head j's scores, the keys in the lanes, valid the
// tile's keys), the rescales in one exp. sv[j] becomes head j's weights,
// mx and l its running max and sum, cs[j] the rescale of its output so
// far.
BD_AVX512 static inline __attribute__((always_inline)) void group_softmax(__m512 *sv, int64_t group,
        __mmask16 valid, float *mx, float *l, float *cs) {
    float mnew[16] __attribute__((aligned(64)));
    for (int64_t j = 0; j < group; j++) {
        const float r = _mm512_reduce_max_ps(sv[j]);
        mnew[j] = mx[j] > r ? mx[j] : r; // finite: key p0 is valid
    }
    const __mmask16 gm = (__mmask16)((1u << group) - 1);
    _mm512_store_ps(cs, bd_exp512(_mm512_maskz_sub_ps(gm, _mm512_maskz_loadu_ps(gm, mx), _mm512_maskz_loadu_ps(gm, mnew))));
    for (int64_t j = 0; j < group; j++) {
        sv[j] = _mm512_maskz_mov_ps(valid, bd_exp512(_mm512_sub_ps(sv[j], _mm512_set1_ps(mnew[j]))));
        l[j] = l[j] * cs[j] + _mm512_reduce_add_ps(sv[j]);
        mx[j] = mnew[j];
    }
}

// bd_attend_group_avx512 is attend_body's decode case with the head
// dimension in the lanes: token ti's group query heads (at most
// BD_FA_GROUP) of kv head g over the n cache positions its block-table row
// maps, dim % 16 == 0 and dim <= BD_FA_GROUPDIM. Per tile of 16 keys each
// head's 16 dot products are 16 vectors of partial sums reduced together
// (reduce16), the online softmax runs once per tile with the keys in the
// lanes, and each value row is read once for the group. The row kernel
// above would leave 16 - group of its lanes idle on a decode step, and
// attend_body reduces every dot product on its own.
//
// Per tile, every head's scores come first, then every head's softmax
// (the rescale factors of all heads in one exp), then the values: the
// heads' dependency chains overlap instead of running one after another,
// and the body is compiled once per group size so the loops over heads
// unroll with the outputs in registers. One thread, one token over 512
// positions: 57 -> 37 ns a key per kv head at Qwen2.5-0.5B's heads (14/2
// × 64), 37 -> 27 at Llama 3.2 1B's (bench/RESULTS.md).
BD_AVX512 static inline __attribute__((always_inline)) void attend_group_part(const void *q, int q_bf16, const void *kc, const void *vc,
        int kvt, const int32_t *row, int64_t p_begin, int64_t p_end, int64_t ti, int64_t g, int64_t hq,
        int64_t hkv, int64_t dim, int64_t bs, int64_t group, float scale, float *st) {
    const int64_t nc = dim / 16, h0 = g * group;
    float qs[BD_FA_GROUP * BD_FA_GROUPDIM] __attribute__((aligned(64)));  // Q·scale, [head][d]
    float acc[BD_FA_GROUP * BD_FA_GROUPDIM] __attribute__((aligned(64))); // O, [head][d]
    float kf[BD_FA_KEYS * BD_FA_GROUPDIM] __attribute__((aligned(64)));
    float vf[BD_FA_KEYS * BD_FA_GROUPDIM] __attribute__((aligned(64)));
    float pr[BD_FA_GROUP][BD_FA_KEYS] __attribute__((aligned(64))); // a tile's weights
    float mx[16] __attribute__((aligned(64))), l[BD_FA_GROUP];
    for (int64_t j = 0; j < group; j++) {
        const int64_t off = (ti * hq + h0 + j) * dim;
        if (q_bf16)
            bf16_row((const uint16_t *)q + off, qs + j * dim, dim);
        else
            memcpy(qs + j * dim, (const float *)q + off, (size_t)dim * sizeof(float));
        for (int64_t d = 0; d < dim; d += 16)
            _mm512_store_ps(qs + j * dim + d, _mm512_mul_ps(_mm512_load_ps(qs + j * dim + d), _mm512_set1_ps(scale)));
        mx[j] = -INFINITY, l[j] = 0.0f;
    }
    memset(acc, 0, (size_t)(group * dim) * sizeof(float));
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t p0 = p_begin; p0 < p_end; p0 += BD_FA_KEYS) {
        const int64_t pn = p_end - p0 < BD_FA_KEYS ? p_end - p0 : BD_FA_KEYS;
        const __mmask16 valid = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32((int32_t)pn));
        const float *kp[BD_FA_KEYS], *vp[BD_FA_KEYS];
        tile_f32(kc, vc, kvt, row, p0, pn, g, hkv, dim, bs, kf, vf, kp, vp);
        __m512 sv[BD_FA_GROUP];
        for (int64_t j = 0; j < group; j++) {
            __m512 t[BD_FA_KEYS];
            for (int k = 0; k < BD_FA_KEYS; k++) t[k] = _mm512_setzero_ps();
            for (int64_t c = 0; c < nc; c++) {
                const __m512 qv = _mm512_load_ps(qs + j * dim + 16 * c);
                for (int k = 0; k < BD_FA_KEYS; k++) t[k] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kp[k] + 16 * c), t[k]);
            }
            sv[j] = _mm512_mask_blend_ps(valid, ninf, reduce16(t));
        }
        float cs[16] __attribute__((aligned(64)));
        group_softmax(sv, group, valid, mx, l, cs);
        for (int64_t j = 0; j < group; j++) _mm512_store_ps(pr[j], sv[j]);
        // O[j] = O[j]·c[j] + Σ_k P[j][k]·V[k], each value row once for the group.
        for (int64_t c = 0; c < nc; c++) {
            __m512 o[BD_FA_GROUP];
            for (int64_t j = 0; j < group; j++) o[j] = _mm512_mul_ps(_mm512_load_ps(acc + j * dim + 16 * c), _mm512_set1_ps(cs[j]));
            for (int64_t k = 0; k < pn; k++) {
                const __m512 v = _mm512_loadu_ps(vp[k] + 16 * c);
                for (int64_t j = 0; j < group; j++) o[j] = _mm512_fmadd_ps(_mm512_set1_ps(pr[j][k]), v, o[j]);
            }
            for (int64_t j = 0; j < group; j++) _mm512_store_ps(acc + j * dim + 16 * c, o[j]);
        }
    }
    // The state: each head's unnormalised output, then its max and sum.
    const int64_t sw = dim + 2;
    for (int64_t j = 0; j < group; j++) {
        memcpy(st + j * sw, acc + j * dim, (size_t)dim * sizeof(float));
        st[j * sw + dim] = mx[j], st[j * sw + dim + 1] = l[j];
    }
}

// bd_attend_group_part_avx512 is the group kernel over cache positions
// p_begin..p_end-1 of token ti (at least one), leaving the online
// softmax's state in st ([group][dim + 2]: each head's unnormalised
// output, its running max and its sum) for bd_attend_group_merge and
// _finish.
BD_AVX512 void bd_attend_group_part_avx512(const void *q, int q_bf16, const void *kc, const void *vc,
        int kvt, const int32_t *row, int64_t p_begin, int64_t p_end, int64_t ti, int64_t g, int64_t hq,
        int64_t hkv, int64_t dim, int64_t bs, int64_t group, float scale, float *st) {
#define BD_G(G)                                                                                                \
    case G:                                                                                                    \
        attend_group_part(q, q_bf16, kc, vc, kvt, row, p_begin, p_end, ti, g, hq, hkv, dim, bs, G, scale, st); \
        return;
    switch (group) {
        BD_G(1) BD_G(2) BD_G(3) BD_G(4) BD_G(5) BD_G(6) BD_G(7) BD_G(8)
    default: // not a group the callers pass (at most BD_FA_GROUP)
        attend_group_part(q, q_bf16, kc, vc, kvt, row, p_begin, p_end, ti, g, hq, hkv, dim, bs, group, scale, st);
    }
#undef BD_G
}

// bd_attend_group_merge folds the state of the next part into st, as
// the online softmax folds a tile: max, then both sides rescaled to it.
BD_AVX512 void bd_attend_group_merge(float *st, const float *part, int64_t group, int64_t dim) {
    const int64_t sw = dim + 2;
    for (int64_t j = 0; j < group; j++) {
        float *s = st + j * sw;
        const float *p = part + j * sw;
        const float m = s[dim] > p[dim] ? s[dim] : p[dim];
        const __m512 e = bd_exp512(_mm512_setr_ps(s[dim] - m, p[dim] - m, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
        float ab[16] __attribute__((aligned(64)));
        _mm512_store_ps(ab, e);
        const __m512 a = _mm512_set1_ps(ab[0]), b = _mm512_set1_ps(ab[1]);
        for (int64_t d = 0; d < dim; d += 16)
            _mm512_storeu_ps(s + d, _mm512_fmadd_ps(_mm512_loadu_ps(p + d), b, _mm512_mul_ps(_mm512_loadu_ps(s + d), a)));
        s[dim] = m, s[dim + 1] = s[dim + 1] * ab[0] + p[dim + 1] * ab[1];
    }
}

// bd_attend_group_finish writes the heads' outputs from a state: each
// divided by its sum (at least 1: the max key weighs 1).
BD_AVX512 void bd_attend_group_finish(const float *st, int q_bf16, int64_t ti, int64_t g, int64_t hq, int64_t dim,
        int64_t group, void *out) {
    const int64_t sw = dim + 2, h0 = g * group;
    float o[BD_FA_GROUPDIM] __attribute__((aligned(64)));
    for (int64_t j = 0; j < group; j++) {
        const int64_t off = (ti * hq + h0 + j) * dim;
        const __m512 inv = _mm512_set1_ps(1.0f / st[j * sw + dim + 1]);
        for (int64_t d = 0; d < dim; d += 16) _mm512_store_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(st + j * sw + d), inv));
        if (q_bf16)
            bd_f32_to_bf16_avx512(o, (uint16_t *)out + off, dim);
        else
            memcpy((float *)out + off, o, (size_t)dim * sizeof(float));
    }
}

// attend_group_whole runs a decode token's n positions through part in
// parts of BD_FA_PART, each merged into the state of those before it in
// order, then writes the heads' outputs.
BD_AVX512 static void attend_group_whole(bd_attend_part_fn part, const void *q, int q_bf16, const void *kc,
        const void *vc, int kvt, const int32_t *row, int64_t n, int64_t ti, int64_t g, int64_t hq, int64_t hkv,
        int64_t dim, int64_t bs, int64_t group, float scale, void *out) {
    float st[BD_FA_GROUP * (BD_FA_GROUPDIM + 2)], part_st[BD_FA_GROUP * (BD_FA_GROUPDIM + 2)];
    part(q, q_bf16, kc, vc, kvt, row, 0, n < BD_FA_PART ? n : BD_FA_PART, ti, g, hq, hkv, dim, bs, group, scale, st);
    for (int64_t p = BD_FA_PART; p < n; p += BD_FA_PART) {
        part(q, q_bf16, kc, vc, kvt, row, p, n - p < BD_FA_PART ? n : p + BD_FA_PART, ti, g, hq, hkv, dim, bs,
                group, scale, part_st);
        bd_attend_group_merge(st, part_st, group, dim);
    }
    bd_attend_group_finish(st, q_bf16, ti, g, hq, dim, group, out);
}

// bd_attend_group_avx512 is the whole decode token: its n positions in
// parts of BD_FA_PART, each merged into the state of those before it in
// order, as bd_paged_attention merges them when it spreads a long
// context's parts over threads, so a token's result does not depend on
// how its step was split.
BD_AVX512 void bd_attend_group_avx512(const void *q, int q_bf16, const void *kc, const void *vc,
        int kvt, const int32_t *row, int64_t n, int64_t ti, int64_t g, int64_t hq, int64_t hkv,
        int64_t dim, int64_t bs, int64_t group, float scale, void *out) {
    attend_group_whole(bd_attend_group_part_avx512, q, q_bf16, kc, vc, kvt, row, n, ti, g, hq, hkv, dim, bs, group,
            scale, out);
}

// The group kernel for a bf16 cache with bf16 products
// (runtime.Op.BF16Products), on AVX512-BF16: Q·scale and the softmax's
// weights are rounded to bf16 and both products run on vdpbf16ps, two
// products a lane, straight from the cache's bf16 rows. The f32 kernel
// above spends as much on widening each key and value row to f32 as on
// its FMAs. Q·K pairs adjacent dimensions of a key row as the cache holds
// them. P·V pairs two keys: their value rows interleaved by 16-bit
// unpacks, whose lane order (dims 8L..8L+3 in the low half of 128-bit
// lane L, 8L+4..8L+7 in the high) the state undoes once at the end. dim %
// 32 == 0, dim <= BD_FA_GROUPDIM, group <= BD_FA_GROUP.
#define BD_AB16 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,avx2,fma")))

BD_AB16 static inline __attribute__((always_inline)) void kvq_bf16_blocks(const void *base, int kvt, int64_t off,
        uint16_t *dst, int64_t dim) {
    const int64_t bb = BD_KV_BLOCK(kvt);
    const uint8_t *src = (const uint8_t *)base + off / 32 * bb;
    for (int64_t b = 0; b < dim / 32; b++, src += bb) {
        __m512 lo, hi;
        bd_kvq_block512(src, kvt, &lo, &hi);
        _mm512_store_si512(dst + 32 * b, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

// kvq_bf16_row puts the f16, Q8_0 or Q4_0 (kvt) cache row at element off
// in dst as bf16: the values (exact in f32) rounded to nearest even, as
// the bf16 products round an f32 cache's rows. The bf16 kernels read such
// a cache's tile so.
BD_AB16 static inline void kvq_bf16_row(const void *base, int kvt, int64_t off, uint16_t *dst, int64_t dim) {
    if (kvt == BD_KV_F16) {
        for (int64_t i = 0; i < dim; i += 32)
            _mm512_store_si512(dst + i, (__m512i)_mm512_cvtne2ps_pbh(bd_kvq_ld16(base, kvt, off + i + 16),
                                                                     bd_kvq_ld16(base, kvt, off + i)));
        return;
    }
    if (kvt == BD_KV_Q4_0) // one loop a type, the type a constant in each
        kvq_bf16_blocks(base, BD_KV_Q4_0, off, dst, dim);
    else
        kvq_bf16_blocks(base, BD_KV_Q8_0, off, dst, dim);
}

// tile_bf16 is tile_f32 for the bf16 kernels: a bf16 cache's rows read in
// place, an f16, Q8_0 or Q4_0 cache's rounded into kb and vb; past pn, K at position p0's
// (read, then masked) and V at zeros (its weight is 0, and it may pair with
// the last key).
BD_AB16 static inline void tile_bf16(const void *kc, const void *vc, int kvt, const int32_t *row, int64_t p0, int64_t pn,
        int64_t g, int64_t hkv, int64_t dim, int64_t bs, uint16_t *kb, uint16_t *vb, const uint16_t *zero,
        const uint16_t **kp, const uint16_t **vp) {
    for (int64_t k = 0; k < BD_FA_KEYS; k++) {
        const int64_t p = p0 + (k < pn ? k : 0);
        const int64_t off = ((int64_t)row[p / bs] * bs + p % bs) * hkv * dim + g * dim;
        if (kvt != BD_KV_BF16) {
            if (k < pn) {
                kvq_bf16_row(kc, kvt, off, kb + k * dim, dim);
                kvq_bf16_row(vc, kvt, off, vb + k * dim, dim);
            }
            kp[k] = kb + (k < pn ? k : 0) * dim;
            vp[k] = k < pn ? vb + k * dim : zero;
        } else {
            kp[k] = (const uint16_t *)kc + off;
            vp[k] = k < pn ? (const uint16_t *)vc + off : zero;
        }
    }
}

BD_AB16 static inline __attribute__((always_inline)) void attend_group_part_bf16(const void *q, int q_bf16,
        const void *kc, const void *vc, int kvt, const int32_t *row, int64_t p_begin, int64_t p_end, int64_t ti, int64_t g,
        int64_t hq, int64_t hkv, int64_t dim, int64_t bs, int64_t group, float scale, float *st) {
    const int64_t nc = dim / 32, h0 = g * group;
    static const uint16_t zero[BD_FA_GROUPDIM] __attribute__((aligned(64)));
    uint16_t kb[BD_FA_KEYS * BD_FA_GROUPDIM] __attribute__((aligned(64))); // a Q8_0 cache's tile in bf16
    uint16_t vb[BD_FA_KEYS * BD_FA_GROUPDIM] __attribute__((aligned(64)));
    uint16_t qb[BD_FA_GROUP * BD_FA_GROUPDIM] __attribute__((aligned(64)));   // bf16(Q·scale), [head][d]
    float acc[BD_FA_GROUP * BD_FA_GROUPDIM] __attribute__((aligned(64)));     // O, [head][chunk][lo|hi]
    uint32_t pb[BD_FA_GROUP][BD_FA_KEYS / 2] __attribute__((aligned(64)));    // bf16 weight pairs
    float mx[16] __attribute__((aligned(64))), l[BD_FA_GROUP];
    for (int64_t j = 0; j < group; j++) {
        const int64_t off = (ti * hq + h0 + j) * dim;
        for (int64_t d = 0; d < dim; d += 32) {
            __m512 a, b;
            if (q_bf16) {
                const uint16_t *s = (const uint16_t *)q + off + d;
                a = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)s)), 16));
                b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + 16))), 16));
            } else {
                a = _mm512_loadu_ps((const float *)q + off + d);
                b = _mm512_loadu_ps((const float *)q + off + d + 16);
            }
            const __m512 sc = _mm512_set1_ps(scale);
            _mm512_store_si512(qb + j * dim + d, (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(b, sc), _mm512_mul_ps(a, sc)));
        }
        mx[j] = -INFINITY, l[j] = 0.0f;
    }
    memset(acc, 0, (size_t)(group * dim) * sizeof(float));
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t p0 = p_begin; p0 < p_end; p0 += BD_FA_KEYS) {
        const int64_t pn = p_end - p0 < BD_FA_KEYS ? p_end - p0 : BD_FA_KEYS;
        const __mmask16 valid = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32((int32_t)pn));
        const uint16_t *kp[BD_FA_KEYS], *vp[BD_FA_KEYS];
        tile_bf16(kc, vc, kvt, row, p0, pn, g, hkv, dim, bs, kb, vb, zero, kp, vp);
        __m512 sv[BD_FA_GROUP];
        for (int64_t j = 0; j < group; j++) {
            __m512 t[BD_FA_KEYS];
            for (int k = 0; k < BD_FA_KEYS; k++) t[k] = _mm512_setzero_ps();
            for (int64_t c = 0; c < nc; c++) {
                const __m512bh qv = (__m512bh)_mm512_load_si512(qb + j * dim + 32 * c);
                for (int k = 0; k < BD_FA_KEYS; k++)
                    t[k] = _mm512_dpbf16_ps(t[k], qv, (__m512bh)_mm512_loadu_si512(kp[k] + 32 * c));
            }
            sv[j] = _mm512_mask_blend_ps(valid, ninf, reduce16(t));
        }
        float cs[16] __attribute__((aligned(64)));
        group_softmax(sv, group, valid, mx, l, cs);
        for (int64_t j = 0; j < group; j++) _mm256_store_si256((__m256i *)pb[j], (__m256i)_mm512_cvtneps_pbh(sv[j]));
        // O[j] = O[j]·c[j] + Σ_k P[j][k]·V[k], two keys a vdpbf16ps.
        const int64_t pairs = (pn + 1) / 2;
        for (int64_t c = 0; c < nc; c++) {
            __m512 lo[BD_FA_GROUP], hi[BD_FA_GROUP];
            for (int64_t j = 0; j < group; j++) {
                lo[j] = _mm512_mul_ps(_mm512_load_ps(acc + j * dim + 32 * c), _mm512_set1_ps(cs[j]));
                hi[j] = _mm512_mul_ps(_mm512_load_ps(acc + j * dim + 32 * c + 16), _mm512_set1_ps(cs[j]));
            }
            for (int64_t k = 0; k < pairs; k++) {
                const __m512i a = _mm512_loadu_si512(vp[2 * k] + 32 * c), b = _mm512_loadu_si512(vp[2 * k + 1] + 32 * c);
                const __m512bh vl = (__m512bh)_mm512_unpacklo_epi16(a, b), vh = (__m512bh)_mm512_unpackhi_epi16(a, b);
                for (int64_t j = 0; j < group; j++) {
                    const __m512bh w = (__m512bh)_mm512_set1_epi32((int32_t)pb[j][k]);
                    lo[j] = _mm512_dpbf16_ps(lo[j], w, vl);
                    hi[j] = _mm512_dpbf16_ps(hi[j], w, vh);
                }
            }
            for (int64_t j = 0; j < group; j++) {
                _mm512_store_ps(acc + j * dim + 32 * c, lo[j]);
                _mm512_store_ps(acc + j * dim + 32 * c + 16, hi[j]);
            }
        }
    }
    // The state in dimension order: each head's unnormalised output, then
    // its max and sum.
    const int64_t sw = dim + 2;
    const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int64_t j = 0; j < group; j++) {
        for (int64_t c = 0; c < nc; c++) {
            const __m512 lo = _mm512_load_ps(acc + j * dim + 32 * c), hi = _mm512_load_ps(acc + j * dim + 32 * c + 16);
            _mm512_storeu_ps(st + j * sw + 32 * c, _mm512_permutex2var_ps(lo, i0, hi));
            _mm512_storeu_ps(st + j * sw + 32 * c + 16, _mm512_permutex2var_ps(lo, i1, hi));
        }
        st[j * sw + dim] = mx[j], st[j * sw + dim + 1] = l[j];
    }
}

BD_AB16 void bd_attend_group_part_bf16(const void *q, int q_bf16, const void *kc, const void *vc,
        int kvt, const int32_t *row, int64_t p_begin, int64_t p_end, int64_t ti, int64_t g, int64_t hq,
        int64_t hkv, int64_t dim, int64_t bs, int64_t group, float scale, float *st) {
#define BD_G(G)                                                                                                \
    case G:                                                                                                    \
        attend_group_part_bf16(q, q_bf16, kc, vc, kvt, row, p_begin, p_end, ti, g, hq, hkv, dim, bs, G, scale, st); \
        return;
    switch (group) {
        BD_G(1) BD_G(2) BD_G(3) BD_G(4) BD_G(5) BD_G(6) BD_G(7) BD_G(8)
    default:
        attend_group_part_bf16(q, q_bf16, kc, vc, kvt, row, p_begin, p_end, ti, g, hq, hkv, dim, bs, group, scale, st);
    }
#undef BD_G
}

// bd_attend_group_bf16 is bd_attend_group_avx512 on the bf16 part kernel.
BD_AB16 void bd_attend_group_bf16(const void *q, int q_bf16, const void *kc, const void *vc,
        int kvt, const int32_t *row, int64_t n, int64_t ti, int64_t g, int64_t hq, int64_t hkv,
        int64_t dim, int64_t bs, int64_t group, float scale, void *out) {
    attend_group_whole(bd_attend_group_part_bf16, q, q_bf16, kc, vc, kvt, row, n, ti, g, hq, hkv, dim, bs, group,
            scale, out);
}

// bd_attend_rows_bf16 is bd_attend_rows_avx512 for a bf16 cache with bf16
// products (runtime.Op.BF16Products), on AVX512-BF16: a prefill chunk's
// attention where no AMX tiles take it. Qᵀ·scale is held as bf16 pairs of
// adjacent dims a lane (row), so a key's scores are dim/2 vdpbf16ps, each
// with a pair of the key's dims broadcast straight from the cache. P·V
// pairs two keys: the rows' weights of keys 2i and 2i+1 interleaved a
// lane, against each dim's pair of values broadcast from the tile's value
// rows, interleaved once a tile (in the 16-bit unpacks' lane order). Half
// the f32 kernel's multiplies, and no widening of the cache's rows.
// dim % 32 == 0, dim <= BD_FA_MAXDIM.
BD_AB16 void bd_attend_rows_bf16(const void *q, int q_bf16, const void *kc, const void *vc,
        int kvt, const int32_t *row, const int32_t *pos, int64_t t0, int64_t tn,
        int64_t h0, int64_t hc, int64_t g, int64_t hq, int64_t hkv, int64_t dim, int64_t bs,
        float scale, void *out) {
    static const uint16_t zero[BD_FA_MAXDIM] __attribute__((aligned(64)));
    uint16_t kb[BD_FA_KEYS * BD_FA_MAXDIM] __attribute__((aligned(64))); // a Q8_0 cache's tile in bf16
    uint16_t vb[BD_FA_KEYS * BD_FA_MAXDIM] __attribute__((aligned(64)));
    const int64_t rows = tn * hc, np = dim / 2;
    uint32_t qt[BD_FA_MAXDIM / 2 * 16] __attribute__((aligned(64)));  // bf16 pairs of Qᵀ·scale: [d/2][row]
    float acc[BD_FA_MAXDIM * 16] __attribute__((aligned(64)));        // Oᵀ: [d][row]
    uint32_t vt[BD_FA_KEYS / 2 * BD_FA_MAXDIM] __attribute__((aligned(64))); // [key pair][d in unpack order]
    int32_t nv[16] __attribute__((aligned(64)));
    float row_f[BD_FA_MAXDIM] __attribute__((aligned(64)));
    uint32_t pair[16] __attribute__((aligned(64)));
    int64_t nmax = 0;
    memset(qt, 0, (size_t)np * 16 * sizeof(uint32_t));
    for (int64_t r = 0; r < 16; r++) {
        nv[r] = 0; // unused lanes see no key
        if (r >= rows) continue;
        int64_t t = t0 + r / hc, h = h0 + r % hc;
        nv[r] = pos[t] + 1;
        if (nv[r] > nmax) nmax = nv[r];
        int64_t off = (t * hq + h) * dim;
        if (q_bf16)
            bf16_row((const uint16_t *)q + off, row_f, dim);
        else
            memcpy(row_f, (const float *)q + off, (size_t)dim * sizeof(float));
        const __m512 sc = _mm512_set1_ps(scale);
        for (int64_t d = 0; d < dim; d += 32) {
            _mm512_store_si512(pair, (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_load_ps(row_f + d + 16), sc),
                                                                 _mm512_mul_ps(_mm512_load_ps(row_f + d), sc)));
            for (int64_t i = 0; i < 16; i++) qt[(d / 2 + i) * 16 + r] = pair[i];
        }
    }
    for (int64_t d = 0; d < dim; d++) _mm512_store_ps(acc + d * 16, _mm512_setzero_ps());
    const __m512i n = _mm512_load_si512(nv);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    // Lane 2i of a key pair's weights is key 2i's, 2i+1 key 2i+1's.
    const __m512i ilv = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
            21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512 m = ninf, l = _mm512_setzero_ps();
    for (int64_t p0 = 0; p0 < nmax; p0 += BD_FA_KEYS) {
        const int64_t pn = nmax - p0 < BD_FA_KEYS ? nmax - p0 : BD_FA_KEYS, pairs = (pn + 1) / 2;
        const uint16_t *kp[BD_FA_KEYS], *vp[BD_FA_KEYS];
        tile_bf16(kc, vc, kvt, row, p0, pn, g, hkv, dim, bs, kb, vb, zero, kp, vp);
        // The tile's values by key pairs: within each 32 dims, dims
        // 8L..8L+3 at 4L.., 8L+4..8L+7 at 16+4L.. (L = 0..3).
        for (int64_t k = 0; k < pairs; k++)
            for (int64_t d = 0; d < dim; d += 32) {
                const __m512i a = _mm512_loadu_si512(vp[2 * k] + d), b = _mm512_loadu_si512(vp[2 * k + 1] + d);
                _mm512_store_si512(vt + k * dim + d, _mm512_unpacklo_epi16(a, b));
                _mm512_store_si512(vt + k * dim + d + 16, _mm512_unpackhi_epi16(a, b));
            }
        // Scores, 8 keys at a time: 8 independent chains.
        __m512 s[BD_FA_KEYS];
        for (int64_t k0 = 0; k0 < BD_FA_KEYS; k0 += 8) {
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            const int32_t *k_0 = (const int32_t *)kp[k0], *k_1 = (const int32_t *)kp[k0 + 1];
            const int32_t *k_2 = (const int32_t *)kp[k0 + 2], *k_3 = (const int32_t *)kp[k0 + 3];
            const int32_t *k_4 = (const int32_t *)kp[k0 + 4], *k_5 = (const int32_t *)kp[k0 + 5];
            const int32_t *k_6 = (const int32_t *)kp[k0 + 6], *k_7 = (const int32_t *)kp[k0 + 7];
#define BD_KB(P, I) ((__m512bh)_mm512_set1_epi32(P[I]))
            for (int64_t i = 0; i < np; i++) {
                const __m512bh x = (__m512bh)_mm512_load_si512(qt + i * 16);
                a0 = _mm512_dpbf16_ps(a0, x, BD_KB(k_0, i));
                a1 = _mm512_dpbf16_ps(a1, x, BD_KB(k_1, i));
                a2 = _mm512_dpbf16_ps(a2, x, BD_KB(k_2, i));
                a3 = _mm512_dpbf16_ps(a3, x, BD_KB(k_3, i));
                a4 = _mm512_dpbf16_ps(a4, x, BD_KB(k_4, i));
                a5 = _mm512_dpbf16_ps(a5, x, BD_KB(k_5, i));
                a6 = _mm512_dpbf16_ps(a6, x, BD_KB(k_6, i));
                a7 = _mm512_dpbf16_ps(a7, x, BD_KB(k_7, i));
            }
            s[k0] = a0, s[k0 + 1] = a1, s[k0 + 2] = a2, s[k0 + 3] = a3;
            s[k0 + 4] = a4, s[k0 + 5] = a5, s[k0 + 6] = a6, s[k0 + 7] = a7;
        }
        const __m512 c = rows_softmax(s, n, p0, &m, &l);
        __m512bh w[BD_FA_KEYS / 2];
        for (int64_t k = 0; k < pairs; k++)
            w[k] = (__m512bh)_mm512_permutexvar_epi16(ilv, (__m512i)_mm512_cvtne2ps_pbh(s[2 * k + 1], s[2 * k]));
        // Oᵀ[d] = Oᵀ[d]·c + Σ_k V[k][d]·P[k], 8 dims at a time, two keys a
        // product.
        for (int64_t d = 0; d < dim; d += 8) {
            const int64_t lo = (d & ~31) + (d & 31) / 8 * 4, hi = lo + 16;
            __m512 o0 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 0) * 16), c);
            __m512 o1 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 1) * 16), c);
            __m512 o2 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 2) * 16), c);
            __m512 o3 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 3) * 16), c);
            __m512 o4 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 4) * 16), c);
            __m512 o5 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 5) * 16), c);
            __m512 o6 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 6) * 16), c);
            __m512 o7 = _mm512_mul_ps(_mm512_load_ps(acc + (d + 7) * 16), c);
            for (int64_t k = 0; k < pairs; k++) {
                const int32_t *v = (const int32_t *)vt + k * dim;
                o0 = _mm512_dpbf16_ps(o0, w[k], BD_KB(v, lo + 0));
                o1 = _mm512_dpbf16_ps(o1, w[k], BD_KB(v, lo + 1));
                o2 = _mm512_dpbf16_ps(o2, w[k], BD_KB(v, lo + 2));
                o3 = _mm512_dpbf16_ps(o3, w[k], BD_KB(v, lo + 3));
                o4 = _mm512_dpbf16_ps(o4, w[k], BD_KB(v, hi + 0));
                o5 = _mm512_dpbf16_ps(o5, w[k], BD_KB(v, hi + 1));
                o6 = _mm512_dpbf16_ps(o6, w[k], BD_KB(v, hi + 2));
                o7 = _mm512_dpbf16_ps(o7, w[k], BD_KB(v, hi + 3));
            }
#undef BD_KB
            _mm512_store_ps(acc + (d + 0) * 16, o0);
            _mm512_store_ps(acc + (d + 1) * 16, o1);
            _mm512_store_ps(acc + (d + 2) * 16, o2);
            _mm512_store_ps(acc + (d + 3) * 16, o3);
            _mm512_store_ps(acc + (d + 4) * 16, o4);
            _mm512_store_ps(acc + (d + 5) * 16, o5);
            _mm512_store_ps(acc + (d + 6) * 16, o6);
            _mm512_store_ps(acc + (d + 7) * 16, o7);
        }
    }
    rows_finish(acc, l, q_bf16, rows, t0, h0, hc, hq, dim, row_f, out);
}
