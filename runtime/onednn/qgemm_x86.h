// The vector half of qgemm.c, included by it once per x86 variant under a
// #pragma GCC target: QV(name) gives each inclusion its own names, QV_R is
// the most rows of X one pass over a weight row carries (their
// accumulators stay in registers), and QV_VNNI selects AVX512-VNNI's
// dpbusd/dpwssd over AVX2's maddubs/madd. Not a header to include
// elsewhere; see qgemm.c for the layouts.

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

// One row of k = 32*nb activations into the a32 layout (see qgemm.c).
static void QV(quant_a32)(const float *x, int64_t nb, uint8_t *row) {
    int8_t *q = (int8_t *)row;
    float *dd = (float *)(row + 32 * nb), *ss = dd + nb;
    for (int64_t b = 0; b < nb; b++, x += 32, q += 32) {
        __m256 v[4], mx = _mm256_setzero_ps();
        if (QV(absmax32)(x, v, &mx)) {
            memset(q, 0, 32);
            dd[b] = ss[b] = NAN;
            continue;
        }
        const float amax = QV(hmax)(mx);
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i i[4];
        for (int j = 0; j < 4; j++) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], vid));
        const int32_t sum = QV(hsum_i)(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])));
        _mm256_storeu_si256((__m256i *)q, QV(pack8)(i[0], i[1], i[2], i[3]));
        dd[b] = d;
        ss[b] = d * (float)sum;
    }
}

// One row of k = 256*nb activations into the ak layout.
static void QV(quant_ak)(const float *x, int64_t nb, uint8_t *row) {
    int8_t *q = (int8_t *)row;
    float *dd = (float *)(row + 256 * nb);
    int16_t *bs = (int16_t *)(dd + nb);
    for (int64_t b = 0; b < nb; b++, x += 256, q += 256, bs += 16) {
        __m256 v[4], mx = _mm256_setzero_ps();
        int bad = 0;
        for (int g = 0; g < 8; g++) bad |= QV(absmax32)(x + 32 * g, v, &mx);
        if (bad) {
            memset(q, 0, 256);
            memset(bs, 0, 32);
            dd[b] = NAN;
            continue;
        }
        const float amax = QV(hmax)(mx);
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        for (int g = 0; g < 8; g++) {
            __m256i i[4];
            for (int j = 0; j < 4; j++) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * g + 8 * j), vid));
            bs[2 * g] = (int16_t)QV(hsum_i)(_mm256_add_epi32(i[0], i[1]));
            bs[2 * g + 1] = (int16_t)QV(hsum_i)(_mm256_add_epi32(i[2], i[3]));
            _mm256_storeu_si256((__m256i *)(q + 32 * g), QV(pack8)(i[0], i[1], i[2], i[3]));
        }
        dd[b] = d;
    }
}

// The kernels: out[r] = W's row w · X's row r, for r < R, X's rows at xq +
// r*xs in the a32 (ak) layout with nb blocks. Each weight block is decoded
// once into u8 values v (a vector of 32) with w = a*v + o per element, and
// used for all R rows: the integer dot of v and x's int8 values times a*dx,
// plus o times dx*sum(x's int8) (the s of a32, the bs of ak).

#define QV_LOOP _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)

// The 32-block kernels share this frame; DECODE sets v, d (the weight scale
// a) and o (the per-block offset multiplying dx*sum), DOT the int sum.
#define QV_KERNEL32(name, bytes, DECODE, DOT, OFF_SCALE)                                  \
    QI void QV(name)(const uint8_t *w, int64_t nb, const uint8_t *xq, int64_t xs,        \
            const int R, float *out) {                                                    \
        __m256 acc[QV_R];                                                                 \
        float off[QV_R];                                                                  \
        QV_LOOP {                                                                         \
            acc[r] = _mm256_setzero_ps();                                                 \
            off[r] = 0.0f;                                                                \
        }                                                                                 \
        const __m256i m4 = _mm256_set1_epi8(0x0f);                                        \
        (void)m4;                                                                         \
        for (int64_t b = 0; b < nb; b++, w += (bytes)) {                                  \
            __m256i v;                                                                    \
            float d, o;                                                                   \
            DECODE;                                                                       \
            (void)o;                                                                      \
            const __m256 vd = _mm256_set1_ps(d);                                          \
            QV_LOOP {                                                                     \
                const uint8_t *xr = xq + r * xs;                                          \
                const float *xd = (const float *)(xr + 32 * nb);                          \
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xr + 32 * b));    \
                const __m256i i = DOT;                                                    \
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i),                           \
                        _mm256_mul_ps(vd, _mm256_broadcast_ss(xd + b)), acc[r]);          \
                if (OFF_SCALE) off[r] += o * xd[nb + b];                                  \
            }                                                                             \
        }                                                                                 \
        QV_LOOP out[r] = QV(hsum)(acc[r]) + off[r];                                       \
    }

