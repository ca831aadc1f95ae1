// Paged attention for a prefill on AMX tiles, where the op allows bf16
// products (runtime.Op.BF16Products: set for models whose weights are
// block-quantized, which already carry far larger errors than a bf16
// rounding of Q, K, P and V).
//
// The same FlashAttention loop as attend_avx512.c's row kernel, in its
// transposed form, so the online softmax stays lane-wise: per pass of 32
// cache positions and each tile of 16 query rows,
//   Sᵀ [16 keys][16 rows] = K [16 keys][32 d] · (Qᵀ·scale) pairs [16][16 rows][2]
//     (tmm0 for keys 0-15, tmm1 for keys 16-31, summed over head-dim strips),
//   then the max, exp and sums with the rows in the vector lanes, and
//   Oᵀ [16 d][16 rows] = Vᵀ [16 d][32 keys] · P pairs [16 key pairs][16 rows][2],
// one tile a 16 dims of the head, added to the f32 Oᵀ after its rescale.
// K's rows go to the tile unit as they are (converted to bf16); V is
// transposed once per pass for all the task's row tiles. A task is up to
// four row tiles (64 query rows: tokens of one sequence × the query heads
// of one kv head), so each pass's conversions serve 64 rows.

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attend.h"
#include "vec_avx512.h"

#define AA_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,amx-tile,amx-bf16")))
#define AA_TILES (BD_AMX_ROWS / 16) // row tiles a task holds
#define AA_KEYS 32 // cache positions a pass

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) aa_tilecfg;

// Scratch layout (64-byte aligned pieces), for head dimension dim:
//   qb  bf16 [AA_TILES][dim/32][16 pairs][16 rows][2]  Qᵀ·scale as B tiles
//   ot  f32  [AA_TILES][dim][16 rows]                  Oᵀ
//   kb  bf16 [AA_KEYS][dim]                            the pass's keys
//   vt  bf16 [dim/16][16 d][AA_KEYS]                   the pass's values, transposed
//   sb  f32  [AA_KEYS][16 rows]                        a tile's Sᵀ for the pass
//   pb  bf16 [16 key pairs][16 rows][2]                its P
//   tb  f32  [dim][16 rows]                            its Vᵀ·P
static int64_t aa_qb(int64_t dim) { return AA_TILES * dim * 16 * 2; }
static int64_t aa_ot(int64_t dim) { return AA_TILES * dim * 16 * 4; }
static int64_t aa_kb(int64_t dim) { return AA_KEYS * dim * 2; }
static int64_t aa_vt(int64_t dim) { return dim * AA_KEYS * 2; }
static int64_t aa_sb(void) { return AA_KEYS * 16 * 4; }
static int64_t aa_pb(void) { return AA_KEYS * 16 * 2; }

int64_t bd_attend_amx_bytes(int64_t dim) {
    return aa_qb(dim) + aa_ot(dim) + aa_kb(dim) + aa_vt(dim) + aa_sb() + aa_pb() + dim * 16 * 4;
}

// bd_attend_amx_begin and _end bracket a thread's calls: the tile
// configuration (palette 1, eight tiles of 16 rows of 64 bytes).
// (A constant: GCC 12 dropped the stores of a configuration built on the
// stack, not seeing that ldtilecfg reads them.)
static const aa_tilecfg aa_cfg __attribute__((aligned(64))) = {
        .palette = 1,
        .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
        .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

AA_TARGET void bd_attend_amx_begin(void) { _tile_loadconfig(&aa_cfg); }

AA_TARGET void bd_attend_amx_end(void) { _tile_release(); }

// 16 values of a row of type t (BD_KV_*) from element off, as f32. A
// block cache row's off is a multiple of 16 (dims divide by 32), so the 16
// values are one half of one block, exact (bd_kvq_ld16, f16's too).
AA_TARGET static inline __m512 aa_ld16(const void *base, int64_t off, int t) {
    if (t == BD_KV_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + off))), 16));
    if (t == BD_KV_Q8_0 || t == BD_KV_Q4_0 || t == BD_KV_F16) return bd_kvq_ld16(base, t, off);
    return _mm512_loadu_ps((const float *)base + off);
}

// exp(x) for x <= 0, to about 1e-5 relative: P is rounded to bf16 (2^-9)
// for the product, so bd_exp512's extra terms would be wasted. Below -87.3
// it returns exp(-87.3) (not a subnormal: see bd_exp512); NaN stays NaN.
AA_TARGET static inline __m512 aa_exp(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-87.3f), x); // the second operand (x) when NaN
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693147180559945f), x);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 120), r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

