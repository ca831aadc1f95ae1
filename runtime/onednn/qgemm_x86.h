// The 256-bit half of qgemm.c, included by it once per x86 variant under a
// #pragma GCC target: QV(name) gives each inclusion its own names, QV_R is
// the most rows of X one pass over a weight row carries (their
// accumulators stay in registers), QV_VNNI selects AVX512-VNNI's
// dpbusd/dpwssd over AVX2's maddubs/madd, and QV_NO_KERNELS leaves the
// kernels out (the AVX-512 variant has qgemm_avx512.h's and uses only the
// quantizers and helpers here). Not a header to include elsewhere; see
// qgemm.c for the layouts.

#define QI static inline __attribute__((always_inline))

// acc += per 32-bit lane, the sum of four u8 * s8 products.
QI __m256i QV(dot)(__m256i acc, __m256i u, __m256i s) {
#ifdef QV_VNNI
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    // maddubs adds pairs in int16 with saturation: no pair here reaches
    // it (u <= 63, or |w| <= 128 against |x| <= 127: 2*128*127 < 32768).
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// acc += per 32-bit lane, (u0*s0 + u1*s1)*sc + (u2*s2 + u3*s3)*sc' with the
// int16 scale of each pair's lane.
QI __m256i QV(dot_sc)(__m256i acc, __m256i u, __m256i s, __m256i sc) {
    const __m256i p = _mm256_maddubs_epi16(u, s);
#ifdef QV_VNNI
    return _mm256_dpwssd_epi32(acc, p, sc);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
#endif
}

QI float QV(hsum)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

QI int32_t QV(hsum_i)(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

QI float QV(hmax)(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

QI float QV(h2f)(const uint8_t *p) { return _cvtsh_ss(le16(p)); }

// The f16s in the low halves of 8 dwords, as f32.
QI __m256 QV(halves8)(__m256i g) {
#ifdef QV_VNNI
    return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(g));
#else
    const __m256i p = _mm256_shuffle_epi8(g, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
            0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08)));
#endif
}

// 32 consecutive int32 (four vectors) to int8, in order.
QI __m256i QV(pack8)(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Whether any of the 32 floats at x is infinite or NaN; *amax gets the
// largest magnitude otherwise. v receives the four vectors.
QI int QV(absmax32)(const float *x, __m256 v[4], __m256 *mx) {
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
    __m256 bad = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        const __m256 a = _mm256_andnot_ps(sign, v[i]);
        *mx = _mm256_max_ps(*mx, a);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));
    }
    return _mm256_movemask_ps(bad);
}


// Quantizes 32 floats into q; returns d (NaN, with zeros in q, for a block
// holding an infinity or NaN) and the sum of q in *sum.
QI float QV(quant32)(const float *x, int8_t *q, int32_t *sum) {
    __m256 v[4], mx = _mm256_setzero_ps();
    if (QV(absmax32)(x, v, &mx)) {
        memset(q, 0, 32);
        *sum = 0;
        return NAN;
    }
    const float amax = QV(hmax)(mx);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i i[4];
    for (int j = 0; j < 4; j++) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], vid));
    *sum = QV(hsum_i)(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])));
    _mm256_storeu_si256((__m256i *)q, QV(pack8)(i[0], i[1], i[2], i[3]));
    return amax / 127.0f;
}

// R rows of k = 32*nb activations (row stride k) into a group of the a32
// layout with G rows (see qgemm.c).
static void QV(quant_a32)(const float *x, int64_t k, int64_t nb, int R, int64_t G, uint8_t *xg) {
    for (int r = 0; r < R; r++) {
        float *dd = (float *)(xg + A32_D(nb, r, G)), *ss = (float *)(xg + A32_S(nb, r, G));
        for (int64_t b = 0; b < nb; b++) {
            int32_t sum;
            const float d = QV(quant32)(x + r * k + 32 * b, (int8_t *)(xg + A32_Q(b, r, G)), &sum);
            dd[b] = d;
            ss[b] = d * (float)sum;
        }
        for (int64_t b = nb; b < A32_NBP(nb); b++) dd[b] = ss[b] = 0.0f;
        if (nb & 1) memset(xg + A32_Q(nb, r, G), 0, 32);
    }
}

