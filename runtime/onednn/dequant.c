// Dequantization of GGUF tensor types; see dequant.h. Each body follows
// runtime/quant's decoder of the same type (itself ggml's dequantize_row_*)
// operation for operation, in f32, with the block offsets of ggml-common.h.

// No a*b+c may become one FMA: ggml's reference rounds the product first.
// (For finite inputs the products here are exact, so only NaN payloads
// could differ; the pragma makes it hold for every input and every -march.)
#pragma GCC optimize("fp-contract=off")

#include "dequant.h"

#include <string.h>

#define BD_INLINE static inline __attribute__((always_inline))

// fp16_f is ggml's GGML_FP16_TO_FP32 (ggml_compute_fp16_to_fp32): exact for
// every finite half; a NaN keeps sign and payload and comes out quiet (the
// multiply by 2^-112 quiets it, as the explicit form in runtime/quant does).
BD_INLINE float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

BD_INLINE uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

BD_INLINE float fp16_f(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float normalized = bits_f((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = bits_f((two_w >> 17) | (126u << 23)) - 0.5f;
    return bits_f(sign | (two_w < (1u << 27) ? f_bits(denormalized) : f_bits(normalized)));
}

BD_INLINE uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

BD_INLINE uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

BD_INLINE void row_f16(const uint8_t *restrict s, float *restrict y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = fp16_f(le16(s + 2 * i));
}

BD_INLINE void row_bf16(const uint8_t *restrict s, float *restrict y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = bits_f((uint32_t)le16(s + 2 * i) << 16);
}

// Q4_0 {f16 d; u8 qs[16]}: x = (nibble - 8) * d.
BD_INLINE void row_q4_0(const uint8_t *restrict s, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, s += 18, y += 32) {
        const float d = fp16_f(le16(s));
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((int)(s[2 + j] & 0x0f) - 8) * d;
            y[j + 16] = (float)((int)(s[2 + j] >> 4) - 8) * d;
        }
    }
}

// Q4_1 {f16 d; f16 m; u8 qs[16]}: x = nibble*d + m.
BD_INLINE void row_q4_1(const uint8_t *restrict s, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, s += 20, y += 32) {
        const float d = fp16_f(le16(s)), m = fp16_f(le16(s + 2));
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(s[4 + j] & 0x0f) * d + m;
            y[j + 16] = (float)(s[4 + j] >> 4) * d + m;
        }
    }
}

// Q5_0 {f16 d; u8 qh[4]; u8 qs[16]}: x = ((nibble | bit<<4) - 16) * d.
BD_INLINE void row_q5_0(const uint8_t *restrict s, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, s += 22, y += 32) {
        const float d = fp16_f(le16(s));
        const uint32_t qh = le32(s + 2);
        for (int j = 0; j < 16; j++) {
            const int x0 = (int)((s[6 + j] & 0x0f) | (((qh >> j) << 4) & 0x10)) - 16;
            const int x1 = (int)((s[6 + j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
            y[j] = (float)x0 * d;
            y[j + 16] = (float)x1 * d;
        }
    }
}

// Q5_1 {f16 d; f16 m; u8 qh[4]; u8 qs[16]}: x = (nibble | bit<<4)*d + m.
BD_INLINE void row_q5_1(const uint8_t *restrict s, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, s += 24, y += 32) {
        const float d = fp16_f(le16(s)), m = fp16_f(le16(s + 2));
        const uint32_t qh = le32(s + 4);
        for (int j = 0; j < 16; j++) {
            const int x0 = (int)((s[8 + j] & 0x0f) | (((qh >> j) << 4) & 0x10));
            const int x1 = (int)((s[8 + j] >> 4) | ((qh >> (j + 12)) & 0x10));
            y[j] = (float)x0 * d + m;
            y[j + 16] = (float)x1 * d + m;
        }
    }
}

// Q8_0 {f16 d; i8 qs[32]}: x = q * d.
BD_INLINE void row_q8_0(const uint8_t *restrict s, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, s += 34, y += 32) {
        const float d = fp16_f(le16(s));
        for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)s[2 + j] * d;
    }
}