// In-register transpose of a 16×16 f32 block: r[i][j] -> r[j][i].
AA_TARGET static inline void aa_transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4i+c]'s 128-bit lane L holds rows 4i..4i+3 of column 4L+c.
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; c++) {
        const __m512 x0 = _mm512_shuffle_f32x4(u[c], u[4 + c], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512 x1 = _mm512_shuffle_f32x4(u[c], u[4 + c], _MM_SHUFFLE(3, 2, 3, 2));
        const __m512 x2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512 x3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(3, 2, 3, 2));
        r[c] = _mm512_shuffle_f32x4(x0, x2, _MM_SHUFFLE(2, 0, 2, 0));
        r[4 + c] = _mm512_shuffle_f32x4(x0, x2, _MM_SHUFFLE(3, 1, 3, 1));
        r[8 + c] = _mm512_shuffle_f32x4(x1, x3, _MM_SHUFFLE(2, 0, 2, 0));
        r[12 + c] = _mm512_shuffle_f32x4(x1, x3, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

// bd_attend_amx computes the rows of tokens t0..t0+tn-1 (one sequence,
// whose block-table row is row) × the group query heads of kv head g;
// tn·group <= 64, dim % 32 == 0, dim <= 256. pos[t] is token t's position:
// it sees cache positions 0..pos[t]. The cache is f32, bf16, f16, Q8_0 or Q4_0 (kvt).
// work holds bd_attend_amx_bytes(dim) (64-byte aligned); the thread is
// between _begin and _end.
AA_TARGET void bd_attend_amx(const void *q, int q_bf16, const void *kc, const void *vc, int kvt,
        const int32_t *row, const int32_t *pos, int64_t t0, int64_t tn, int64_t g, int64_t hq, int64_t hkv,
        int64_t dim, int64_t bs, float scale, void *out, void *work) {
    const int64_t group = hq / hkv, rows = tn * group, kvrow = hkv * dim, ds = dim / 32, nt = (rows + 15) / 16;
    uint8_t *w = work;
    uint16_t *qb = (uint16_t *)w;
    float *ot = (float *)(w += aa_qb(dim));
    uint16_t *kb = (uint16_t *)(w += aa_ot(dim));
    uint16_t *vt = (uint16_t *)(w += aa_kb(dim));
    float *sb = (float *)(w += aa_vt(dim));
    uint16_t *pb = (uint16_t *)(w += aa_sb());
    float *tb = (float *)(w += aa_pb());

    // Qᵀ·scale in B-tile pairs: per tile and 32 dims, the 16 rows' bf16
    // pairs as a 16×16 block of 32-bit values, transposed so each pair
    // index is a tile row. Lanes past the task's rows hold zeros and the
    // tile's largest position: their scores are 0, finite, and unused.
    int32_t nv[AA_TILES * 16] __attribute__((aligned(64)));
    int64_t tmin[AA_TILES], tmax[AA_TILES], nmax = 0;
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t i = 0; i < nt; i++) {
        int64_t off[16];
        tmin[i] = INT64_MAX, tmax[i] = 0;
        for (int64_t r = 0; r < 16; r++) {
            const int64_t rr = i * 16 + r;
            off[r] = -1;
            if (rr >= rows) continue;
            const int64_t t = t0 + rr / group, h = g * group + rr % group;
            off[r] = (t * hq + h) * dim;
            nv[rr] = pos[t] + 1;
            tmin[i] = nv[rr] < tmin[i] ? nv[rr] : tmin[i];
            tmax[i] = nv[rr] > tmax[i] ? nv[rr] : tmax[i];
        }
        for (int64_t r = 0; r < 16; r++)
            if (off[r] < 0) nv[i * 16 + r] = (int32_t)tmax[i];
        for (int64_t j = 0; j < ds; j++) {
            __m512 v[16];
            for (int64_t r = 0; r < 16; r++) {
                if (off[r] < 0) {
                    v[r] = _mm512_setzero_ps();
                    continue;
                }
                const __m512 a = aa_ld16(q, off[r] + 32 * j, q_bf16 ? BD_KV_BF16 : BD_KV_F32),
                             b = aa_ld16(q, off[r] + 32 * j + 16, q_bf16 ? BD_KV_BF16 : BD_KV_F32);
                v[r] = (__m512)_mm512_cvtne2ps_pbh(_mm512_mul_ps(b, vscale), _mm512_mul_ps(a, vscale));
            }
            aa_transpose16(v);
            uint16_t *dst = qb + (i * ds + j) * 512;
            for (int64_t p = 0; p < 16; p++) _mm512_store_ps((float *)(dst + 32 * p), v[p]);
        }
        nmax = tmax[i] > nmax ? tmax[i] : nmax;
    }
    memset(ot, 0, (size_t)(nt * dim * 16 * 4));
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 m[AA_TILES], l[AA_TILES], c[AA_TILES];
    for (int64_t i = 0; i < AA_TILES; i++) m[i] = ninf, l[i] = _mm512_setzero_ps();
    // P's two key vectors (lanes = rows) interleaved into pairs.
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
            21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);

    for (int64_t p0 = 0; p0 < nmax; p0 += AA_KEYS) {
        const int64_t nk = nmax - p0 < AA_KEYS ? nmax - p0 : AA_KEYS;
        int64_t koff[AA_KEYS];
        for (int64_t k = 0; k < AA_KEYS; k++) {
            const int64_t p = p0 + k;
            koff[k] = k < nk ? ((int64_t)row[p / bs] * bs + p % bs) * kvrow + g * dim : -1;
        }
        // The keys as bf16 rows; zeros past nk (scores 0, then masked).
        for (int64_t k = 0; k < AA_KEYS; k++) {
            uint16_t *dst = kb + k * dim;
            if (koff[k] < 0) {
                memset(dst, 0, (size_t)dim * 2);
                continue;
            }
            for (int64_t d = 0; d < dim; d += 32) {
                const __m512 a = aa_ld16(kc, koff[k] + d, kvt),
                             b = aa_ld16(kc, koff[k] + d + 16, kvt);
                _mm512_storeu_si512((void *)(dst + d), (__m512i)_mm512_cvtne2ps_pbh(b, a));
            }
        }
        // The values transposed, 16 dims at a time: Vᵀ[d][key] for 32 keys.
        for (int64_t d0 = 0; d0 < dim; d0 += 16) {
            __m512 lo[16], hi[16];
            for (int64_t k = 0; k < 16; k++) {
                lo[k] = koff[k] < 0 ? _mm512_setzero_ps() : aa_ld16(vc, koff[k] + d0, kvt);
                hi[k] = koff[16 + k] < 0 ? _mm512_setzero_ps() : aa_ld16(vc, koff[16 + k] + d0, kvt);
            }
            aa_transpose16(lo);
            aa_transpose16(hi);
            uint16_t *dst = vt + d0 * AA_KEYS;
            for (int64_t d = 0; d < 16; d++)
                _mm512_store_si512((void *)(dst + d * AA_KEYS), (__m512i)_mm512_cvtne2ps_pbh(hi[d], lo[d]));
        }
        // The tiles whose rows see any of these keys: i0..nt-1 (a block's
        // later rows see more).
        int64_t i0 = 0;
        while (i0 < nt && p0 >= tmax[i0]) i0++;
        for (int64_t i = i0; i < nt; i++) {
            _tile_zero(0);
            _tile_zero(1);
            for (int64_t j = 0; j < ds; j++) {
                _tile_loadd(4, qb + (i * ds + j) * 512, 64);
                _tile_loadd(2, kb + 32 * j, dim * 2);
                _tile_dpbf16ps(0, 2, 4);
                _tile_loadd(3, kb + 16 * dim + 32 * j, dim * 2);
                _tile_dpbf16ps(1, 3, 4);
            }
            _tile_stored(0, sb, 64);
            _tile_stored(1, sb + 256, 64);
            // The online softmax, rows in the lanes.
            const float *si = sb;
            __m512 s[AA_KEYS];
            for (int64_t k = 0; k < AA_KEYS; k++) s[k] = _mm512_load_ps(si + 16 * k);
            // A pass below every row's position needs no mask.
            const int full = p0 + AA_KEYS <= tmin[i];
            __mmask16 valid[AA_KEYS];
            if (!full) {
                // Causal mask (and the pass's tail): key p0+k is seen by the
                // rows with p0+k < n.
                const __m512i n = _mm512_load_si512(nv + 16 * i);
                for (int64_t k = 0; k < AA_KEYS; k++) {
                    valid[k] = _mm512_cmplt_epi32_mask(_mm512_set1_epi32((int32_t)(p0 + k)), n);
                    s[k] = _mm512_mask_blend_ps(valid[k], ninf, s[k]);
                }
            }
            __m512 mx[AA_KEYS / 2];
            for (int64_t k = 0; k < AA_KEYS / 2; k++) mx[k] = _mm512_max_ps(s[2 * k], s[2 * k + 1]);
            for (int64_t w2 = AA_KEYS / 4; w2 >= 1; w2 /= 2)
                for (int64_t k = 0; k < w2; k++) mx[k] = _mm512_max_ps(mx[2 * k], mx[2 * k + 1]);
            const __m512 mt = _mm512_max_ps(m[i], mx[0]);
            // Rows that have seen no key yet keep m = -inf; their c must not
            // be exp(-inf - -inf) = NaN. (A NaN score makes mt NaN: its row
            // is NaN from here, as in the f32 kernels.)
            const __mmask16 live = _mm512_cmp_ps_mask(mt, ninf, _CMP_NEQ_OQ);
            c[i] = _mm512_mask_blend_ps(live, _mm512_set1_ps(1.0f), aa_exp(_mm512_sub_ps(m[i], mt)));
            m[i] = mt;
            for (int64_t k = 0; k < AA_KEYS; k++) {
                s[k] = aa_exp(_mm512_sub_ps(s[k], mt));
                if (!full) s[k] = _mm512_maskz_mov_ps(valid[k], s[k]);
            }
            uint16_t *pi = pb;
            for (int64_t k = 0; k < AA_KEYS; k += 2) {
                _mm512_store_si512((void *)(pi + k * 16),
                        _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(s[k + 1], s[k])));
                mx[k / 2] = _mm512_add_ps(s[k], s[k + 1]);
            }
            for (int64_t w2 = AA_KEYS / 4; w2 >= 1; w2 /= 2)
                for (int64_t k = 0; k < w2; k++) mx[k] = _mm512_add_ps(mx[2 * k], mx[2 * k + 1]);
            l[i] = _mm512_fmadd_ps(l[i], c[i], mx[0]);
            // Vᵀ·P, four 16-dim tiles at a time (tmm0-3; Vᵀ in tmm4-6).
            _tile_loadd(7, pb, 64);
            float *ti = tb;
            for (int64_t d0 = 0; d0 < dim; d0 += 64) {
                _tile_zero(0);
                _tile_zero(1);
                _tile_loadd(4, vt + d0 * AA_KEYS, 64);
                _tile_dpbf16ps(0, 4, 7);
                _tile_loadd(5, vt + (d0 + 16) * AA_KEYS, 64);
                _tile_dpbf16ps(1, 5, 7);
                if (d0 + 64 <= dim) {
                    _tile_zero(2);
                    _tile_zero(3);
                    _tile_loadd(6, vt + (d0 + 32) * AA_KEYS, 64);
                    _tile_dpbf16ps(2, 6, 7);
                    _tile_loadd(4, vt + (d0 + 48) * AA_KEYS, 64);
                    _tile_dpbf16ps(3, 4, 7);
                    _tile_stored(2, ti + (d0 + 32) * 16, 64);
                    _tile_stored(3, ti + (d0 + 48) * 16, 64);
                }
                _tile_stored(0, ti + d0 * 16, 64);
                _tile_stored(1, ti + (d0 + 16) * 16, 64);
            }
            // Oᵀ = Oᵀ·c + Vᵀ·P.
            float *o = ot + i * dim * 16;
            for (int64_t d = 0; d < dim; d++)
                _mm512_store_ps(o + d * 16, _mm512_fmadd_ps(_mm512_load_ps(o + d * 16), c[i], _mm512_load_ps(ti + d * 16)));
        }
    }
    // Oᵀ/l back to rows, 16 dims at a time. Every used row saw at least
    // key 0, so l > 0 there.
    for (int64_t i = 0; i < nt; i++) {
        float inv[16] __attribute__((aligned(64)));
        _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f),
                _mm512_mask_blend_ps(_mm512_cmp_ps_mask(l[i], _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_ps(1.0f), l[i])));
        const float *o = ot + i * dim * 16;
        for (int64_t d0 = 0; d0 < dim; d0 += 16) {
            __m512 v[16];
            for (int64_t d = 0; d < 16; d++) v[d] = _mm512_load_ps(o + (d0 + d) * 16);
            aa_transpose16(v);
            for (int64_t r = 0; r < 16 && i * 16 + r < rows; r++) {
                const int64_t rr = i * 16 + r, t = t0 + rr / group, h = g * group + rr % group;
                const int64_t off = (t * hq + h) * dim + d0;
                const __m512 y = _mm512_mul_ps(v[r], _mm512_set1_ps(inv[r]));
                if (q_bf16)
                    _mm256_storeu_si256((__m256i *)((uint16_t *)out + off), (__m256i)_mm512_cvtneps_pbh(y));
                else
                    _mm512_storeu_ps((float *)out + off, y);
            }
        }
    }
}
