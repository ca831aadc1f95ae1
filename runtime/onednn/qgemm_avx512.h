// The AVX-512 VNNI kernels of qgemm.c on 512-bit vectors: two blocks of 32
// (the a32 layout keeps a row's pair of blocks together) or 64 elements of
// a K block per instruction. On the CPUs with VNNI the 512-bit dpbusd,
// dpwssd, cvt and FMA issue on two ports, so a vector twice as wide does
// twice the work per instruction. Included by qgemm.c once, under the
// VNNI target, after qgemm_x86.h's VNNI inclusion (whose quantizers and
// helpers, the *_vnni names, it uses). Layouts: see qgemm.c.

#define ZI static inline __attribute__((always_inline))
#define Z_LOOP _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)

// Two blocks' nibbles (16 bytes at qa and at qb) as 64 values in order:
// block a's 32 (low nibbles 0..15, high 16..31), then block b's.
ZI __m512i z_nibbles2(const uint8_t *qa, const uint8_t *qb) {
    const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)qa)),
            _mm_loadu_si128((const __m128i *)qb), 1);
    const __m512i z = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1),
            _mm512_set1_epi8(0x0f));
    // 128-bit lanes: a lo, b lo, a hi, b hi -> a lo, a hi, b lo, b hi
    return _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));
}

// One block's nibbles in the low half, zeros above.
ZI __m512i z_nibbles1(const uint8_t *qa) {
    const __m128i q = _mm_loadu_si128((const __m128i *)qa);
    const __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
    return _mm512_zextsi256_si512(v);
}