// The same into the x16 layout (BD_X16's activations).
static void QV(quant_x16)(const float *x, int64_t k, int64_t nb, int R, int64_t G, uint8_t *xg) {
    for (int r = 0; r < R; r++) {
        float *dd = (float *)(xg + X16_D(k, nb, r, G)), *ss = (float *)(xg + X16_S(k, nb, r, G));
        int32_t *cc = (int32_t *)(xg + X16_C(k, nb, r, G));
        for (int64_t b = 0; b < nb; b++) {
            int32_t sum;
            dd[b] = QV(quant32)(x + r * k + 32 * b, (int8_t *)(xg + r * k + 32 * b), &sum);
            cc[b] = sum;
            ss[b] = dd[b] * (float)sum;
        }
    }
}

// The same into the ak layout: blocks of 256 with one d, sums per 16.
static void QV(quant_ak)(const float *x, int64_t k, int64_t nb, int R, int64_t G, uint8_t *xg) {
    const int64_t bb = AK_BYTES(G);
    for (int64_t b = 0; b < nb; b++) memset(xg + b * bb + AK_D(G), 0, 32 + 256);
    for (int r = 0; r < R; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + r * k + 256 * b;
            uint8_t *blk = xg + b * bb;
            int8_t *q = (int8_t *)(blk + 256 * r);
            int16_t *bs = (int16_t *)(blk + AK_BS(G));
            __m256 v[4], mx = _mm256_setzero_ps();
            int bad = 0;
            for (int g = 0; g < 8; g++) bad |= QV(absmax32)(xb + 32 * g, v, &mx);
            if (bad) {
                memset(q, 0, 256);
                memset(blk + AK_BR(G) + 32 * r, 0, 32);
                ((float *)(blk + AK_D(G)))[r] = NAN;
                continue;
            }
            const float amax = QV(hmax)(mx);
            const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            const __m256 vid = _mm256_set1_ps(id);
            for (int g = 0; g < 8; g++) {
                __m256i i[4];
                for (int j = 0; j < 4; j++)
                    i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 32 * g + 8 * j), vid));
                int16_t *br = (int16_t *)(blk + AK_BR(G)) + 16 * r;
                br[2 * g] = bs[AK_BSI(2 * g, r)] = (int16_t)QV(hsum_i)(_mm256_add_epi32(i[0], i[1]));
                br[2 * g + 1] = bs[AK_BSI(2 * g + 1, r)] = (int16_t)QV(hsum_i)(_mm256_add_epi32(i[2], i[3]));
                _mm256_storeu_si256((__m256i *)(q + 32 * g), QV(pack8)(i[0], i[1], i[2], i[3]));
            }
            ((float *)(blk + AK_D(G)))[r] = amax / 127.0f;
        }
    }
}

// The same through the ak layout, a block at a time (quant_via_ak_base).
static void QV(quant_via_ak)(bd_akfill fill, const float *x, int64_t k, int64_t nb, int R, int64_t G, uint8_t *xg) {
    uint8_t a[AK_BYTES(1)] __attribute__((aligned(64)));
    for (int r = 0; r < R; r++)
        for (int64_t b = 0; b < nb; b++) {
            QV(quant_ak)(x + r * k + 256 * b, 256, 1, 1, 1, a);
            fill(a, k, nb, r, b, G, xg);
        }
}

// Into the k16 layout (BD_X16(12) and (13)'s activations) and the k6
// layout (BD_X16(14)'s).
static void QV(quant_k16)(const float *x, int64_t k, int64_t nb, int R, int64_t G, uint8_t *xg) {
    QV(quant_via_ak)(k16_from_ak, x, k, nb, R, G, xg);
}

static void QV(quant_k6)(const float *x, int64_t k, int64_t nb, int R, int64_t G, uint8_t *xg) {
    QV(quant_via_ak)(k6_from_ak, x, k, nb, R, G, xg);
}

// The kernels: out[r] = W's row w · X's row r for r < R, X's rows a group
// of G at xg. Each weight block is decoded once into u8 values v with
// w = a*v + o and used for all R rows: the integer sum of v·q per row,
// times a·dx, plus o·dx·Σq. With R <= 2 two sets of accumulators
// alternate, so the chains of dependent adds do not bound the loop.

#define QV_LOOP _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)

