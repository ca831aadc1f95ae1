// Provisional C kernels of the decoder ops (runtime/llmops_pending.go) until
// h/llmops lands. Each output element is reduced by one thread in a fixed
// order, so a row's result does not depend on the other rows of the call.
#ifndef BROKERD_LLMOPS_PENDING_H
#define BROKERD_LLMOPS_PENDING_H

#include <stdint.h>

#include "dnnl_ops.h"

void bd_rms_norm(const bd_device *d, const float *x, const float *g, int64_t rows, int64_t n, float eps, float *out);
void bd_silu(const bd_device *d, const float *x, int64_t n, float *out);
void bd_swiglu(const bd_device *d, const float *x, int64_t rows, int64_t inter, float *out);
// Returns -1, or the first row whose position is negative.
int64_t bd_rope(const bd_device *d, const float *x, const int32_t *pos, const float *freq,
        int64_t t, int64_t h, int64_t dim, float *out);
// Returns -1, or the first row whose slot is outside the cache.
int64_t bd_kv_write(const bd_device *d, const float *src, const int32_t *slots, int64_t t,
        int64_t row, int64_t nslots, float *cache);
// Returns -1, or the first row whose sequence, position or block is out of range.
int64_t bd_paged_attention(const bd_device *d, const float *q, const float *kc, const float *vc,
        const int32_t *btab, const int32_t *seq, const int32_t *pos, int64_t t, int64_t hq,
        int64_t dim, int64_t nblocks, int64_t bs, int64_t hkv, int64_t s, int64_t maxb,
        float scale, float *out);

#endif
