// Matrix products with weights that stay in GGUF block layout (issue 21):
// Y[m][n_out] = X[m][k] · W[n_out][k]ᵀ, W's rows stored as ggml stores
// them (row n is k/BlockElems blocks of the type, rows back to back), X and
// Y f32. The activations are quantized to int8 per block as llama.cpp does
// (blocks of 32 for Q4_0…Q8_0, of 256 with sums per 16 for the K types),
// the products summed in integers (AVX2 maddubs, AVX-512 VNNI dpbusd and
// dpwssd) and the block scales applied in f32. Decode steps (m up to a few
// rows) stream each weight row once for all m rows; prefill (m in the
// hundreds) tiles W so a tile is reused from L2 for every group of rows.
#ifndef BROKERD_QGEMM_H
#define BROKERD_QGEMM_H

#include <stddef.h>
#include <stdint.h>

#include "dequant.h" // BD_ISA_*

// Return values of bd_qgemm.
#define BD_QGEMM_OK 0
#define BD_QGEMM_UNSUPPORTED -1 // a weight type this file has no kernel for
#define BD_QGEMM_SIZE -2        // a size <= 0, k not whole blocks, w_bytes not
                                // n_out rows, ldy < n_out, a product past
                                // BD_QGEMM_MAX, or work too small
#define BD_QGEMM_NO_ISA -3      // the forced variant is not on this CPU
#define BD_QGEMM_NOMEM -4       // work was NULL and allocating it failed

// BD_QGEMM_MAX bounds k, n_out, m and every element count and byte size
// the call derives from them (2^40), so no index arithmetic can overflow.
#define BD_QGEMM_MAX ((int64_t)1 << 40)

// bd_qgemm computes y[i*ldy + j] = sum_l x[i*k + l] * W[j][l] for i < m,
// j < n_out, where W (w_bytes bytes) holds n_out rows of k elements of
// ggml type wtype: Q4_0 (2), Q4_1 (3), Q5_0 (6), Q5_1 (7), Q8_0 (8) with k a
// multiple of 32, Q4_K (12), Q5_K (13), Q6_K (14) with k a multiple of 256
// (activations quantized to int8 per block), or F16 (1), BF16 (30) with any
// k (activations used as they are, weights converted to f32 in registers:
// the matrix x vector for 16-bit weights at decode). Other columns of y are
// not written.
//
// isa picks the variant: BD_ISA_BASE (portable C), BD_ISA_AVX2 (AVX2, FMA,
// F16C: maddubs on 256-bit vectors), BD_ISA_AVX512 (AVX-512 F/BW/VL/DQ with
// VNNI: dpbusd and dpwssd on 512-bit vectors) or BD_ISA_AUTO
// (bd_qgemm_isa()). All variants quantize the activations to the same int8
// values and sum the same integers; they differ only in the order of the
// f32 sums.
//
// nthreads (>= 1) OpenMP threads share the rows of W (and the rows of X
// when W has few rows); work below about 2^16 multiply-adds runs on one.
// The call does not change the calling thread's OpenMP settings.
//
// work, when not NULL, is scratch of work_bytes >= bd_qgemm_work_bytes()
// for the quantized activations (any alignment; 64-byte alignment keeps
// its vectors whole); with NULL the call allocates and frees it. F16 and
// BF16 need none.
//
// Every size is checked before anything is read, written or allocated: a
// refused call returns its code and touches no memory. With the block
// types a row of x that holds an infinity or NaN gives NaN in its row of y
// (the float types propagate them as arithmetic does).
int bd_qgemm(int wtype, const void *w, int64_t w_bytes, int64_t n_out,
        int64_t k, const float *x, int64_t m, float *y, int64_t ldy,
        int isa, int nthreads, void *work, int64_t work_bytes);

// bd_qgemm_part is one product of bd_qgemm_multi: n_out rows of W
// (w_bytes bytes) into y (row stride ldy), plus bias (n_out f32) when it is
// not NULL.
typedef struct {
    const void *w;
    int64_t w_bytes, n_out;
    const float *bias;
    float *y;
    int64_t ldy;
} bd_qgemm_part;

