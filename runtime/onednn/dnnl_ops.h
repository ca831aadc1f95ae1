// C half of the oneDNN adapter: primitive creation and execution through the
// oneDNN 2.6 C API, and the ops oneDNN has no primitive for (gather, masked
// mean-pool, L2-normalize, bf16 conversion). Go calls only these functions,
// so every dnnl_status_t is returned to Go with the step that produced it.
#ifndef BROKERD_ONEDNN_OPS_H
#define BROKERD_ONEDNN_OPS_H

#include <stddef.h>
#include <stdint.h>
#include "attend.h"

#include <dnnl.h>
#include <dnnl_debug.h>

// One device: a CPU engine, its stream, and the OpenMP thread count every
// creation and execution on this device runs with.
typedef struct {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    int nthreads;
} bd_device;

// A created primitive with one memory object per execution argument; the
// memory objects have no buffer of their own, bd_exec points them at the
// caller's buffers.
#define BD_MAX_ARGS 5
typedef struct {
    dnnl_primitive_t prim;
    int nthreads; // fixed at creation by the op's size; see bd_threads_for
    int nargs;
    dnnl_exec_arg_t args[BD_MAX_ARGS];
    // A matmul created with packed weights (bd_matmul_create's pack_b)
    // reads them in wpacked's layout: bd_pack_weights makes that copy of
    // a buffer in wplain's layout. wpack is 0 when the two are the same.
    int wpack;
    dnnl_memory_desc_t wplain, wpacked;
} bd_prim;

dnnl_status_t bd_device_open(int nthreads, bd_device **out, const char **step);
void bd_device_close(bd_device *d);
dnnl_status_t bd_device_wait(bd_device *d, const char **step);

void bd_prim_destroy(bd_prim *p);

// bd_exec binds h0..h3 to the primitive's arguments in creation order
// (unused ones are ignored), executes it and waits for the stream.
dnnl_status_t bd_exec(bd_device *d, bd_prim *p, void *h0, void *h1, void *h2,
        void *h3, void *h4, const char **step);

// Matmul: src [batch?,m,k] x weights [batch?,k,n] (trans_b: stored [batch?,n,k])
// -> dst [batch?,m,n] of dst_dt (f32, or bf16 with bf16 operands: the sum
// accumulates in f32 and is rounded once); batch 0 means 2-D. ab_dt is the
// src/weights type (f32 or bf16); bias is f32 [n]; act is an eltwise algorithm fused as a
// post-op (dnnl_alg_kind_undef for none); scale multiplies the product;
// has_res (2-D, with a bias, f32 dst) adds a residual [m,n] f32 after the
// activation as a binary post-op. Arguments: src, weights, [bias], [res], dst. pack_b (2-D only) lets the kernel
// choose its weights layout: the caller then passes weights packed by
// bd_pack_weights when the prim's wpack is set.
dnnl_status_t bd_matmul_create(bd_device *d, int64_t batch, int64_t m,
        int64_t k, int64_t n, int trans_b, dnnl_data_type_t ab_dt,
        dnnl_data_type_t dst_dt, int has_bias, dnnl_alg_kind_t act, float scale,
        int has_res, int pack_b, bd_prim **out, const char **step);

// Matmul over 4-D operands each described by dims and strides (elements):
// src [b,h,m,k] x weights [b,h,k,n] -> dst [b,h,m,n], so attention reads
// heads straight out of a fused [B,S,3·H·D] projection and writes them
// merged into [B,S,H·D]. scale multiplies the product. Arguments: src,
// weights, dst.
dnnl_status_t bd_matmul4_create(bd_device *d, const int64_t *sdims,
        const int64_t *sstrides, const int64_t *wdims, const int64_t *wstrides,
        const int64_t *ddims, const int64_t *dstrides, dnnl_data_type_t ab_dt,
        dnnl_data_type_t dst_dt, float scale, bd_prim **out, const char **step);

// bd_packed_size is the bytes of p's packed weights.
size_t bd_packed_size(const bd_prim *p);

// bd_relayout rewrites the tensor at ptr from layout from to layout to in
// place (through a temporary copy); ptr must hold the larger of the two.
dnnl_status_t bd_relayout(bd_device *d, const dnnl_memory_desc_t *from,
        const dnnl_memory_desc_t *to, void *ptr, const char **step);

// Add: src0 [rows,n] + src1 [rows,n] (or [1,n] when bcast) -> dst [rows,n].
// Arguments: src0, src1, dst.
dnnl_status_t bd_add_create(bd_device *d, int64_t rows, int64_t n, int bcast,
        bd_prim **out, const char **step);

// Softmax over rows of n f32 values into dst_dt (f32, which may be the
// source itself, or bf16). Arguments: src, dst.
dnnl_status_t bd_softmax_to_create(bd_device *d, int64_t rows, int64_t n,
        dnnl_data_type_t dst_dt, bd_prim **out, const char **step);