// The 32-block kernels on pairs of blocks. Per 8 blocks (as the 256-bit
// kernels): the weights' f16 scales gathered, each row's p = dw·dx
// spread to one 512-bit vector per pair ([p_a x8 | p_b x8], on the stack),
// and the offsets o·s as 256-bit vectors. DECODE2 (DECODE1 for a last odd
// block) sets z from w_ (the pair's first block); SIGNED says z holds
// Q8_0's signed values (|q| against x with q's sign). OFF as in qgemm_x86.h.
#define Z_KERNEL32(name, bytes, DECODE2, DECODE1, SIGNED, OFF)                             \
    ZI void name(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, const int R, \
            float *out) {                                                                  \
        const int NA = R <= 2 ? 2 : 1;                                                     \
        const int64_t bytes_ = (bytes), nbp = A32_NBP(nb);                                 \
        const float *dx = (const float *)(xg + A32_D(nb, 0, G));                           \
        const float *sx = (const float *)(xg + A32_S(nb, 0, G));                           \
        __m512 acc0[8], acc1[8];                                                           \
        __m256 offa[8];                                                                    \
        float pz[8 * 4 * 16] __attribute__((aligned(64)));                                 \
        Z_LOOP {                                                                           \
            acc0[r] = acc1[r] = _mm512_setzero_ps();                                       \
            offa[r] = _mm256_setzero_ps();                                                 \
        }                                                                                  \
        for (int64_t b0 = 0; b0 < nb; b0 += 8) {                                           \
            const uint8_t *w8 = w + b0 * bytes_;                                           \
            bd_prefetch(w8 + BD_PREFETCH, 8 * bytes_);                                     \
            const int nj = nb - b0 < 8 ? (int)(nb - b0) : 8;                               \
            const __m256i gi = _mm256_setr_epi32(0, (bytes), 2 * (bytes), 3 * (bytes),      \
                    4 * (bytes), 5 * (bytes), 6 * (bytes), 7 * (bytes));                   \
            /* the lanes past the last block gather nothing: zeros */                      \
            const __mmask8 gm = (__mmask8)((1u << nj) - 1);                                \
            const __m256 dw = halves8_vnni(_mm256_mmask_i32gather_epi32(                    \
                    _mm256_setzero_si256(), gm, gi, (const int *)w8, 1));                  \
            const __m256 ow = OFF == 3 ? halves8_vnni(_mm256_mmask_i32gather_epi32(         \
                                                 _mm256_setzero_si256(), gm, gi, (const int *)(w8 + 2), 1)) \
                                       : _mm256_mul_ps(dw, _mm256_set1_ps(OFF == 2 ? -16.0f : -8.0f)); \
            Z_LOOP {                                                                       \
                const __m512 p = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_loadu_ps(dx + r * nbp + b0))); \
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)                        \
                    _mm512_store_ps(pz + (r * 4 + i) * 16, _mm512_permutexvar_ps(           \
                            _mm512_set_epi32(2 * i + 1, 2 * i + 1, 2 * i + 1, 2 * i + 1,     \
                                    2 * i + 1, 2 * i + 1, 2 * i + 1, 2 * i + 1,            \
                                    2 * i, 2 * i, 2 * i, 2 * i, 2 * i, 2 * i, 2 * i, 2 * i), p)); \
                if (OFF) offa[r] = _mm256_fmadd_ps(ow, _mm256_loadu_ps(sx + r * nbp + b0), offa[r]); \
            }                                                                              \
            if (nj == 8) {                                                                 \
                _Pragma("GCC unroll 1") for (int i0 = 0; i0 < 4; i0 += 2) {                \
                    {                                                                      \
                        const int i = i0;                                                  \
                        const uint8_t *w_ = w8 + 2 * i * bytes_;                           \
                        __m512i z;                                                         \
                        DECODE2;                                                           \
                        Z_PAIR(SIGNED, acc0)                                               \
                    }                                                                      \
                    {                                                                      \
                        const int i = i0 + 1;                                              \
                        const uint8_t *w_ = w8 + 2 * i * bytes_;                           \
                        __m512i z;                                                         \
                        DECODE2;                                                           \
                        if (NA == 2)                                                       \
                            Z_PAIR(SIGNED, acc1)                                           \
                        else                                                               \
                            Z_PAIR(SIGNED, acc0)                                           \
                    }                                                                      \
                }                                                                          \
            } else {                                                                       \
                for (int i = 0; 2 * i < nj; i++) {                                         \
                    const uint8_t *w_ = w8 + 2 * i * bytes_;                               \
                    __m512i z;                                                             \
                    if (2 * i + 1 < nj) {                                                  \
                        DECODE2;                                                           \
                    } else {                                                               \
                        DECODE1;                                                           \
                    }                                                                      \
                    Z_PAIR(SIGNED, acc0)                                                   \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        Z_LOOP {                                                                           \
            const __m512 s = NA == 2 ? _mm512_add_ps(acc0[r], acc1[r]) : acc0[r];          \
            out[r] = _mm512_reduce_add_ps(s) + hsum_vnni(offa[r]);                         \
        }                                                                                  \
    }

// Pair i of the chunk from b0 (blocks b0+2i, b0+2i+1; both halves of the
// rows' 64 bytes) against the rows, into ACC.
#define Z_PAIR(SIGNED, ACC)                                                                \
    {                                                                                      \
        const uint8_t *xb = xg + A32_Q(b0 + 2 * i, 0, G);                                  \
        const __m512i u = SIGNED ? _mm512_abs_epi8(z) : z;                                 \
        const __mmask64 neg = SIGNED ? _mm512_movepi8_mask(z) : 0;                         \
        (void)neg;                                                                         \
        Z_LOOP {                                                                           \
            __m512i xv = _mm512_loadu_si512((const void *)(xb + 64 * r));                  \
            if (SIGNED) xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);    \
            const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, xv);          \
            ACC[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_load_ps(pz + (r * 4 + i) * 16), ACC[r]); \
        }                                                                                  \
    }

// The fifth bits of a pair (qh of the first block at ha, of the second at
// hb; zero for a missing second block) added as 16s.
#define Z_HIGH5(z, ha, hb)                                                                 \
    (z) = _mm512_mask_add_epi8((z), (__mmask64)((uint64_t)le32(ha) | (uint64_t)(hb) << 32), (z), \
            _mm512_set1_epi8(0x10))