// bd_qgemm_multi is bd_qgemm for up to BD_QGEMM_PARTS products of one
// weight type by the same x, as one call: x is quantized once and the
// parts' rows are shared among the threads as if they were one matrix's
// (a decoder's q, k and v projections: k and v alone are too small to
// keep a wide host's threads busy). Each part's bias is added to its
// outputs as they are written. Sizes are checked as bd_qgemm checks them,
// every part's before anything is touched.
#define BD_QGEMM_PARTS 8
int bd_qgemm_multi(int wtype, const bd_qgemm_part *parts, int count, int64_t k, const float *x, int64_t m,
        int isa, int nthreads, void *work, int64_t work_bytes);

// bd_qgemm_work_bytes is the scratch bd_qgemm needs for m rows of k
// activations against weights of wtype, or a negative BD_QGEMM_* code when
// bd_qgemm would refuse those sizes.
int64_t bd_qgemm_work_bytes(int wtype, int64_t k, int64_t m);

// BD_X16(t) is ggml type t (Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, Q4_K 12, Q5_K 13, Q6_K 14) relaid
// by 16 rows for the VNNI kernel (not a ggml type). Per tile of 16 rows,
// per block: the 16 rows' f16 scales (32 bytes), for Q4_1 and Q5_1 their
// f16 mins (32), for Q5_0 and Q5_1 their fifth bits as 8 masks of 64 bits
// (mask c bit 4j+i: row j's element 4c+i), then the quants as 8 vectors of
// 64 bytes, vector c holding each row's elements 4c..4c+3 in turn: Q8_0's
// bytes XORed with 0x80 (unsigned, for dpbusd); the 4-bit types' as 4
// vectors whose low nibbles are vectors 0-3 and high nibbles 4-7 (byte
// 4j+i of vector L is row j's qs[4L+i], as ggml stores it); the K types'
// per block of 256 in qx16.h. The same bytes
// a block as the ggml type, so bd_x16_relayout rewrites a matrix in
// place. One dpbusd then adds four of a block's products for 16 outputs
// with no sums across lanes, where the row layout takes a dpbusd, a
// conversion and an FMA per 64 products of one output. bd_qgemm takes it
// as wtype with n_out a multiple of 16; its products are the ggml type's
// with the block's integers summed whole before the f32 steps (as the
// portable variant sums them).
#define BD_X16_BASE 1000
#define BD_X16(t) (BD_X16_BASE + (t))

// bd_x16_relayout rewrites n rows of k weights of ggml type t (one of
// BD_X16's) at w between ggml's layout and BD_X16(t)'s (to_x16 nonzero:
// into it), in place, with nthreads threads. n must be a multiple of 16
// and k of the type's block (BD_QGEMM_SIZE otherwise; BD_QGEMM_UNSUPPORTED for another
// type); BD_QGEMM_NOMEM if its per-thread tile copy cannot be had, with w
// unchanged.
int bd_x16_relayout(int t, void *w, int64_t n, int64_t k, int to_x16, int nthreads);

// bd_x16_row dequantizes row id of a BD_X16(t) matrix of n rows of k at w
// into out (k f32), as ggml dequantizes that row in t's layout (a gather
// from a relaid table). Returns BD_QGEMM_OK, BD_QGEMM_UNSUPPORTED, or
// BD_QGEMM_SIZE for sizes bd_x16_relayout refuses or id outside [0, n).
int bd_x16_row(int t, const void *w, int64_t n, int64_t k, int64_t id, float *out);

// bd_qgemm_isa is the variant BD_ISA_AUTO runs on this CPU: BD_ISA_AVX512
// needs AVX512-VNNI besides F/BW/VL/DQ (a Skylake-SP without it runs AVX2).
int bd_qgemm_isa(void);

// bd_qgemm_read_sum sums bytes (a multiple of 128) at p, read by nthreads
// OpenMP threads in 256-bit loads (AVX2): the benchmarks time it as the
// host's read bandwidth.
uint64_t bd_qgemm_read_sum(const void *p, int64_t bytes, int nthreads);

#endif