// The 32-block kernels share this frame. Per 8 blocks: their weight scales
// (one gather of the f16s) times each row's 8 activation scales, p, kept
// on the stack for the broadcasts, and the offsets o times the rows' s as
// vectors; per block: DECODE sets v, DOT is its int sum with xv (a row's
// 32 int8). OFF is 0 (no offset), 1 (o = -8d), 2 (o = -16d) or 3 (o is the
// f16 at byte 2: Q4_1's and Q5_1's m). Whole chunks of 8 blocks unroll
// with constant indices (the accumulators stay in registers); the last
// partial chunk loops.
#define QV_KERNEL32(name, bytes, DECODE, DOT, OFF)                                         \
    QI void QV(name)(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G,          \
            const int R, float *out) {                                                     \
        const int NA = R <= 2 ? 2 : 1;                                                     \
        const int64_t bytes_ = (bytes), nbp = A32_NBP(nb);                                                   \
        const float *dx = (const float *)(xg + A32_D(nb, 0, G));                           \
        const float *sx = (const float *)(xg + A32_S(nb, 0, G));                           \
        __m256 acc0[QV_R], acc1[QV_R];                                                     \
        float pb[QV_R * 8] __attribute__((aligned(32)));                                   \
        QV_LOOP acc0[r] = acc1[r] = _mm256_setzero_ps();                                   \
        const __m256i m4 = _mm256_set1_epi8(0x0f);                                         \
        (void)m4;                                                                          \
        int64_t b0 = 0;                                                                    \
        for (; b0 + 8 <= nb; b0 += 8) {                                                    \
            bd_prefetch(w + b0 * bytes_ + BD_PREFETCH, 8 * bytes_);                        \
            const __m256i gi = _mm256_setr_epi32(0, (bytes), 2 * (bytes), 3 * (bytes),      \
                    4 * (bytes), 5 * (bytes), 6 * (bytes), 7 * (bytes));                   \
            const uint8_t *w8 = w + b0 * (bytes);                                          \
            const __m256 dw = QV(halves8)(_mm256_i32gather_epi32((const int *)w8, gi, 1)); \
            __m256 ow = OFF == 3 ? QV(halves8)(_mm256_i32gather_epi32((const int *)(w8 + 2), gi, 1)) \
                                 : _mm256_mul_ps(dw, _mm256_set1_ps(OFF == 2 ? -16.0f : -8.0f)); \
            QV_SCALES8(OFF)                                                                \
            _Pragma("GCC unroll 1") for (int j0 = 0; j0 < 8; j0 += 2) {                    \
                {                                                                          \
                    const int j = j0;                                                      \
                    QV_BLOCK32(DECODE, DOT, acc0)                                          \
                }                                                                          \
                {                                                                          \
                    const int j = j0 + 1;                                                  \
                    if (NA == 2)                                                           \
                        QV_BLOCK32(DECODE, DOT, acc1)                                      \
                    else                                                                   \
                        QV_BLOCK32(DECODE, DOT, acc0)                                      \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        if (b0 < nb) {                                                                     \
            const uint8_t *w8 = w + b0 * (bytes);                                          \
            const int nj = (int)(nb - b0);                                                 \
            const __m256i gi = _mm256_setr_epi32(0, (bytes), 2 * (bytes), 3 * (bytes),      \
                    4 * (bytes), 5 * (bytes), 6 * (bytes), 7 * (bytes));                   \
            const __m256i gm = _mm256_cmpgt_epi32(_mm256_set1_epi32(nj),                   \
                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));                            \
            const __m256 dw = QV(halves8)(_mm256_mask_i32gather_epi32(                      \
                    _mm256_setzero_si256(), (const int *)w8, gi, gm, 1));                  \
            __m256 ow = OFF == 3 ? QV(halves8)(_mm256_mask_i32gather_epi32(                 \
                                           _mm256_setzero_si256(), (const int *)(w8 + 2), gi, gm, 1)) \
                                 : _mm256_mul_ps(dw, _mm256_set1_ps(OFF == 2 ? -16.0f : -8.0f)); \
            QV_SCALES8(OFF)                                                                \
            for (int j = 0; j < nj; j++) {                                                 \
                QV_BLOCK32(DECODE, DOT, acc0)                                              \
            }                                                                              \
        }                                                                                  \
        QV_LOOP {                                                                          \
            out[r] = QV(hsum)(NA == 2 ? _mm256_add_ps(acc0[r], acc1[r]) : acc0[r]);       \
        }                                                                                  \
    }

// The rows' p (to pb) for the 8 blocks from b0, given dw, and their
// offsets (ow times the rows' s, into the accumulators: only their lanes'
// sum counts).
#define QV_SCALES8(OFF)                                                                    \
    QV_LOOP {                                                                              \
        _mm256_store_ps(pb + 8 * r, _mm256_mul_ps(dw, _mm256_loadu_ps(dx + r * nbp + b0))); \
        if (OFF) acc0[r] = _mm256_fmadd_ps(ow, _mm256_loadu_ps(sx + r * nbp + b0), acc0[r]); \
    }

// Block b0+j against the rows, into the accumulators ACC.
#define QV_BLOCK32(DECODE, DOT, ACC)                                                       \
    {                                                                                      \
        const uint8_t *w_ = w8 + j * bytes_;                                               \
        const uint8_t *xb = xg + A32_Q(b0 + j, 0, G);                                      \
        __m256i v;                                                                         \
        DECODE;                                                                            \
        QV_LOOP {                                                                          \
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xb + 64 * r));         \
            const __m256i i = DOT;                                                         \
            ACC[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_broadcast_ss(pb + 8 * r + j), ACC[r]); \
        }                                                                                  \
    }