Z_KERNEL32(kz_q4_0, 18, z = z_nibbles2(w_ + 2, w_ + 20), z = z_nibbles1(w_ + 2), 0, 1)
Z_KERNEL32(kz_q4_1, 20, z = z_nibbles2(w_ + 4, w_ + 24), z = z_nibbles1(w_ + 4), 0, 3)
Z_KERNEL32(kz_q5_0, 22, z = z_nibbles2(w_ + 6, w_ + 28); Z_HIGH5(z, w_ + 2, le32(w_ + 24)),
        z = z_nibbles1(w_ + 6); Z_HIGH5(z, w_ + 2, 0), 0, 2)
Z_KERNEL32(kz_q5_1, 24, z = z_nibbles2(w_ + 8, w_ + 32); Z_HIGH5(z, w_ + 4, le32(w_ + 28)),
        z = z_nibbles1(w_ + 8); Z_HIGH5(z, w_ + 4, 0), 0, 3)
Z_KERNEL32(kz_q8_0, 34,
        z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w_ + 2))),
                _mm256_loadu_si256((const __m256i *)(w_ + 36)), 1),
        z = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(w_ + 2))), 1, 0)

// isum += maddubs(u, x) · sc: u8 values against a row's int8, the int16
// pair sums times the int16 scales, summed in int32.
ZI __m512i z_dot_sc(__m512i isum, __m512i u, const uint8_t *x, __m512i sc) {
    return _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(u, _mm512_loadu_si512((const void *)x)), sc);
}

// An index vector for vpermw: word a in the low 256 bits, b in the high.
ZI __m512i z_idx2(int a, int b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)a)), _mm256_set1_epi16((short)b), 1);
}

// An index vector: words a, a+1, a+2, a+3, eight times each.
ZI __m512i z_idx4(int a) {
    const __m128i q = _mm_setr_epi16((short)a, (short)a, (short)a, (short)a, (short)a, (short)a, (short)a, (short)a);
    const __m512i z = _mm512_broadcast_i32x4(q);
    return _mm512_add_epi16(z, _mm512_set_epi64(0x0003000300030003, 0x0003000300030003, 0x0002000200020002,
            0x0002000200020002, 0x0001000100010001, 0x0001000100010001, 0, 0));
}

// Q4_K and Q5_K: 64 elements (sub-blocks 2j and 2j+1) a vector.
ZI void kz_q45K(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, const int R, float *out,
        const int Q5) {
    const int NA = R <= 2 ? 2 : 1;
    const int64_t bb = AK_BYTES(G), wb = Q5 ? 176 : 144;
    __m512 acc[8];
    __m256 offv = _mm256_setzero_ps();
    float pb[8] __attribute__((aligned(32)));
    Z_LOOP acc[r] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int64_t b = 0; b < nb; b++, w += wb) {
        bd_prefetch(w + BD_PREFETCH, wb);
        const uint8_t *xb = xg + b * bb;
        const float d = h2f_vnni(w), dmin = h2f_vnni(w + 2);
        uint32_t u[4];
        memcpy(u, w + 4, 12);
        bd_k4_scales(u);
        const __m512i scz = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)u)));
        const __m128i m8 = _mm_loadl_epi64((const __m128i *)(u + 2));
        const __m256i mp = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        const __m256i ms = R <= 2 ? rowsums_vnni(mp, xb + AK_BR(G), R) : pairsums_vnni(mp, xb + AK_BS(G));
        const __m256 dv = _mm256_loadu_ps((const float *)(xb + AK_D(G)));
        offv = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), dv), _mm256_cvtepi32_ps(ms), offv);
        _mm256_store_ps(pb, _mm256_mul_ps(_mm256_set1_ps(d), dv));
        const uint8_t *qs = w + (Q5 ? 48 : 16);
        __m512i hb = _mm512_setzero_si512();
        if (Q5) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(w + 16));
            hb = _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 1), 1);
        }
        __m512i isum[2][8];
        for (int a = 0; a < NA; a++) Z_LOOP isum[a][r] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m512i z = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), m4);
            if (Q5) // bit 2j of qh for sub-block 2j, bit 2j+1 (bit 2j of qh>>1) for 2j+1
                z = _mm512_mask_add_epi8(z, _mm512_test_epi8_mask(hb, _mm512_set1_epi8((char)(1 << (2 * j)))), z,
                        _mm512_set1_epi8(0x10));
            const __m512i sz = _mm512_permutexvar_epi16(z_idx2(2 * j, 2 * j + 1), scz);
            const int a = NA == 2 ? (j & 1) : 0;
            Z_LOOP isum[a][r] = z_dot_sc(isum[a][r], z, xb + 256 * r + 64 * j, sz);
        }
        Z_LOOP {
            const __m512i s = NA == 2 ? _mm512_add_epi32(isum[0][r], isum[1][r]) : isum[0][r];
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(pb[r]), acc[r]);
        }
    }
    _mm256_store_ps(pb, offv);
    Z_LOOP out[r] = _mm512_reduce_add_ps(acc[r]) + pb[r];
}