// Nibbles of 16 bytes as 32 values: low nibbles are elements 0..15, high
// nibbles 16..31 (ggml's order).
#define QV_NIBBLES(p) \
    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(p)), 4), \
            _mm_loadu_si128((const __m128i *)(p))), m4)

// The fifth bits of Q5_0/Q5_1: bit e of the 32-bit qh is element e's 16.
#ifdef QV_VNNI
#define QV_HIGH5(v, p) (v) = _mm256_mask_add_epi8((v), (__mmask32)le32(p), (v), _mm256_set1_epi8(0x10))
#else
#define QV_HIGH5(v, p)                                                                       \
    do {                                                                                     \
        const __m256i sel_ = _mm256_set1_epi64x(0x8040201008040201);                         \
        __m256i h_ = _mm256_shuffle_epi8(_mm256_set1_epi32((int)le32(p)),                    \
                _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,                    \
                        0x0101010101010101, 0x0000000000000000));                            \
        h_ = _mm256_cmpeq_epi8(_mm256_and_si256(h_, sel_), sel_);                            \
        (v) = _mm256_or_si256((v), _mm256_and_si256(h_, _mm256_set1_epi8(0x10)));           \
    } while (0)
#endif

// Q4_0 {d; qs[16]}: w = d*nibble - 8d.
QV_KERNEL32(k_q4_0, 18,
        (d = QV(h2f)(w), o = -8.0f * d, v = QV_NIBBLES(w + 2)),
        QV(dot)(_mm256_setzero_si256(), v, xv), 1)
// Q4_1 {d; m; qs[16]}: w = d*nibble + m.
QV_KERNEL32(k_q4_1, 20,
        (d = QV(h2f)(w), o = QV(h2f)(w + 2), v = QV_NIBBLES(w + 4)),
        QV(dot)(_mm256_setzero_si256(), v, xv), 1)
// Q5_0 {d; qh[4]; qs[16]}: w = d*(nibble | bit<<4) - 16d.
QV_KERNEL32(k_q5_0, 22,
        (d = QV(h2f)(w), o = -16.0f * d, v = QV_NIBBLES(w + 6), ({ QV_HIGH5(v, w + 2); })),
        QV(dot)(_mm256_setzero_si256(), v, xv), 1)
// Q5_1 {d; m; qh[4]; qs[16]}: w = d*(nibble | bit<<4) + m.
QV_KERNEL32(k_q5_1, 24,
        (d = QV(h2f)(w), o = QV(h2f)(w + 2), v = QV_NIBBLES(w + 8), ({ QV_HIGH5(v, w + 4); })),
        QV(dot)(_mm256_setzero_si256(), v, xv), 1)
// Q8_0 {d; qs[32] int8}: w = d*q, signed: |q| against q's sign moved onto x.
QV_KERNEL32(k_q8_0, 34,
        (d = QV(h2f)(w), o = 0.0f, v = _mm256_loadu_si256((const __m256i *)(w + 2))),
        QV(dot)(_mm256_setzero_si256(), _mm256_sign_epi8(v, v), _mm256_sign_epi8(xv, v)), 0)

// The 6-bit scales and mins of a Q4_K/Q5_K block (ggml's get_scale_min_k4).
QI void QV(scales_k4)(const uint8_t *q, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        mn[j] = q[j + 4] & 63;
        sc[j + 4] = (q[j + 8] & 0x0f) | ((q[j] >> 6) << 4);
        mn[j + 4] = (q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4);
    }
}