// Nibbles of 16 bytes as 32 values: low nibbles are elements 0..15, high
// nibbles 16..31 (ggml's order).
#define QV_NIBBLES(p)                                                                      \
    ({                                                                                     \
        const __m128i q_ = _mm_loadu_si128((const __m128i *)(p));                          \
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q_, 4), q_), m4);                 \
    })

// The fifth bits of Q5_0/Q5_1: bit e of the 32-bit qh is element e's 16.
#ifdef QV_VNNI
#define QV_HIGH5(v, p) (v) = _mm256_mask_add_epi8((v), (__mmask32)le32(p), (v), _mm256_set1_epi8(0x10))
#else
#define QV_HIGH5(v, p)                                                                     \
    do {                                                                                   \
        const __m256i sel_ = _mm256_set1_epi64x(0x8040201008040201);                       \
        __m256i h_ = _mm256_shuffle_epi8(_mm256_set1_epi32((int)le32(p)),                  \
                _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,                  \
                        0x0101010101010101, 0x0000000000000000));                          \
        h_ = _mm256_cmpeq_epi8(_mm256_and_si256(h_, sel_), sel_);                          \
        (v) = _mm256_or_si256((v), _mm256_and_si256(h_, _mm256_set1_epi8(0x10)));         \
    } while (0)
#endif

#ifndef QV_NO_KERNELS
// Q4_0 {d; qs[16]}: w = d*nibble - 8d.
QV_KERNEL32(k_q4_0, 18, v = QV_NIBBLES(w_ + 2), QV(dot)(_mm256_setzero_si256(), v, xv), 1)
// Q4_1 {d; m; qs[16]}: w = d*nibble + m.
QV_KERNEL32(k_q4_1, 20, v = QV_NIBBLES(w_ + 4), QV(dot)(_mm256_setzero_si256(), v, xv), 3)
// Q5_0 {d; qh[4]; qs[16]}: w = d*(nibble | bit<<4) - 16d.
QV_KERNEL32(k_q5_0, 22, v = QV_NIBBLES(w_ + 6); QV_HIGH5(v, w_ + 2),
        QV(dot)(_mm256_setzero_si256(), v, xv), 2)
// Q5_1 {d; m; qh[4]; qs[16]}: w = d*(nibble | bit<<4) + m.
QV_KERNEL32(k_q5_1, 24, v = QV_NIBBLES(w_ + 8); QV_HIGH5(v, w_ + 4),
        QV(dot)(_mm256_setzero_si256(), v, xv), 3)
// Q8_0 {d; qs[32] int8}: w = d*q, signed: |q| against q's sign moved onto x.
QV_KERNEL32(k_q8_0, 34, v = _mm256_loadu_si256((const __m256i *)(w_ + 2)),
        QV(dot)(_mm256_setzero_si256(), _mm256_sign_epi8(v, v), _mm256_sign_epi8(xv, v)), 0)

#endif