ZI void kz_q4_K(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, const int R, float *out) {
    kz_q45K(w, nb, xg, G, R, out, 0);
}

ZI void kz_q5_K(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, const int R, float *out) {
    kz_q45K(w, nb, xg, G, R, out, 1);
}

// Q6_K: 64 elements a vector, ql's two 32-byte rows as one load.
ZI void kz_q6_K(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, const int R, float *out) {
    const int NA = R <= 2 ? 2 : 1;
    const int64_t bb = AK_BYTES(G);
    __m512 acc[8];
    float pb[8] __attribute__((aligned(32)));
    int32_t cb[8] __attribute__((aligned(32)));
    Z_LOOP acc[r] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i sh01 = z_idx2(4, 2), sh23 = z_idx2(0, 2);
    for (int64_t b = 0; b < nb; b++, w += 210) {
        bd_prefetch(w + BD_PREFETCH, 210);
        const uint8_t *xb = xg + b * bb;
        const float d = h2f_vnni(w + 208);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)(w + 192));
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        _mm256_store_si256((__m256i *)cb, _mm256_slli_epi32(
                R <= 2 ? rowsums_vnni(sc16, xb + AK_BR(G), R) : pairsums_vnni(sc16, xb + AK_BS(G)), 5));
        _mm256_store_ps(pb, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_loadu_ps((const float *)(xb + AK_D(G)))));
        const __m512i scz = _mm512_castsi256_si512(sc16);
        __m512i isum[2][8];
        for (int a = 0; a < NA; a++) Z_LOOP isum[a][r] = _mm512_setzero_si512();
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            const __m512i l = _mm512_loadu_si512((const void *)(w + 64 * h));
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h)));
            const __m512i z01 = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, sh01), m30));
            const __m512i z23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                    _mm512_and_si512(_mm512_srlv_epi16(qh, sh23), m30));
            const __m512i s01 = _mm512_permutexvar_epi16(z_idx4(8 * h), scz);
            const __m512i s23 = _mm512_permutexvar_epi16(z_idx4(8 * h + 4), scz);
            const int a = NA == 2 ? h : 0;
            Z_LOOP {
                isum[a][r] = z_dot_sc(isum[a][r], z01, xb + 256 * r + 128 * h, s01);
                isum[a][r] = z_dot_sc(isum[a][r], z23, xb + 256 * r + 128 * h + 64, s23);
            }
        }
        Z_LOOP {
            __m512i s = NA == 2 ? _mm512_add_epi32(isum[0][r], isum[1][r]) : isum[0][r];
            s = _mm512_sub_epi32(s, _mm512_zextsi128_si512(_mm_cvtsi32_si128(cb[r])));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(pb[r]), acc[r]);
        }
    }
    Z_LOOP out[r] = _mm512_reduce_add_ps(acc[r]);
}

// F16 and BF16 weights, 16 a vector (see qgemm_x86.h's k_fx).
ZI __m512 z_ld16(const uint8_t *p, const int BF) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return BF ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
}

