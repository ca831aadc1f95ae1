// Provisional decoder kernels; see llmops_pending.h.
#include "llmops_pending.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#define BD_LLM_PAR_MIN (1 << 15)

void bd_rms_norm(const bd_device *d, const float *x, const float *g, int64_t rows, int64_t n, float eps, float *out) {
    omp_set_num_threads(d->nthreads);
#pragma omp parallel for if (rows * n >= BD_LLM_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        for (int64_t i = 0; i < n; i++) o[i] = xr[i] * inv * g[i];
    }
}

static inline float silu(float v) { return v / (1.0f + expf(-v)); }

void bd_silu(const bd_device *d, const float *x, int64_t n, float *out) {
    omp_set_num_threads(d->nthreads);
#pragma omp parallel for if (n >= BD_LLM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = silu(x[i]);
}

void bd_swiglu(const bd_device *d, const float *x, int64_t rows, int64_t inter, float *out) {
    omp_set_num_threads(d->nthreads);
#pragma omp parallel for if (rows * inter >= BD_LLM_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = x + r * 2 * inter, *up = gate + inter;
        float *o = out + r * inter;
        for (int64_t i = 0; i < inter; i++) o[i] = silu(gate[i]) * up[i];
    }
}

int64_t bd_rope(const bd_device *d, const float *x, const int32_t *pos, const float *freq,
        int64_t t, int64_t h, int64_t dim, float *out) {
    for (int64_t r = 0; r < t; r++)
        if (pos[r] < 0) return r;
    const int64_t half = dim / 2;
    omp_set_num_threads(d->nthreads);
#pragma omp parallel for if (t * h * dim >= BD_LLM_PAR_MIN)
    for (int64_t r = 0; r < t; r++) {
        for (int64_t i = 0; i < half; i++) {
            // The angle in double: positions of long contexts times f32
            // frequencies lose too much in f32.
            double a = (double)pos[r] * (double)freq[i];
            float c = (float)cos(a), s = (float)sin(a);
            for (int64_t hd = 0; hd < h; hd++) {
                const float *v = x + (r * h + hd) * dim;
                float *o = out + (r * h + hd) * dim;
                float x1 = v[i], x2 = v[i + half];
                o[i] = x1 * c - x2 * s;
                o[i + half] = x2 * c + x1 * s;
            }
        }
    }
    return -1;
}

int64_t bd_kv_write(const bd_device *d, const float *src, const int32_t *slots, int64_t t,
        int64_t row, int64_t nslots, float *cache) {
    (void)d;
    for (int64_t r = 0; r < t; r++)
        if (slots[r] >= nslots) return r;
    for (int64_t r = 0; r < t; r++)
        if (slots[r] >= 0)
            memcpy(cache + (int64_t)slots[r] * row, src + r * row, (size_t)row * sizeof(float));
    return -1;
}

int64_t bd_paged_attention(const bd_device *d, const float *q, const float *kc, const float *vc,
        const int32_t *btab, const int32_t *seq, const int32_t *pos, int64_t t, int64_t hq,
        int64_t dim, int64_t nblocks, int64_t bs, int64_t hkv, int64_t s, int64_t maxb,
        float scale, float *out) {
    // Check every index first, so a bad one leaves out untouched.
    for (int64_t r = 0; r < t; r++) {
        if (seq[r] < 0 || seq[r] >= s || pos[r] < 0 || pos[r] / bs >= maxb) return r;
        const int32_t *bt = btab + (int64_t)seq[r] * maxb;
        for (int64_t b = 0; b <= pos[r] / bs; b++)
            if (bt[b] < 0 || bt[b] >= nblocks) return r;
    }
    const int64_t group = hq / hkv;
    int64_t work = 0;
    for (int64_t r = 0; r < t; r++) work += (int64_t)(pos[r] + 1) * hq * dim;
    omp_set_num_threads(d->nthreads);
    // One (row, head) per iteration: its scores and sums are reduced in key
    // order by one thread, whatever else the call holds.
#pragma omp parallel for schedule(dynamic, 1) if (work >= BD_LLM_PAR_MIN)
    for (int64_t rh = 0; rh < t * hq; rh++) {
        const int64_t r = rh / hq, h = rh % hq, kvh = h / group;
        const float *qv = q + rh * dim;
        const int32_t *bt = btab + (int64_t)seq[r] * maxb;
        float *o = out + rh * dim;
        memset(o, 0, (size_t)dim * sizeof(float));
        // Online softmax: a running maximum m and sum l rescale the
        // accumulated values when a larger score comes.
        float m = -INFINITY, l = 0;
        for (int64_t j = 0; j <= pos[r]; j++) {
            const int64_t slot = (int64_t)bt[j / bs] * bs + j % bs;
            const float *kv = kc + (slot * hkv + kvh) * dim;
            const float *vv = vc + (slot * hkv + kvh) * dim;
            float dot = 0;
            for (int64_t i = 0; i < dim; i++) dot += qv[i] * kv[i];
            dot *= scale;
            if (dot > m) {
                float c = expf(m - dot); // 0 on the first key
                l *= c;
                for (int64_t i = 0; i < dim; i++) o[i] *= c;
                m = dot;
            }
            float p = expf(dot - m);
            l += p;
            for (int64_t i = 0; i < dim; i++) o[i] += p * vv[i];
        }
        for (int64_t i = 0; i < dim; i++) o[i] /= l;
    }
    return -1;
}