// An int16 vector of word s of x (8 words, in both halves) everywhere.
QI __m256i QV(word)(__m256i x, const int s) {
    return _mm256_shuffle_epi8(x, _mm256_set1_epi16((short)((2 * s + 1) << 8 | 2 * s)));
}

// ms += for each row r of the group, Σ_j c_j·(bs_r[2j] + bs_r[2j+1]) (cp:
// the int16 pairs (c_j, c_j) for Q4_K's mins) or Σ_j c_2j·bs_r[2j] +
// c_2j+1·bs_r[2j+1] (cp: (c_2j, c_2j+1), Q6_K's scales): bs in the ak
// layout's pairs, one dword of cp per pair j.
QI __m256i QV(pairsums)(__m256i cp, const uint8_t *bs) {
    __m256i ms = _mm256_setzero_si256();
    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
        const __m256i c = _mm256_permutevar8x32_epi32(cp, _mm256_set1_epi32(j));
        const __m256i x = _mm256_loadu_si256((const __m256i *)(bs + 32 * j));
#ifdef QV_VNNI
        ms = _mm256_dpwssd_epi32(ms, c, x);
#else
        ms = _mm256_add_epi32(ms, _mm256_madd_epi16(c, x));
#endif
    }
    return ms;
}

// The same as pairsums for R <= 2 rows from their row-major sums (br): a
// multiply-add and a horizontal sum a row instead of eight lanes' worth.
QI __m256i QV(rowsums)(__m256i cp, const uint8_t *br, const int R) {
    __m128i v = _mm_cvtsi32_si128(QV(hsum_i)(_mm256_madd_epi16(cp, _mm256_loadu_si256((const __m256i *)br))));
    if (R == 2)
        v = _mm_insert_epi32(v, QV(hsum_i)(_mm256_madd_epi16(cp, _mm256_loadu_si256((const __m256i *)(br + 32)))), 1);
    return _mm256_zextsi128_si256(v);
}

// The rows' sums for R rows (R a constant).
#define QV_SUMS(cp, xb, G, R) \
    ((R) <= 2 ? QV(rowsums)((cp), (xb) + AK_BR(G), (R)) : QV(pairsums)((cp), (xb) + AK_BS(G)))

#ifndef QV_NO_KERNELS
// Q4_K {d; dmin; scales[12]; qs[128]} and Q5_K {…; qh[32]; qs[128]}: sub-block
// j of 32 is w = (d*sc_j)*v - dmin*m_j; the scales multiply in int16
// (dot_sc), the mins meet the rows' sums per 16 (pairsums).
QI void QV(k_q45K)(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G,
        const int R, float *out, const int Q5) {
    const int NA = R <= 2 ? 2 : 1;
    const int64_t bb = AK_BYTES(G), wb = Q5 ? 176 : 144;
    __m256 acc[QV_R], offv = _mm256_setzero_ps();
    float pb[8] __attribute__((aligned(32)));
    QV_LOOP acc[r] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t b = 0; b < nb; b++, w += wb) {
        bd_prefetch(w + BD_PREFETCH, wb);
        const uint8_t *xb = xg + b * bb;
        const float d = QV(h2f)(w), dmin = QV(h2f)(w + 2);
        uint32_t u[4];
        memcpy(u, w + 4, 12);
        bd_k4_scales(u);
        const __m256i scv = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)u)));
        const __m128i m8 = _mm_loadl_epi64((const __m128i *)(u + 2));
        const __m256i ms = QV_SUMS(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)), xb, G, R);
        const __m256 dv = _mm256_loadu_ps((const float *)(xb + AK_D(G)));
        offv = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), dv), _mm256_cvtepi32_ps(ms), offv);
        _mm256_store_ps(pb, _mm256_mul_ps(_mm256_set1_ps(d), dv));
        const uint8_t *qs = w + (Q5 ? 48 : 16);
        __m256i hb = Q5 ? _mm256_loadu_si256((const __m256i *)(w + 16)) : m4;
        (void)hb;
        __m256i isum[2][QV_R];
        for (int a = 0; a < NA; a++) QV_LOOP isum[a][r] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i lo = _mm256_and_si256(q, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (Q5) {
                const __m256i h16 = _mm256_set1_epi8(0x10);
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), h16));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), h16));
                hb = _mm256_srli_epi16(hb, 2);
            }
            const __m256i slo = QV(word)(scv, 2 * j), shi = QV(word)(scv, 2 * j + 1);
            const int a = NA == 2 ? (j & 1) : 0;
            QV_LOOP {
                const uint8_t *xr = xb + 256 * r + 64 * j;
                isum[a][r] = QV(dot_sc)(isum[a][r], lo, _mm256_loadu_si256((const __m256i *)xr), slo);
                isum[a][r] = QV(dot_sc)(isum[a][r], hi, _mm256_loadu_si256((const __m256i *)(xr + 32)), shi);
            }
        }
        QV_LOOP {
            const __m256i s = NA == 2 ? _mm256_add_epi32(isum[0][r], isum[1][r]) : isum[0][r];
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcast_ss(pb + r), acc[r]);
        }
    }
    _mm256_store_ps(pb, offv);
    QV_LOOP out[r] = QV(hsum)(acc[r]) + pb[r];
}