ZI float z_f1(const uint8_t *p, const int BF) {
    if (!BF) return _cvtsh_ss(le16(p));
    const uint32_t u = (uint32_t)le16(p) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

ZI void kz_fx(const uint8_t *w, int64_t k, const uint8_t *xg, int64_t G, const int R, float *out, const int BF) {
    (void)G;
    const float *x = (const float *)xg;
    const int NA = R == 1 ? 4 : R == 2 ? 2 : 1;
    __m512 acc[4][8];
    for (int a = 0; a < NA; a++) Z_LOOP acc[a][r] = _mm512_setzero_ps();
    int64_t e = 0;
    for (; e + 16 * NA <= k; e += 16 * NA) {
        bd_prefetch(w + 2 * e + BD_PREFETCH, 32 * NA);
        _Pragma("GCC unroll 4") for (int a = 0; a < NA; a++) {
            const __m512 wv = z_ld16(w + 2 * (e + 16 * a), BF);
            Z_LOOP acc[a][r] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + r * k + e + 16 * a), acc[a][r]);
        }
    }
    for (; e + 16 <= k; e += 16) {
        const __m512 wv = z_ld16(w + 2 * e, BF);
        Z_LOOP acc[0][r] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + r * k + e), acc[0][r]);
    }
    Z_LOOP {
        __m512 s = acc[0][r];
        for (int a = 1; a < NA; a++) s = _mm512_add_ps(s, acc[a][r]);
        float t = _mm512_reduce_add_ps(s);
        for (int64_t i = e; i < k; i++) t += z_f1(w + 2 * i, BF) * x[r * k + i];
        out[r] = t;
    }
}

ZI void kz_f16(const uint8_t *w, int64_t k, const uint8_t *xg, int64_t G, const int R, float *out) {
    kz_fx(w, k, xg, G, R, out, 0);
}

ZI void kz_bf16(const uint8_t *w, int64_t k, const uint8_t *xg, int64_t G, const int R, float *out) {
    kz_fx(w, k, xg, G, R, out, 1);
}

// BD_X16(T): R rows against a tile of 16 weight rows, out[r*16 + j]. Per
// block the tile's 8 quant vectors are loaded (and for the 4-bit types
// split into nibbles, the fifth bits added as 16s) once; a row's block is
// then 8 dpbusd of the 16 rows' unsigned quants against 4 of its int8 at a
// time (broadcast), starting from -off·Σq, so each lane ends with one
// output's whole integer sum: one conversion and one FMA a block and row
// (and one more FMA for Q4_1's and Q5_1's mins against d·Σq).
ZI void kz_x16(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, const int R, float *out, const int T) {
    const int64_t k = 32 * nb, bb = X16_BLOCK(T);
    const int off = X16_OFF(T), mins = T == 3 || T == 7;
    const float *dx = (const float *)(xg + X16_D(k, nb, 0, G)), *sx = (const float *)(xg + X16_S(k, nb, 0, G));
    const int32_t *cx = (const int32_t *)(xg + X16_C(k, nb, 0, G));
    __m512 acc[16];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * bb;
        bd_prefetch(wb + X16_PF(R), bb);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
        const __m512 mw = mins ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wb + X16_MIN))) : dw;
        __m512i wv[8];
        x16_unpack(wb, T, wv);
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {
            const uint8_t *xr = xg + r * k + 32 * b;
            // Two chains when few rows give the core little else to overlap.
            __m512i s = _mm512_set1_epi32(-off * cx[r * nb + b]), s2 = _mm512_setzero_si512();
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
                const __m512i xv = _mm512_set1_epi32((int32_t)le32(xr + 4 * c));
                if (R <= 2 && (c & 1))
                    s2 = _mm512_dpbusd_epi32(s2, wv[c], xv);
                else
                    s = _mm512_dpbusd_epi32(s, wv[c], xv);
            }
            if (R <= 2) s = _mm512_add_epi32(s, s2);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(dx[r * nb + b])), acc[r]);
            if (mins) acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx[r * nb + b]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm512_store_ps(out + 16 * r, acc[r]);
}