// Layer normalisation over the last dimension with separate scale and shift
// ([n] each). Arguments: src, scale, shift, dst.
dnnl_status_t bd_layernorm_create(bd_device *d, int64_t rows, int64_t n,
        float eps, bd_prim **out, const char **step);

// Softmax over the last dimension. Arguments: src, dst.
dnnl_status_t bd_softmax_create(bd_device *d, int64_t rows, int64_t n,
        bd_prim **out, const char **step);

// Pointwise function over count elements; alpha is the algorithm's alpha
// (swish's β: 1 for SiLU). Arguments: src, dst.
dnnl_status_t bd_eltwise_create(bd_device *d, int64_t count,
        dnnl_alg_kind_t alg, float alpha, bd_prim **out, const char **step);

// Permute: a reorder from src, read as dims[0..ndims) row-major, to a
// contiguous dst whose dimension i is src dimension perm[i]. dt is the
// element type of both. Arguments: src, dst.
dnnl_status_t bd_permute_create(bd_device *d, int ndims, const int64_t *dims,
        const int *perm, dnnl_data_type_t dt, bd_prim **out, const char **step);

// Conversion of n elements between f32 and bf16 as a reorder, so it runs on
// the CPU's conversion instructions (avx512_bf16): a plain C loop took a
// third of a bf16 BERT forward pass. Arguments: src, dst.
dnnl_status_t bd_convert_create(bd_device *d, int64_t n, dnnl_data_type_t from_dt,
        dnnl_data_type_t to_dt, bd_prim **out, const char **step);

// Ops without a oneDNN primitive. They run on the caller's thread with the
// device's OpenMP thread count.

// bd_gather copies table rows idx[i] (dim elements of elem bytes) to out; it
// returns the position of the first index outside [0,v) (writing nothing),
// or -1 on success.
int64_t bd_gather(const bd_device *d, const void *table, int64_t v,
        int64_t dim, int64_t elem, const int32_t *idx, int64_t n, void *out);

// bd_masked_mean_pool averages x [b,s,dim] over the positions whose mask
// [b,s] is non-zero (f32 mask, or i32 when mask_i32); rows with no such
// position give zeros.
void bd_masked_mean_pool(const bd_device *d, const float *x, const void *mask,
        int mask_i32, int64_t b, int64_t s, int64_t dim, float *out);

// bd_l2_normalize divides each row of x [rows,dim] by its L2 norm; rows of
// zeros stay zero.
void bd_l2_normalize(const bd_device *d, const float *x, int64_t rows,
        int64_t dim, float *out);

// bd_mask_fill copies x [b, rows/b, n] into out, writing -FLT_MAX where
// mask [b,n] (f32, or i32 when mask_i32) is zero: the masked softmax then
// runs oneDNN's softmax over out in place.
void bd_mask_fill(const bd_device *d, const float *x, const void *mask,
        int mask_i32, int64_t b, int64_t rows, int64_t n, float *out);

// bd_add: out = a + b, n f32 each (the same shape: a residual).
void bd_add(const bd_device *d, const float *a, const float *b, int64_t n, float *out);

// bd_add_bias adds bias [n] to each of y's rows [rows,n] in place (f32).
void bd_add_bias(const bd_device *d, float *y, const float *bias, int64_t rows, int64_t n);

// bd_copy copies bytes from src to dst with the device's threads.
void bd_copy(const bd_device *d, const void *src, void *dst, int64_t bytes);

// Decoder-LLM kernels. A flag *_bf16 says a buffer holds bf16 (else f32);
// all arithmetic is f32.

// bd_rms_norm: x [rows,n] / sqrt(mean(x^2) + eps) * w [n] (f32) -> out.
void bd_rms_norm(const bd_device *d, const void *x, int bf16, const float *w,
        int64_t rows, int64_t n, float eps, void *out);

// bd_swiglu: x [rows, 2*inter] = [gate | up] -> out [rows, inter] =
// silu(gate) * up.
void bd_swiglu(const bd_device *d, const void *x, int bf16, int64_t rows,
        int64_t inter, void *out);

// bd_rope_table writes the rotation table of positions pos [t] and
// inv_freq [half]: for token i, cos then sin of pos[i]·inv_freq, [t][2][half].
void bd_rope_table(const bd_device *d, const int32_t *pos, const float *inv_freq, int64_t t, int64_t half,
        float *tab);

// bd_rope rotates x [t,h,dim] by bd_rope_table's table for dim/2
// (rotate-half).
void bd_rope(const bd_device *d, const void *x, int bf16, const float *tab, int64_t t, int64_t h, int64_t dim,
        void *out);