QI void QV(k_q4_K)(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, const int R, float *out) {
    QV(k_q45K)(w, nb, xg, G, R, out, 0);
}

QI void QV(k_q5_K)(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, const int R, float *out) {
    QV(k_q45K)(w, nb, xg, G, R, out, 1);
}

// Q6_K {ql[128]; qh[64]; scales[16] int8; d}: w = (d*sc)*(q - 32) with q of
// 6 bits and a scale per 16 elements: q in u8 against x, the int16 scales
// per half of each 32, and 32·Σ sc·bs (pairsums) taken off in integers.
QI void QV(k_q6_K)(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G,
        const int R, float *out) {
    const int NA = R <= 2 ? 2 : 1;
    const int64_t bb = AK_BYTES(G);
    __m256 acc[QV_R];
    float pb[8] __attribute__((aligned(32)));
    QV_LOOP acc[r] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    for (int64_t b = 0; b < nb; b++, w += 210) {
        bd_prefetch(w + BD_PREFETCH, 210);
        const uint8_t *xb = xg + b * bb;
        const float d = QV(h2f)(w + 208);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)(w + 192));
        const __m256i corr = _mm256_slli_epi32(QV_SUMS(_mm256_cvtepi8_epi16(sc8), xb, G, R), 5);
        _mm256_store_ps(pb, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_loadu_ps((const float *)(xb + AK_D(G)))));
        int32_t cb[8] __attribute__((aligned(32)));
        _mm256_store_si256((__m256i *)cb, corr);
        __m256i isum[2][QV_R];
        for (int a = 0; a < NA; a++) QV_LOOP isum[a][r] = _mm256_setzero_si256();
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            // scales 8h..8h+7 as int16 in both halves
            const __m256i sch = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_srli_si128(sc8, 8) : sc8));
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(w + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
                // [sc[2g] x8 | sc[2g+1] x8] of this half
                const __m256i s16 = _mm256_shuffle_epi8(sch, _mm256_setr_epi8(
                        4 * g, 4 * g + 1, 4 * g, 4 * g + 1, 4 * g, 4 * g + 1, 4 * g, 4 * g + 1,
                        4 * g, 4 * g + 1, 4 * g, 4 * g + 1, 4 * g, 4 * g + 1, 4 * g, 4 * g + 1,
                        4 * g + 2, 4 * g + 3, 4 * g + 2, 4 * g + 3, 4 * g + 2, 4 * g + 3, 4 * g + 2, 4 * g + 3,
                        4 * g + 2, 4 * g + 3, 4 * g + 2, 4 * g + 3, 4 * g + 2, 4 * g + 3, 4 * g + 2, 4 * g + 3));
                const int a = NA == 2 ? (g & 1) : 0;
                QV_LOOP {
                    const uint8_t *xr = xb + 256 * r + 128 * h + 32 * g;
                    isum[a][r] = QV(dot_sc)(isum[a][r], q[g], _mm256_loadu_si256((const __m256i *)xr), s16);
                }
            }
        }
        QV_LOOP {
            __m256i s = NA == 2 ? _mm256_add_epi32(isum[0][r], isum[1][r]) : isum[0][r];
            s = _mm256_sub_epi32(s, _mm256_setr_epi32(cb[r], 0, 0, 0, 0, 0, 0, 0));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcast_ss(pb + r), acc[r]);
        }
    }
    QV_LOOP out[r] = QV(hsum)(acc[r]);
}