#define Z_X16T(T)                                                                          \
    static void rows_x16_##T(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, int R, float *out) { \
        switch (R) {                                                                       \
        case 1: kz_x16(w, nb, xg, G, 1, out, T); break;                                    \
        case 2: kz_x16(w, nb, xg, G, 2, out, T); break;                                    \
        case 3: kz_x16(w, nb, xg, G, 3, out, T); break;                                    \
        case 4: kz_x16(w, nb, xg, G, 4, out, T); break;                                    \
        case 5: kz_x16(w, nb, xg, G, 5, out, T); break;                                    \
        case 6: kz_x16(w, nb, xg, G, 6, out, T); break;                                    \
        case 7: kz_x16(w, nb, xg, G, 7, out, T); break;                                    \
        case 8: kz_x16(w, nb, xg, G, 8, out, T); break;                                    \
        case 9: kz_x16(w, nb, xg, G, 9, out, T); break;                                    \
        case 10: kz_x16(w, nb, xg, G, 10, out, T); break;                                  \
        case 11: kz_x16(w, nb, xg, G, 11, out, T); break;                                  \
        case 12: kz_x16(w, nb, xg, G, 12, out, T); break;                                  \
        case 13: kz_x16(w, nb, xg, G, 13, out, T); break;                                  \
        case 14: kz_x16(w, nb, xg, G, 14, out, T); break;                                  \
        case 15: kz_x16(w, nb, xg, G, 15, out, T); break;                                  \
        case 16: kz_x16(w, nb, xg, G, 16, out, T); break;                                  \
        }                                                                                  \
    }
Z_X16T(2)
Z_X16T(3)
Z_X16T(6)
Z_X16T(7)
Z_X16T(8)
#undef Z_X16T

// BD_X16(t)'s tile function.
static void rows_x16_vnni(int t, const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, int R, float *out) {
    switch (t) {
    case 2: rows_x16_2(w, nb, xg, G, R, out); break;
    case 3: rows_x16_3(w, nb, xg, G, R, out); break;
    case 6: rows_x16_6(w, nb, xg, G, R, out); break;
    case 7: rows_x16_7(w, nb, xg, G, R, out); break;
    default: rows_x16_8(w, nb, xg, G, R, out); break;
    }
}