// Q4_K {d; dmin; scales[12]; qs[128]} and Q5_K {…; qh[32]; qs[128]}: sub-block
// j of 32 is w = (d*sc_j)*v - dmin*m_j; the scales multiply in int16
// (dot_sc) and the mins meet the activations' sums per 32.
#define QV_KERNEL_K45(name, bytes, Q5)                                                    \
    QI void QV(name)(const uint8_t *w, int64_t nb, const uint8_t *xq, int64_t xs,        \
            const int R, float *out) {                                                    \
        __m256 acc[QV_R];                                                                 \
        float off[QV_R];                                                                  \
        QV_LOOP {                                                                         \
            acc[r] = _mm256_setzero_ps();                                                 \
            off[r] = 0.0f;                                                                \
        }                                                                                 \
        const __m256i m4 = _mm256_set1_epi8(0x0f);                                        \
        for (int64_t b = 0; b < nb; b++, w += (bytes)) {                                  \
            const float d = QV(h2f)(w), dmin = QV(h2f)(w + 2);                            \
            uint8_t sc[8], mn[8];                                                         \
            QV(scales_k4)(w + 4, sc, mn);                                                 \
            const uint8_t *qs = w + 16 + (Q5 ? 32 : 0);                                   \
            __m256i hb = Q5 ? _mm256_loadu_si256((const __m256i *)(w + 16)) : m4;         \
            (void)hb;                                                                     \
            __m256i isum[QV_R];                                                           \
            QV_LOOP isum[r] = _mm256_setzero_si256();                                     \
            for (int j = 0; j < 4; j++) {                                                 \
                const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));     \
                __m256i lo = _mm256_and_si256(q, m4);                                     \
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);               \
                if (Q5) {                                                                 \
                    const __m256i h16 = _mm256_set1_epi8(0x10);                           \
                    lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), h16)); \
                    hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), h16)); \
                    hb = _mm256_srli_epi16(hb, 2);                                        \
                }                                                                         \
                const __m256i slo = _mm256_set1_epi16(sc[2 * j]);                         \
                const __m256i shi = _mm256_set1_epi16(sc[2 * j + 1]);                     \
                QV_LOOP {                                                                 \
                    const int8_t *xr = (const int8_t *)(xq + r * xs) + 256 * b + 64 * j;  \
                    isum[r] = QV(dot_sc)(isum[r], lo, _mm256_loadu_si256((const __m256i *)xr), slo); \
                    isum[r] = QV(dot_sc)(isum[r], hi, _mm256_loadu_si256((const __m256i *)(xr + 32)), shi); \
                }                                                                         \
            }                                                                             \
            QV_LOOP {                                                                     \
                const uint8_t *xr = xq + r * xs;                                          \
                const float dx = ((const float *)(xr + 256 * nb))[b];                     \
                const int16_t *bs = (const int16_t *)(xr + 260 * nb) + 16 * b;            \
                int32_t ms = 0;                                                           \
                for (int j = 0; j < 8; j++) ms += (int32_t)mn[j] * (bs[2 * j] + bs[2 * j + 1]); \
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(d * dx), acc[r]); \
                off[r] -= dmin * dx * (float)ms;                                          \
            }                                                                             \
        }                                                                                 \
        QV_LOOP out[r] = QV(hsum)(acc[r]) + off[r];                                       \
    }

QV_KERNEL_K45(k_q4_K, 144, 0)
QV_KERNEL_K45(k_q5_K, 176, 1)

