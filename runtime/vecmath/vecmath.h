// Host-side vector math for the samplers (runtime/models/llm): a decode
// step samples each sequence's next token from a row of the vocabulary's
// logits, 150k values for Qwen, on the host whatever the device.
#ifndef BD_VECMATH_H
#define BD_VECMATH_H

#include <stdint.h>

// bd_vm_argmax_f32 and _f64 return the first index of the largest of x's
// n (>= 1) values, as a scalar scan keeping the first strictly larger
// value does: a NaN never wins, and a NaN x[0] stays the answer.
int64_t bd_vm_argmax_f32(const float *x, int64_t n);
int64_t bd_vm_argmax_f64(const double *x, int64_t n);

// bd_vm_exp_weights sets x[i] = exp((x[i] - m) / t) for i < n, writes to
// idx the indices whose weight is >= min_p and > 0, in order, stores
// their count in *count, and returns their sum.
double bd_vm_exp_weights(double *x, int64_t n, double m, double t, double min_p, int32_t *idx, int64_t *count);

// bd_vm_logsumexp_f32 returns m + log(sum of exp(x[i] - m)), m the largest
// of x's n (>= 1) values; NaN when any value is NaN.
double bd_vm_logsumexp_f32(const float *x, int64_t n);

// bd_vm_force_level makes the calls use their portable forms (0), the
// AVX2 ones (1) or the AVX-512 ones (2, where the CPU has them), for the
// tests; -1 restores the CPU's choice.
void bd_vm_force_level(int level);
int bd_vm_level(void);

#endif