// BD_X16(T), Q4_K (T 12) or Q5_K (13): R rows (up to 8) against a tile
// of 16 weight rows, out[r*16 + j]. Per block the 16 rows' scales and
// mins are unpacked into lanes once; per sub-block its 8 quant vectors (one nibble of a
// pair's) are split once, and a row's sub-block is 8 dpbusd against 4 of
// its int8 at a time, times the lanes' scale (vpmulld) into an int32 sum
// for the block; the mins meet the rows' sums per sub-block in 4 dpwssd.
// Then two conversions and two FMAs a block and row, where the row layout
// pays one of each per 64 products.
ZI void kz_k4x(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, const int R, float *out, const int T) {
    const int64_t k = 256 * nb, bb = X16_BLOCK(T);
    const float *dx = (const float *)(xg + K16_D(k, nb, 0, G));
    const int32_t *sx = (const int32_t *)(xg + K16_S(k, nb, 0, G));
    const __m512i m4 = _mm512_set1_epi8(0x0f), m6 = _mm512_set1_epi32(0x3f3f3f3f), m0f = _mm512_set1_epi32(0x0f0f0f0f),
                  m03 = _mm512_set1_epi32(0x03030303), mff = _mm512_set1_epi32(0xff),
                  lohalf = _mm512_set1_epi32(0x000000ff), hibyte = _mm512_set1_epi32(0x00ff0000);
    __m512 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * bb;
        bd_prefetch(wb + X16_PF(R), bb);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wb + X16_MIN)));
        const __m512i u0 = _mm512_loadu_si512((const void *)(wb + K16_SC)),
                      u1 = _mm512_loadu_si512((const void *)(wb + K16_SC + 64)),
                      u2 = _mm512_loadu_si512((const void *)(wb + K16_SC + 128));
        // bd_k4_scales lane by lane: scales 0-3, 4-7 and mins 0-3, 4-7 as bytes.
        const __m512i sc03 = _mm512_and_si512(u0, m6);
        const __m512i sc47 = _mm512_or_si512(_mm512_and_si512(u2, m0f),
                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), m03), 4));
        const __m512i mn03 = _mm512_and_si512(u1, m6);
        const __m512i mn47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m0f),
                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), m03), 4));
        // Mins in int16 pairs: pair p is sub-blocks 2p (low) and 2p+1 (high).
        __m512i mp[4];
        for (int h = 0; h < 2; h++) {
            const __m512i mn = h ? mn47 : mn03;
            mp[2 * h] = _mm512_or_si512(_mm512_and_si512(mn, lohalf), _mm512_and_si512(_mm512_slli_epi32(mn, 8), hibyte));
            mp[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(mn, 16), lohalf),
                    _mm512_and_si512(_mm512_srli_epi32(mn, 8), hibyte));
        }
        __m512i tot[8];
        for (int r = 0; r < R; r++) tot[r] = _mm512_setzero_si512();
        for (int sb = 0; sb < 8; sb++) {
            const __m512i scs = _mm512_and_si512(_mm512_srli_epi32(sb < 4 ? sc03 : sc47, 8 * (sb & 3)), mff);
            const uint8_t *qp = wb + K16_QSOF(T) + 512 * (sb / 2);
            __m512i wv[8];
            for (int c = 0; c < 8; c++) {
                const __m512i v = _mm512_loadu_si512((const void *)(qp + 64 * c));
                wv[c] = _mm512_and_si512((sb & 1) ? _mm512_srli_epi16(v, 4) : v, m4);
                if (T == 13) { // Q5_K's fifth bits, 16 each
                    uint64_t hm;
                    memcpy(&hm, wb + K5_QH + 64 * sb + 8 * c, 8);
                    wv[c] = _mm512_mask_add_epi8(wv[c], (__mmask64)hm, wv[c], _mm512_set1_epi8(0x10));
                }
            }
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                const uint8_t *xr = xg + r * k + 256 * b + 32 * sb;
                __m512i s = _mm512_setzero_si512(), s2 = _mm512_setzero_si512();
                _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
                    const __m512i xv = _mm512_set1_epi32((int32_t)le32(xr + 4 * c));
                    if (R <= 2 && (c & 1))
                        s2 = _mm512_dpbusd_epi32(s2, wv[c], xv);
                    else
                        s = _mm512_dpbusd_epi32(s, wv[c], xv);
                }
                if (R <= 2) s = _mm512_add_epi32(s, s2);
                tot[r] = _mm512_add_epi32(tot[r], _mm512_mullo_epi32(s, scs));
            }
        }
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            const int32_t *sp = sx + (r * nb + b) * 4;
            __m512i mins = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mp[0], _mm512_set1_epi32(sp[0]));
            mins = _mm512_dpwssd_epi32(mins, mp[1], _mm512_set1_epi32(sp[1]));
            mins = _mm512_dpwssd_epi32(mins, mp[2], _mm512_set1_epi32(sp[2]));
            mins = _mm512_dpwssd_epi32(mins, mp[3], _mm512_set1_epi32(sp[3]));
            const __m512 dxr = _mm512_set1_ps(dx[r * nb + b]);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[r]), _mm512_mul_ps(d, dxr), acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(dmin, dxr), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm512_store_ps(out + 16 * r, acc[r]);
}


ZI void kz_k16(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, const int R, float *out) {
    kz_k4x(w, nb, xg, G, R, out, 12);
}

// BD_X16(13) (Q5_K): kz_k16 with each quant's fifth bit added as 16.
ZI void kz_k5x16(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, const int R, float *out) {
    kz_k4x(w, nb, xg, G, R, out, 13);
}