// Q6_K {ql[128]; qh[64]; scales[16] int8; d}: w = (d*sc)*(q - 32) with q of
// 6 bits and a scale per 16 elements: q in u8 against x, the int16 scales
// per half of each 32, and 32*sum(sc*bs) taken off in integers.
QI void QV(k_q6_K)(const uint8_t *w, int64_t nb, const uint8_t *xq, int64_t xs,
        const int R, float *out) {
    __m256 acc[QV_R];
    QV_LOOP acc[r] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    for (int64_t b = 0; b < nb; b++, w += 210) {
        const float d = QV(h2f)(w + 208);
        const int8_t *sc = (const int8_t *)(w + 192);
        __m256i isum[QV_R];
        QV_LOOP isum[r] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(w + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            for (int g = 0; g < 4; g++) {
                const int is = 8 * h + 2 * g;
                const __m256i s16 = _mm256_set_m128i(_mm_set1_epi16(sc[is + 1]), _mm_set1_epi16(sc[is]));
                QV_LOOP {
                    const int8_t *xr = (const int8_t *)(xq + r * xs) + 256 * b + 128 * h + 32 * g;
                    isum[r] = QV(dot_sc)(isum[r], q[g], _mm256_loadu_si256((const __m256i *)xr), s16);
                }
            }
        }
        QV_LOOP {
            const uint8_t *xr = xq + r * xs;
            const float dx = ((const float *)(xr + 256 * nb))[b];
            const int16_t *bs = (const int16_t *)(xr + 260 * nb) + 16 * b;
            int32_t c = 0;
            for (int j = 0; j < 16; j++) c += (int32_t)sc[j] * bs[j];
            const __m256i corr = _mm256_setr_epi32(32 * c, 0, 0, 0, 0, 0, 0, 0);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[r], corr)),
                    _mm256_set1_ps(d * dx), acc[r]);
        }
    }
    QV_LOOP out[r] = QV(hsum)(acc[r]);
}

// The row functions qgemm.c calls: R (1..QV_R) as a constant for each
// instance, so the accumulators are registers.
#if QV_R >= 8
#define QV_CASES_HI(k) case 5: k(5); break; case 6: k(6); break; case 7: k(7); break; case 8: k(8); break;
#else
#define QV_CASES_HI(k)
#endif
#define QV_ROWFN(name)                                                                    \
    static void QV(rows_##name)(const uint8_t *w, int64_t nb, const uint8_t *xq,         \
            int64_t xs, int R, float *out) {                                              \
        switch (R) {                                                                      \
        case 1: QV(k_##name)(w, nb, xq, xs, 1, out); break;                               \
        case 2: QV(k_##name)(w, nb, xq, xs, 2, out); break;                               \
        case 3: QV(k_##name)(w, nb, xq, xs, 3, out); break;                               \
        case 4: QV(k_##name)(w, nb, xq, xs, 4, out); break;                               \
        QV_CASES_HI(QV_K_##name)                                                          \
        }                                                                                 \
    }

#define QV_K_q4_0(n) QV(k_q4_0)(w, nb, xq, xs, n, out)
#define QV_K_q4_1(n) QV(k_q4_1)(w, nb, xq, xs, n, out)
#define QV_K_q5_0(n) QV(k_q5_0)(w, nb, xq, xs, n, out)
#define QV_K_q5_1(n) QV(k_q5_1)(w, nb, xq, xs, n, out)
#define QV_K_q8_0(n) QV(k_q8_0)(w, nb, xq, xs, n, out)
#define QV_K_q4_K(n) QV(k_q4_K)(w, nb, xq, xs, n, out)
#define QV_K_q5_K(n) QV(k_q5_K)(w, nb, xq, xs, n, out)
#define QV_K_q6_K(n) QV(k_q6_K)(w, nb, xq, xs, n, out)

QV_ROWFN(q4_0)
QV_ROWFN(q4_1)
QV_ROWFN(q5_0)
QV_ROWFN(q5_1)
QV_ROWFN(q8_0)
QV_ROWFN(q4_K)
QV_ROWFN(q5_K)
QV_ROWFN(q6_K)

#undef QV_CASES_HI
#undef QV_ROWFN
#undef QV_K_q4_0
#undef QV_K_q4_1
#undef QV_K_q5_0
#undef QV_K_q5_1
#undef QV_K_q8_0
#undef QV_K_q4_K
#undef QV_K_q5_K
#undef QV_K_q6_K
#undef QV_KERNEL32
#undef QV_KERNEL_K45
#undef QV_NIBBLES
#undef QV_HIGH5
#undef QV_LOOP
#undef QI
