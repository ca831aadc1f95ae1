#ifndef BROKERD_READBW_H
#define BROKERD_READBW_H
#include <stddef.h>
// bd_read_bandwidth reads a buffer of bytes (far larger than the caches)
// with threads threads, reps times, and returns the best bytes per second;
// *vector says whether it used AVX2 loads (else 64-bit scalar ones).
double bd_read_bandwidth(size_t bytes, int threads, int reps, int *vector);
#endif