// BD_X16(14) (Q6_K): R rows (up to 8) against a tile of 16 weight rows,
// out[r*16 + j]. Per sub-block of 16 elements its three quant vectors
// give four of 16 rows' unsigned 6-bit values (4 elements each), and a
// row's sub-block is 4 dpbusd starting from -32 times its activations'
// sum (the k6 layout's), times the lanes' int8 scales (vpmulld) into one
// int32 sum for the block: one conversion and one FMA a block and row,
// where the row layout pays them per 64 products.
ZI void kz_q6x16(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, const int R, float *out) {
    const int64_t k = 256 * nb;
    const float *dx = (const float *)(xg + K6_D(k, nb, 0, G));
    const int32_t *sx = (const int32_t *)(xg + K6_S(k, nb, 0, G));
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    __m512 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * 3360;
        bd_prefetch(wb + X16_PF(R), 3360);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
        __m512i tot[8];
        for (int r = 0; r < R; r++) tot[r] = _mm512_setzero_si512();
        for (int s = 0; s < 16; s++) {
            const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(wb + Q6_SC + 16 * s)));
            const uint8_t *qp = wb + Q6_QS + 192 * s;
            const __m512i a = _mm512_loadu_si512((const void *)qp), bv = _mm512_loadu_si512((const void *)(qp + 64)),
                          c = _mm512_loadu_si512((const void *)(qp + 128));
            __m512i wv[4];
            wv[0] = _mm512_or_si512(_mm512_and_si512(a, m4), _mm512_and_si512(_mm512_slli_epi16(c, 4), m30));
            wv[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), m4), _mm512_and_si512(_mm512_slli_epi16(c, 2), m30));
            wv[2] = _mm512_or_si512(_mm512_and_si512(bv, m4), _mm512_and_si512(c, m30));
            wv[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(bv, 4), m4), _mm512_and_si512(_mm512_srli_epi16(c, 2), m30));
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                const uint8_t *xr = xg + r * k + 256 * b + 16 * s;
                __m512i si = _mm512_set1_epi32(sx[(r * nb + b) * 16 + s]);
                _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++)
                    si = _mm512_dpbusd_epi32(si, wv[q], _mm512_set1_epi32((int32_t)le32(xr + 4 * q)));
                tot[r] = _mm512_add_epi32(tot[r], _mm512_mullo_epi32(si, sc));
            }
        }
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[r]), _mm512_mul_ps(d, _mm512_set1_ps(dx[r * nb + b])), acc[r]);
    }
    for (int r = 0; r < R; r++) _mm512_store_ps(out + 16 * r, acc[r]);
}

// The row functions qgemm.c calls for the AVX-512 variant.
#define Z_ROWFN(n)                                                                         \
    static void rows_##n##_vnni(const uint8_t *w, int64_t nb, const uint8_t *xg, int64_t G, \
            int R, float *out) {                                                           \
        switch (R) {                                                                       \
        case 1: kz_##n(w, nb, xg, G, 1, out); break;                                       \
        case 2: kz_##n(w, nb, xg, G, 2, out); break;                                       \
        case 3: kz_##n(w, nb, xg, G, 3, out); break;                                       \
        case 4: kz_##n(w, nb, xg, G, 4, out); break;                                       \
        case 5: kz_##n(w, nb, xg, G, 5, out); break;                                       \
        case 6: kz_##n(w, nb, xg, G, 6, out); break;                                       \
        case 7: kz_##n(w, nb, xg, G, 7, out); break;                                       \
        case 8: kz_##n(w, nb, xg, G, 8, out); break;                                       \
        }                                                                                  \
    }

Z_ROWFN(q4_0)
Z_ROWFN(q4_1)
Z_ROWFN(q5_0)
Z_ROWFN(q5_1)
Z_ROWFN(q8_0)
Z_ROWFN(q4_K)
Z_ROWFN(q5_K)
Z_ROWFN(q6_K)
Z_ROWFN(f16)
Z_ROWFN(bf16)
Z_ROWFN(k16) // BD_X16(12)'s tiles: R rows against 16 weight rows
Z_ROWFN(k5x16) // BD_X16(13)'s
Z_ROWFN(q6x16) // BD_X16(14)'s

#undef Z_ROWFN
#undef Z_KERNEL32
#undef Z_PAIR
#undef Z_HIGH5
#undef Z_LOOP
#undef ZI