// The j-th 6-bit scale and min of a Q4_K/Q5_K block (ggml's
// get_scale_min_k4).
BD_INLINE void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}: x = (d*sc)*nibble - dmin*m.
BD_INLINE void row_q4_K(const uint8_t *restrict s, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, s += 144) {
        const float d = fp16_f(le16(s)), dmin = fp16_f(le16(s + 2));
        const uint8_t *sc12 = s + 4, *q = s + 16;
        for (int is = 0; is < 8; is += 2, q += 32, y += 64) {
            uint8_t sc, m;
            scale_min_k4(is, sc12, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            scale_min_k4(is + 1, sc12, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) y[l] = d1 * (float)(q[l] & 0x0f) - m1;
            for (int l = 0; l < 32; l++) y[32 + l] = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

// Q5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: Q4_K with a
// fifth bit, bit 2k (2k+1) of qh[l] for sub-block 2k (2k+1).
BD_INLINE void row_q5_K(const uint8_t *restrict s, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, s += 176) {
        const float d = fp16_f(le16(s)), dmin = fp16_f(le16(s + 2));
        const uint8_t *sc12 = s + 4, *qh = s + 16, *ql = s + 48;
        uint8_t u1 = 1, u2 = 2;
        for (int is = 0; is < 8; is += 2, ql += 32, y += 64, u1 <<= 2, u2 <<= 2) {
            uint8_t sc, m;
            scale_min_k4(is, sc12, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            scale_min_k4(is + 1, sc12, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                y[l] = d1 * (float)((ql[l] & 0x0f) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                y[32 + l] = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

// Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: x = (d*scale)*(q - 32),
// q's low 4 bits from ql, high 2 from qh; see runtime/quant's q6KRow.
BD_INLINE void row_q6_K(const uint8_t *restrict s, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, s += 210) {
        const float d = fp16_f(le16(s + 208));
        const uint8_t *ql = s, *qh = s + 128;
        const int8_t *sc = (const int8_t *)(s + 192);
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = (int)((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4) - 32;
                const int q2 = (int)((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) - 32;
                const int q3 = (int)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                const int q4 = (int)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                y[l] = d * sc[is] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

// One block table: ggml's type numbers, elements and bytes per block.
typedef struct {
    int type, elems, bytes;
} bd_block;

static const bd_block blocks[] = {
    {0, 1, 4},      // F32
    {1, 1, 2},      // F16
    {2, 32, 18},    // Q4_0
    {3, 32, 20},    // Q4_1
    {6, 32, 22},    // Q5_0
    {7, 32, 24},    // Q5_1
    {8, 32, 34},    // Q8_0
    {12, 256, 144}, // Q4_K
    {13, 256, 176}, // Q5_K
    {14, 256, 210}, // Q6_K
    {30, 1, 2},     // BF16
};

BD_INLINE void dequant_body(int type, const uint8_t *restrict s, float *restrict y, int64_t n) {
    switch (type) {
    case 0: memcpy(y, s, (size_t)n * sizeof(float)); break;
    case 1: row_f16(s, y, n); break;
    case 2: row_q4_0(s, y, n / 32); break;
    case 3: row_q4_1(s, y, n / 32); break;
    case 6: row_q5_0(s, y, n / 32); break;
    case 7: row_q5_1(s, y, n / 32); break;
    case 8: row_q8_0(s, y, n / 32); break;
    case 12: row_q4_K(s, y, n / 256); break;
    case 13: row_q5_K(s, y, n / 256); break;
    case 14: row_q6_K(s, y, n / 256); break;
    case 30: row_bf16(s, y, n); break;
    }
}

#define BD_DEQUANT_ARGS int type, const uint8_t *restrict s, float *restrict y, int64_t n

__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
static void dequant_avx512(BD_DEQUANT_ARGS) { dequant_body(type, s, y, n); }

__attribute__((target("avx2,fma")))
static void dequant_avx2(BD_DEQUANT_ARGS) { dequant_body(type, s, y, n); }

static void dequant_base(BD_DEQUANT_ARGS) { dequant_body(type, s, y, n); }

int bd_dequant_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("fma"))
        return BD_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return BD_ISA_AVX2;
    return BD_ISA_BASE;
}

void bd_dequant_q8_0(const void *src, float *dst, int64_t n) { row_q8_0(src, dst, n / 32); }

void bd_dequant_q4_0(const void *src, float *dst, int64_t n) { row_q4_0(src, dst, n / 32); }

void bd_dequant_f16(const void *src, float *dst, int64_t n) { row_f16(src, dst, n); }

int bd_dequant_row(int type, const void *src, int64_t src_bytes, float *dst, int64_t n, int isa) {
    const bd_block *b = NULL;
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        if (blocks[i].type == type) b = &blocks[i];
    if (!b) return BD_DEQUANT_UNSUPPORTED;
    if (n < 0 || n % b->elems != 0 || n / b->elems > INT64_MAX / b->bytes ||
            src_bytes != n / b->elems * b->bytes)
        return BD_DEQUANT_LENGTH;
    const int have = bd_dequant_isa();
    if (isa == BD_ISA_AUTO) isa = have;
    if (isa < BD_ISA_BASE || isa > have) return BD_DEQUANT_NO_ISA;
    if (n == 0) return BD_DEQUANT_OK;
    switch (isa) {
    case BD_ISA_AVX512: dequant_avx512(type, src, dst, n); break;
    case BD_ISA_AVX2: dequant_avx2(type, src, dst, n); break;
    default: dequant_base(type, src, dst, n); break;
    }
    return BD_DEQUANT_OK;
}

void bd_f32_to_bf16(const float *src, uint16_t *dst, int64_t n); // dnnl_ops.c

static void dequant_isa(int isa, BD_DEQUANT_ARGS) {
    switch (isa) {
    case BD_ISA_AVX512: dequant_avx512(type, s, y, n); break;
    case BD_ISA_AVX2: dequant_avx2(type, s, y, n); break;
    default: dequant_base(type, s, y, n); break;
    }
}

int bd_dequant_rows(int type, const void *w, int64_t rows, int64_t k, void *out, int out_bf16, int nthreads) {
    const bd_block *b = NULL;
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        if (blocks[i].type == type) b = &blocks[i];
    if (!b) return BD_DEQUANT_UNSUPPORTED;
    if (rows < 0 || k < 0 || k % b->elems != 0 || k / b->elems > INT64_MAX / b->bytes ||
            (rows > 0 && k > INT64_MAX / rows) || nthreads < 1)
        return BD_DEQUANT_LENGTH;
    const int64_t row_bytes = k / b->elems * b->bytes;
    if (rows > 0 && row_bytes > INT64_MAX / rows) return BD_DEQUANT_LENGTH;
    if (rows == 0 || k == 0) return BD_DEQUANT_OK;
    const int isa = bd_dequant_isa();
    // Chunks of 256 elements (whole blocks of every type) keep a bf16
    // row's f32 staging on the stack.
    const int64_t chunk = 256;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (rows * k >= (1 << 16))
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *src = (const uint8_t *)w + r * row_bytes;
        if (!out_bf16) {
            dequant_isa(isa, type, src, (float *)out + r * k, k);
            continue;
        }
        float buf[256];
        uint16_t *dst = (uint16_t *)out + r * k;
        for (int64_t c = 0; c < k; c += chunk) {
            const int64_t n = k - c < chunk ? k - c : chunk;
            dequant_isa(isa, type, src + c / b->elems * b->bytes, buf, n);
            bd_f32_to_bf16(buf, dst + c, n);
        }
    }
    return BD_DEQUANT_OK;
}