// F16 and BF16 weights: X's f32 rows against the weights converted in
// registers (k any length; a tail under 8 in scalar code). One row gets
// four accumulator chains, two rows two.
QI __m256 QV(ld8)(const uint8_t *p, const int BF) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    return BF ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
}

QI float QV(f1)(const uint8_t *p, const int BF) {
    if (!BF) return _cvtsh_ss(le16(p));
    const uint32_t u = (uint32_t)le16(p) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

QI void QV(k_fx)(const uint8_t *w, int64_t k, const uint8_t *xg, int64_t G, const int R, float *out,
        const int BF) {
    (void)G;
    const float *x = (const float *)xg;
    const int NA = R == 1 ? 4 : R == 2 ? 2 : 1;
    __m256 acc[4][QV_R];
    for (int a = 0; a < NA; a++) QV_LOOP acc[a][r] = _mm256_setzero_ps();
    int64_t e = 0;
    for (; e + 8 * NA <= k; e += 8 * NA) {
        bd_prefetch(w + 2 * e + BD_PREFETCH, 16 * NA);
        _Pragma("GCC unroll 4") for (int a = 0; a < NA; a++) {
            const __m256 wv = QV(ld8)(w + 2 * (e + 8 * a), BF);
            QV_LOOP acc[a][r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * k + e + 8 * a), acc[a][r]);
        }
    }
    for (; e + 8 <= k; e += 8) {
        const __m256 wv = QV(ld8)(w + 2 * e, BF);
        QV_LOOP acc[0][r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * k + e), acc[0][r]);
    }
    QV_LOOP {
        __m256 s = acc[0][r];
        for (int a = 1; a < NA; a++) s = _mm256_add_ps(s, acc[a][r]);
        float t = QV(hsum)(s);
        for (int64_t i = e; i < k; i++) t += QV(f1)(w + 2 * i, BF) * x[r * k + i];
        out[r] = t;
    }
}

QI void QV(k_f16)(const uint8_t *w, int64_t k, const uint8_t *xg, int64_t G, const int R, float *out) {
    QV(k_fx)(w, k, xg, G, R, out, 0);
}

QI void QV(k_bf16)(const uint8_t *w, int64_t k, const uint8_t *xg, int64_t G, const int R, float *out) {
    QV(k_fx)(w, k, xg, G, R, out, 1);
}

// The row functions qgemm.c calls: R (1..QV_R) as a constant for each
// instance, so the accumulators are registers.
#if QV_R >= 8
#define QV_CASES_HI(n)                                                                     \
    case 5: QV(k_##n)(w, nb, xg, G, 5, out); break;                                        \
    case 6: QV(k_##n)(w, nb, xg, G, 6, out); break;                                        \
    case 7: QV(k_##n)(w, nb, xg, G, 7, out); break;                                        \
    case 8: QV(k_##n)(w, nb, xg, G, 8, out); break;
#else
#define QV_CASES_HI(n)
#endif
#define QV_ROWFN(n)                                                                        \
    static void QV(rows_##n)(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, \
            int R, float *out) {                                                           \
        switch (R) {                                                                       \
        case 1: QV(k_##n)(w, nb, xg, G, 1, out); break;                                    \
        case 2: QV(k_##n)(w, nb, xg, G, 2, out); break;                                    \
        case 3: QV(k_##n)(w, nb, xg, G, 3, out); break;                                    \
        case 4: QV(k_##n)(w, nb, xg, G, 4, out); break;                                    \
        QV_CASES_HI(n)                                                                     \
        }                                                                                  \
    }

QV_ROWFN(q4_0)
QV_ROWFN(q4_1)
QV_ROWFN(q5_0)
QV_ROWFN(q5_1)
QV_ROWFN(q8_0)
QV_ROWFN(q4_K)
QV_ROWFN(q5_K)
QV_ROWFN(q6_K)
QV_ROWFN(f16)
QV_ROWFN(bf16)

#undef QV_CASES_HI
#undef QV_ROWFN
#endif

#undef QV_KERNEL32
#undef QV_SCALES8
#undef QV_BLOCK32
#undef QV_NIBBLES
#undef QV_HIGH5
#undef QV_LOOP
#undef QV_SUMS
#undef QI
