// A memory read bandwidth probe with vector loads, for the decode
// bandwidth limit: bench/benchkit.ReadBandwidth's scalar Go loop reads
// about 1.6× less than vector loads do on the same machine (bench/RESULTS.md),
// and the engines' kernels read their weights with vector loads.
#include "readbw.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct part {
	const uint8_t *p;
	size_t n;
	uint64_t sum;
};

__attribute__((target("avx2"))) static void *read_avx2(void *arg) {
	struct part *t = arg;
	__m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
	for (size_t i = 0; i + 128 <= t->n; i += 128) {
		a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(t->p + i)));
		a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(t->p + i + 32)));
		a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(t->p + i + 64)));
		a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(t->p + i + 96)));
	}
	a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
	uint64_t s[4];
	_mm256_storeu_si256((__m256i *)s, a0);
	t->sum = s[0] + s[1] + s[2] + s[3];
	return NULL;
}

static void *read_scalar(void *arg) {
	struct part *t = arg;
	const uint64_t *q = (const uint64_t *)t->p;
	uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
	for (size_t i = 0; i + 4 <= t->n / 8; i += 4) {
		s0 += q[i];
		s1 += q[i + 1];
		s2 += q[i + 2];
		s3 += q[i + 3];
	}
	t->sum = s0 + s1 + s2 + s3;
	return NULL;
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double bd_read_bandwidth(size_t bytes, int threads, int reps, int *vector) {
	if (threads < 1) threads = 1;
	if (threads > 256) threads = 256;
	bytes = bytes / (128 * (size_t)threads) * (128 * (size_t)threads);
	uint8_t *buf = aligned_alloc(4096, bytes);
	if (!buf) return 0;
	for (size_t i = 0; i < bytes; i++) buf[i] = (uint8_t)i;
	__builtin_cpu_init();
	int avx2 = __builtin_cpu_supports("avx2");
	*vector = avx2;
	void *(*fn)(void *) = avx2 ? read_avx2 : read_scalar;
	struct part parts[256];
	pthread_t tid[256];
	double best = 0;
	volatile uint64_t sink = 0;
	for (int r = 0; r < reps; r++) {
		double t0 = now();
		for (int i = 0; i < threads; i++) {
			parts[i].p = buf + bytes / threads * i;
			parts[i].n = bytes / threads;
			pthread_create(&tid[i], NULL, fn, &parts[i]);
		}
		for (int i = 0; i < threads; i++) {
			pthread_join(tid[i], NULL);
			sink += parts[i].sum;
		}
		double bw = bytes / (now() - t0);
		if (bw > best) best = bw;
	}
	free(buf);
	return best;
}
