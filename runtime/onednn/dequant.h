// Dequantization of GGUF tensor types in C: ggml's block types decoded to
// f32 with the same bits as runtime/quant.Dequantize (and so as ggml's own
// dequantize_row_*), for the CPU kernels to build on. Types are ggml's
// numbers (enum ggml_type); layouts are runtime/quant's.
#ifndef BROKERD_DEQUANT_H
#define BROKERD_DEQUANT_H

#include <stdint.h>

// Return values of bd_dequant_row.
#define BD_DEQUANT_OK 0
#define BD_DEQUANT_UNSUPPORTED -1 // a type this file does not decode
#define BD_DEQUANT_LENGTH -2      // n not whole blocks, or src_bytes not n's bytes
#define BD_DEQUANT_NO_ISA -3      // the forced instruction set is not on this CPU

// Instruction-set variants: the same C, compiled for each target and picked
// at run time as bd_paged_attention's are. All give the same bits: the
// arithmetic is per element with no reassociation, and contraction into
// FMA is off for the whole file.
#define BD_ISA_AUTO -1
#define BD_ISA_BASE 0
#define BD_ISA_AVX2 1
#define BD_ISA_AVX512 2

// bd_dequant_row decodes n elements of type from src (src_bytes bytes) into
// dst with the variant isa (BD_ISA_AUTO: the widest this CPU has). It checks
// the lengths first and writes nothing when they are wrong.
int bd_dequant_row(int type, const void *src, int64_t src_bytes, float *dst,
        int64_t n, int isa);

// bd_dequant_q8_0 decodes n values (n/32 whole Q8_0 blocks) at src into
// dst without bd_dequant_row's checks, for kernels that have made them: the
// portable attention over a Q8_0 KV cache widens a row per key.
void bd_dequant_q8_0(const void *src, float *dst, int64_t n);
// bd_dequant_q4_0 is bd_dequant_q8_0 for Q4_0 blocks, bd_dequant_f16 for
// n f16 values.
void bd_dequant_q4_0(const void *src, float *dst, int64_t n);
void bd_dequant_f16(const void *src, float *dst, int64_t n);

// bd_dequant_isa is the variant BD_ISA_AUTO runs on this CPU.
int bd_dequant_isa(void);

// bd_dequant_rows dequantizes rows rows of k elements of type, stored back
// to back from w (whole blocks), into out, row-major: f32, or bf16 rounded
// to nearest even when out_bf16. nthreads OpenMP threads share the rows;
// the widest variant this CPU has runs. Returns BD_DEQUANT_OK,
// BD_DEQUANT_UNSUPPORTED, or BD_DEQUANT_LENGTH for sizes that are not
// whole blocks or overflow, before touching memory.
int bd_dequant_rows(int type, const void *w, int64_t rows, int64_t k, void *out, int out_bf16, int nthreads);

#endif