// bd_kv_write copies row i of x [t, row elements of elem bytes] to slot
// slots[i] of cache [nslots, row]; negative slots are skipped. It returns the
// position of the first slot >= nslots (writing nothing), or -1.
int64_t bd_kv_write(const bd_device *d, const void *x, const int32_t *slots,
        int64_t t, int64_t row, int64_t elem, void *cache, int64_t nslots);
// bd_kv_write_q is bd_kv_write into an f16, Q8_0 or Q4_0 cache (kvt,
// attend.h's BD_KV_*): row i of x (f32, or bf16 when x_bf16) converted to
// f16, or quantized (row % 32 == 0 elements) as ggml's
// quantize_row_q8_0_ref or quantize_row_q4_0_ref quantizes it, bit for
// bit, except that a block holding an infinity or NaN gets d = NaN, so it
// reads back as NaN rather than as ggml's arbitrary values.
int64_t bd_kv_write_q(const bd_device *d, int kvt, const void *x, int x_bf16, const int32_t *slots,
        int64_t t, int64_t row, void *cache, int64_t nslots);
// bd_quant_kv converts n f32 values into f16 (kvt BD_KV_F16), or
// quantizes them (n % 32 == 0) into n/32 blocks of kvt, at y, as
// bd_kv_write_q does; vec picks the AVX-512 form (when the CPU has it) or
// the portable one, for the tests and CopyIn.
void bd_quant_kv(int kvt, const float *x, int64_t n, uint8_t *y, int vec);
// bd_kvq_ld16_row widens n values (a multiple of 16) of a Q8_0 or Q4_0
// row from element off (a multiple of 16) 16 at a time with
// vec_avx512.h's bd_kvq_ld16, the AMX attention's loader, so that the
// tests hold it to the decoders on any CPU with AVX-512; it returns 0
// (writing nothing) on a CPU without.
int bd_kvq_ld16_row(const void *base, int kvt, int64_t off, float *dst, int64_t n);

// bd_paged_attention: causal GQA over a paged cache; see runtime.OpPagedAttention.
// q [t,hq,dim], kc/vc [nblocks,bs,hkv,dim], table [s,maxb], seq [t], pos [t]
// -> out [t,hq,dim]. It checks every index first and returns the first bad
// token (writing nothing) with *why set, or -1. runtime.Op.BF16Products
// lets it round Q, K, P and V to bf16: bf16 says so, and lets the work
// on a bf16 cache run the bf16 row and group kernels where the CPU has
// AVX512-BF16; amx (the caller has also checked bd_qamx_available) sends
// prefill blocks to AMX tiles. kvt is the cache's BD_KV_ type: a Q8_0 or
// Q4_0 cache (dim % 32 == 0) is widened to f32 a row at a time for the f32
// kernels, as a bf16 one is; with bf16 a tile at a time to bf16 for the
// bf16 kernels; the AMX kernel widens its rows as it loads them.
int64_t bd_paged_attention(const bd_device *d, const void *q, int q_bf16,
        const void *kc, const void *vc, int kvt, const int32_t *table,
        const int32_t *seq, const int32_t *pos, int64_t t, int64_t hq,
        int64_t hkv, int64_t dim, int64_t nblocks, int64_t bs, int64_t s,
        int64_t maxb, float scale, int amx, int bf16, void *out, int *why);

// bf16 <-> f32 conversion (round to nearest even, NaN kept quiet).
void bd_f32_to_bf16(const float *src, uint16_t *dst, int64_t n);

// gemv_bf16.c: bf16 x bf16 products of a few rows (decode) with
// AVX512-BF16; y[i*n + j] = Σ_l x[i*k + l]·w[j*k + l].
int bd_have_avx512bf16(void);
void bd_gemv_bf16(const uint16_t *w, int64_t n, int64_t k, const uint16_t *x, int64_t m,
        float *y, int nthreads);
void bd_bf16_to_f32(const uint16_t *src, float *dst, int64_t n);

// Host memory aligned to 64 bytes (4 KiB from 64 KiB up); size must be a
// multiple of 64.
void *bd_alloc(size_t size);
void bd_free(void *p);

// bd_bf16_matmul_works reports whether this library and CPU can create a bf16
// matmul (oneDNN needs avx512_core or newer for bf16).
dnnl_status_t bd_bf16_matmul_works(bd_device *d, const char **step);

// bd_direct_matmul is the benchmark baseline: an f32-output matmul m x k x n
// with ab_dt inputs created and run straight through the C API with its own
// engine and stream, no adapter in between. It runs one warm-up execution and
// then times iters executions; *seconds is the total for those.
dnnl_status_t bd_direct_matmul(int64_t m, int64_t n, int64_t k, int iters,
        int nthreads, dnnl_data_type_t ab_dt, double *seconds,
        const char **step);

#endif
