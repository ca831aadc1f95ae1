// Products of a few rows of bf16 activations by bf16 weights (decode steps
// of a bf16 model) with AVX512-BF16's vdpbf16ps: 32 products a
// instruction, summed in f32, the operands as the device holds them (the
// same arithmetic as oneDNN's bf16 matmul), no widening of the weights.
// W is read once per call: a tile of W's rows stays in L2 while every
// group of 8 activation rows passes over it.

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "dnnl_ops.h"
#include "vec_avx512.h"

#define GB_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))
#define GB_TILE_BYTES (512 << 10)

int bd_have_avx512bf16(void) { return bd_have_avx512() && __builtin_cpu_supports("avx512bf16"); }

// R rows of x (stride ldx) against one weight row w of k: out[r]. NA sets
// of accumulators, so a row of few x rows still has several independent
// vdpbf16ps chains in flight.
#define GB_ROW(R, NA)                                                                    \
    GB_TARGET static void gb_row##R(const uint16_t *w, int64_t k, const uint16_t *x,      \
            int64_t ldx, float *out) {                                                   \
        __m512 acc[NA][R];                                                               \
        for (int a = 0; a < NA; a++)                                                     \
            for (int r = 0; r < R; r++) acc[a][r] = _mm512_setzero_ps();                 \
        int64_t e = 0;                                                                   \
        for (; e + 32 * NA <= k; e += 32 * NA) {                                         \
            _mm_prefetch((const char *)(w + e) + 4096, _MM_HINT_T0);                     \
            for (int a = 0; a < NA; a++) {                                               \
                const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + e + 32 * a);        \
                for (int r = 0; r < R; r++)                                              \
                    acc[a][r] = _mm512_dpbf16_ps(acc[a][r], wv,                          \
                            (__m512bh)_mm512_loadu_si512(x + r * ldx + e + 32 * a));     \
            }                                                                            \
        }                                                                                \
        for (; e < k; e += 32) {                                                         \
            const __mmask32 m = k - e >= 32 ? (__mmask32)~0u : (__mmask32)((1ull << (k - e)) - 1); \
            const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, w + e);            \
            for (int r = 0; r < R; r++)                                                  \
                acc[0][r] = _mm512_dpbf16_ps(acc[0][r], wv,                              \
                        (__m512bh)_mm512_maskz_loadu_epi16(m, x + r * ldx + e));         \
        }                                                                                \
        for (int r = 0; r < R; r++) {                                                    \
            __m512 s = acc[0][r];                                                        \
            for (int a = 1; a < NA; a++) s = _mm512_add_ps(s, acc[a][r]);                \
            out[r] = _mm512_reduce_add_ps(s);                                            \
        }                                                                                \
    }
GB_ROW(1, 4)
GB_ROW(2, 2)
GB_ROW(3, 2)
GB_ROW(4, 2)
GB_ROW(5, 1)
GB_ROW(6, 1)
GB_ROW(7, 1)
GB_ROW(8, 1)

typedef void (*gb_rowfn)(const uint16_t *, int64_t, const uint16_t *, int64_t, float *);
static const gb_rowfn gb_rows[9] = {0, gb_row1, gb_row2, gb_row3, gb_row4, gb_row5, gb_row6, gb_row7, gb_row8};

// bd_gemv_bf16: y[i*n + j] = Σ_l x[i*k + l]·w[j*k + l] for i < m, j < n,
// with nthreads threads splitting W's rows. The caller checks sizes and
// bd_have_avx512bf16.
void bd_gemv_bf16(const uint16_t *w, int64_t n, int64_t k, const uint16_t *x, int64_t m,
        float *y, int nthreads) {
    int64_t tile = GB_TILE_BYTES / (2 * k);
    if (tile < 8) tile = 8;
    int nt = (double)m * (double)n * (double)k < (double)(1 << 18) ? 1 : nthreads;
    // nt threads split W's rows, at least 16 each; the team is the whole
    // pool all the same, threads past nt idle (qamx.c, bd_qamx: a smaller
    // team would make libgomp end threads and create them again).
    int T = nt;
    if (n / 16 < T) T = n / 16 < 1 ? 1 : (int)(n / 16);
    if (T == 1) nt = 1;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const int t = omp_get_thread_num();
        const int64_t n0 = t < T ? n * t / T : n, n1 = t < T ? n * (t + 1) / T : n;
        float out[8];
        for (int64_t t0 = n0; t0 < n1; t0 += tile) {
            int64_t t1 = t0 + tile < n1 ? t0 + tile : n1;
            for (int64_t g = 0; g < m; g += 8) {
                int R = m - g < 8 ? (int)(m - g) : 8;
                for (int64_t j = t0; j < t1; j++) {
                    gb_rows[R](w + j * k, k, x + g * k, k, out);
                    for (int r = 0; r < R; r++) y[(g + r) * n + j] = out[r];
                }
            }
        }
    }
}
