// Matrix products with GGUF block-quantized weights on Intel AMX (issue 21):
// Y[m][n_out] = X[m][k] · W[n_out][k]ᵀ as qgemm.h's bd_qgemm, for the row
// counts where the int8 vector kernels run out of arithmetic (16 decode
// streams, prefill). Each thread dequantizes a panel of 16 weight rows to
// bf16 in its own scratch (L1/L2, never the whole matrix), then the tile
// unit multiplies the panel by every row of X (converted to bf16 once per
// call) with TDPBF16PS, accumulating in f32. The weights are read from
// memory once per call.
//
// The results differ from the exact product by the bf16 rounding of each
// dequantized weight and of each activation (relative 2^-8 each), so
// |y - exact| <= 2^-7 · Σ_l |x_l · w_l| bounds them (the tests' tolerance),
// the same order as qgemm's int8 activations.
#ifndef BROKERD_QAMX_H
#define BROKERD_QAMX_H

#include <stdint.h>

// Return values: bd_qgemm's BD_QGEMM_* codes (qgemm.h), and
#define BD_QAMX_NO_AMX -5 // the CPU or the kernel does not give this process AMX

// bd_qamx_available says (1) whether this CPU has AMX-BF16 with
// AVX512-BF16 and the kernel lets this process use the tile data (it asks,
// once: arch_prctl ARCH_REQ_XCOMP_PERM), else 0.
int bd_qamx_available(void);

// bd_qamx_supports says whether bd_qamx has a panel decoder for ggml type
// wtype: Q4_0 (2), Q4_1 (3), Q5_0 (6), Q5_1 (7), Q8_0 (8), Q4_K (12),
// Q5_K (13), Q6_K (14), F16 (1), BF16 (30), and the first six relaid by 16
// rows (qgemm.h's BD_X16; n_out a multiple of 16), whose panels are the
// tiles as they lie.
int bd_qamx_supports(int wtype);

// bd_qamx_work_bytes is the scratch bd_qamx needs for m rows of k against
// weights of wtype with nthreads threads, or a negative BD_QGEMM_* code for
// sizes it refuses (k must be whole blocks of the type and a multiple of 32).
int64_t bd_qamx_work_bytes(int wtype, int64_t k, int64_t m, int nthreads);

// bd_qamx_int8 says whether a product of m rows by weights of wtype runs
// on AMX-INT8 rather than bf16 panels (flags 0): Q8_0 with at most 16
// rows on a CPU that has AMX-INT8 too (bd_qamx keeps the bf16 panels for
// weight rows of 128 MiB or more, which no model has). There the weights'
// own int8 are the tiles' A operand, with no decoding, and the activations are
// quantized to int8 per 32-block as bd_qgemm quantizes them, so the
// results are within bd_qgemm's bound (qgemm.c) rather than the bf16 one.
int bd_qamx_int8(int wtype, int64_t m);

#define BD_QAMX_NO_INT8 1 // flag: bf16 panels even where bd_qamx_int8 holds
// flag: W's rows are [gate | up] (n_out a multiple of 32) and y gets
// silu(gate)·up, n_out/2 columns: y[i*ldy + j] = silu(P[i][j])·P[i][j +
// n_out/2] for the product P, computed as bd_swiglu computes it from P.
// For m >= 64 only (the group passes, which hold a gate panel's and its up
// panel's C tiles at once).
#define BD_QAMX_SWIGLU 2

// bd_qamx computes y[i*ldy + j] = Σ_l x[i*k + l] · W[j][l] for i < m,
// j < n_out, W being w_bytes bytes of n_out rows of k elements of wtype,
// with nthreads OpenMP threads sharing the panels of W; flags: 0,
// BD_QAMX_NO_INT8 or BD_QAMX_SWIGLU. work (work_bytes >=
// bd_qamx_work_bytes, 64-byte aligned) is its scratch; NULL allocates.
// Every size is checked before memory is touched. A non-finite activation
// or weight gives a non-finite result in its row or column.
int bd_qamx(int wtype, const void *w, int64_t w_bytes, int64_t n_out, int64_t k,
        const float *x, int64_t m, float *y, int64_t ldy, int nthreads, int flags, void *work, int64_t work_bytes);

// bd_qamx_panel decodes panel p (weight rows 16p..16p+15, zeros past
// n_out) of W into out (bf16 [16][k]) with the code bd_qamx decodes it
// with, filled in steps increments (1-16) as its overlapped passes fill a
// panel: for the tests, which compare a relaid matrix's panels (BD_X16) with
// the same weights' in GGUF's layout. Needs AVX512-BF16, not AMX
// (BD_QAMX_NO_AMX where the CPU lacks it); sizes are checked as bd_qamx
// checks them.
int bd_qamx_panel(int wtype, const void *w, int64_t w_bytes, int64_t n_out, int64_t k, int64_t p, int steps,
        uint16_t *out);

#endif
