// The paged-attention kernels that bd_paged_attention (dnnl_ops.c) hands
// blocks of query rows to, and their limits; bench/qkernels calls them too.
#ifndef BD_ATTEND_H
#define BD_ATTEND_H

#include <stdint.h>

// KV cache element types (the kernels' and bd_paged_attention's kvt): f32,
// bf16, f16, or ggml's Q8_0 ({f16 d; i8 q[32]}) or Q4_0 ({f16 d; u8
// qs[16]}) blocks along each row, so a head's dim is a multiple of 32 and
// element offset e of a row is in block e/32 (kvquant.c writes f16 and
// the blocks).
enum { BD_KV_F32 = 0, BD_KV_BF16 = 1, BD_KV_Q8_0 = 2, BD_KV_Q4_0 = 3, BD_KV_F16 = 4 };

// BD_KV_BLOCK is a block type's bytes a block of 32.
#define BD_KV_BLOCK(kvt) ((kvt) == BD_KV_Q4_0 ? 18 : 34)

// attend_avx512.c
#define BD_FA_MAXDIM 256    // bd_attend_rows_avx512's largest head dimension
#define BD_FA_MINROWS 8     // fewer rows than this that hold a whole group go to the group kernel
#define BD_FA_GROUP 8       // bd_attend_group_avx512's most query heads
#define BD_FA_GROUPDIM 128  // and head dimension
void bd_attend_rows_avx512(const void *q, int q_bf16, const void *kc, const void *vc,
        int kvt, const int32_t *row, const int32_t *pos, int64_t t0, int64_t tn,
        int64_t h0, int64_t hc, int64_t g, int64_t hq, int64_t hkv, int64_t dim, int64_t bs,
        float scale, void *out);
void bd_attend_group_avx512(const void *q, int q_bf16, const void *kc, const void *vc,
        int kvt, const int32_t *row, int64_t n, int64_t ti, int64_t g, int64_t hq, int64_t hkv,
        int64_t dim, int64_t bs, int64_t group, float scale, void *out);
// A decode token's positions go through the group kernel in parts of
// BD_FA_PART, whose states merge in order (flash-decoding): a long
// context's parts can run on different threads with the same result.
#define BD_FA_PART 512
// A part kernel: bd_attend_group_part_avx512 or _bf16.
typedef void (*bd_attend_part_fn)(const void *q, int q_bf16, const void *kc, const void *vc, int kvt,
        const int32_t *row, int64_t p_begin, int64_t p_end, int64_t ti, int64_t g, int64_t hq, int64_t hkv,
        int64_t dim, int64_t bs, int64_t group, float scale, float *st);
void bd_attend_group_part_avx512(const void *q, int q_bf16, const void *kc, const void *vc,
        int kvt, const int32_t *row, int64_t p_begin, int64_t p_end, int64_t ti, int64_t g, int64_t hq,
        int64_t hkv, int64_t dim, int64_t bs, int64_t group, float scale, float *st);
void bd_attend_group_merge(float *st, const float *part, int64_t group, int64_t dim);
void bd_attend_group_finish(const float *st, int q_bf16, int64_t ti, int64_t g, int64_t hq, int64_t dim,
        int64_t group, void *out);
// The row and group kernels on a bf16 or Q8_0 cache with bf16 products
// (AVX512-BF16; dim % 32 == 0): bd_paged_attention's with
// runtime.Op.BF16Products where no AMX tiles take the rows. A Q8_0
// cache's tile is rounded to bf16 in scratch first.
void bd_attend_group_part_bf16(const void *q, int q_bf16, const void *kc, const void *vc,
        int kvt, const int32_t *row, int64_t p_begin, int64_t p_end, int64_t ti, int64_t g, int64_t hq,
        int64_t hkv, int64_t dim, int64_t bs, int64_t group, float scale, float *st);
void bd_attend_rows_bf16(const void *q, int q_bf16, const void *kc, const void *vc,
        int kvt, const int32_t *row, const int32_t *pos, int64_t t0, int64_t tn,
        int64_t h0, int64_t hc, int64_t g, int64_t hq, int64_t hkv, int64_t dim, int64_t bs,
        float scale, void *out);
void bd_attend_group_bf16(const void *q, int q_bf16, const void *kc, const void *vc,
        int kvt, const int32_t *row, int64_t n, int64_t ti, int64_t g, int64_t hq, int64_t hkv,
        int64_t dim, int64_t bs, int64_t group, float scale, void *out);

// attend_amx.c
#define BD_AMX_ROWS 64 // query rows a task holds: four tiles of 16
int64_t bd_attend_amx_bytes(int64_t dim);
void bd_attend_amx_begin(void);
void bd_attend_amx_end(void);
void bd_attend_amx(const void *q, int q_bf16, const void *kc, const void *vc, int kvt,
        const int32_t *row, const int32_t *pos, int64_t t0, int64_t tn, int64_t g, int64_t hq, int64_t hkv,
        int64_t dim, int64_t bs, float scale, void *out, void *work);

#endif
