// qkernels times runtime/onednn's quantized products on one thread, in CPU
// time (CLOCK_THREAD_CPUTIME_ID), so another tenant's load moves it less
// than wall time: bd_qamx (AMX tiles) and bd_qgemm (int8 dot products) on
// the same random weights, each the minimum over 15 batches of ITERS calls;
// where qamx takes AMX-INT8 (Q8_0, up to 16 rows), its bf16 panels too.
// Built and run by run.sh; the figures are in bench/RESULTS.md.
//
//	qkernels TYPE N K M ITERS   (TYPE: ggml's number, 8 Q8_0, 12 Q4_K, 13 Q5_K, 14 Q6_K)
//
// and, for a one-stream decode's bandwidth, in wall time on THREADS
// threads: a Q8_0 matrix x one row by bd_qgemm (as the daemon runs it)
// against bd_qgemm_read_sum reading the same bytes, each the best of ITERS
// calls taken alternately, so both see the same caches and neighbours:
//
//	qkernels stream N K THREADS ITERS
//
// and one row through COUNT separate N x K Q8_0 matrices (weights from
// memory once they outgrow the L3), wall time a call:
//
//	qkernels many N K COUNT THREADS
//	e.g. qkernels many 128 896 3000 2   (Qwen2.5-0.5B's k projection)
//
// and a whole decode token's products: one row through every Q8_0 matrix of
// a llama-style decoder (per layer q, k, v, o, gate and up as one, down;
// then the output head), each its own allocation as the engine holds them,
// in the engine's order, against one plain read of all those bytes: the
// time a token's weights cost with nothing else in the step.
//
//	qkernels token LAYERS HIDDEN KVDIM INTER VOCAB THREADS ITERS
//	e.g. qkernels token 12 1024 256 2816 128256 2 10   (llama-12x1024)
//
// and bd_qamx on THREADS threads as the daemon calls it, in wall time, the
// best of 15 batches of ITERS calls (swiglu: gate and up with SwiGLU, N/2
// outputs):
//
//	qkernels threads TYPE N K M THREADS ITERS [swiglu]
//
// and a TOKENS-token prefill's attention over one sequence on one thread, in
// CPU time, the minimum over 15 batches of ITERS: the f32 row kernel
// (attend_avx512.c, blocks of 16 query rows) against the AMX one
// (attend_amx.c, blocks of up to 64), with their largest difference:
//
//	qkernels attend HQ HKV DIM TOKENS ITERS
//	e.g. qkernels attend 14 2 64 512 5   (Qwen2.5-0.5B's heads)
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attend.h"
#include "dequant.h"
#include "qamx.h"
#include "qgemm.h"

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double wall_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// A Q8_0 matrix of random quants, every block's scale 2^-7, in whole pages
// (the bytes past the matrix random too: the plain read may round up).
static uint8_t *q8_matrix(long n, long k, long *bytes) {
    *bytes = n * (k / 32) * 34;
    const long alloc = (*bytes + 4095) / 4096 * 4096;
    uint8_t *w = aligned_alloc(4096, alloc);
    if (!w) return NULL;
    for (long i = 0; i < alloc; i++) w[i] = (uint8_t)rand();
    for (long b = 0; b < *bytes; b += 34) w[b] = 0, w[b + 1] = 0x20;
    return w;
}

// qtype_block sets TYPE's block bytes and elements (8 Q8_0, 12 Q4_K,
// 13 Q5_K, 14 Q6_K, and BD_X16 of 8, 12, 13 and 14: 1008, 1012, 1013,
// 1014, the weights relaid by 16 rows) and says whether it is one of those.
static int qtype_block(int type, int *eb, int *ee) {
    const int t = type == BD_X16(8) || (type >= BD_X16(12) && type <= BD_X16(14)) ? type - BD_X16(0) : type;
    *eb = t == 12 ? 144 : t == 13 ? 176 : t == 14 ? 210 : 34;
    *ee = t >= 12 ? 256 : 32;
    return t == 8 || (t >= 12 && t <= 14);
}

// rand_problem seeds rand with 1 and makes N x K weights of TYPE (random
// quants, scales fixed at 2^-7: d, and dmin for the K types, so the
// products stay finite) and M x K activations in [0, 1].
static void rand_problem(int type, long n, long k, long m, uint8_t **w, long *wb, float **x) {
    if (type >= BD_X16(0)) type -= BD_X16(0); // made in ggml's layout, relaid by the caller
    int eb, ee;
    qtype_block(type, &eb, &ee);
    *wb = n * (k / ee) * eb;
    *w = malloc(*wb);
    srand(1);
    for (long i = 0; i < *wb; i++) (*w)[i] = (uint8_t)rand();
    for (long b = 0; b < *wb; b += eb) {
        uint8_t *d = *w + b + (type == 14 ? 208 : 0);
        d[0] = 0, d[1] = 0x20;
        if (type == 12 || type == 13) (*w)[b + 2] = 0, (*w)[b + 3] = 0x20;
    }
    *x = malloc(m * k * 4);
    for (long i = 0; i < m * k; i++) (*x)[i] = rand() / (float)RAND_MAX;
}

// many: one row through COUNT separate Q8_0 matrices of N x K by
// bd_qgemm, in order, as a decode step meets its small products: their
// weights come from memory, not the caches, once COUNT of them outgrow
// the L3. Wall time a call, best of 7 passes.
static int many(long n, long k, long count, int threads) {
    if (n <= 0 || k <= 0 || k % 32 != 0 || count < 1 || threads < 1) {
        fprintf(stderr, "many: N, K, COUNT, THREADS positive; K whole blocks of 32\n");
        return 2;
    }
    srand(1);
    uint8_t **w = malloc(count * sizeof *w);
    long wb = 0;
    for (long i = 0; i < count; i++)
        if (!(w[i] = q8_matrix(n, k, &wb))) return 1;
    float *x = malloc(k * 4), *y = malloc(n * 4);
    for (long i = 0; i < k; i++) x[i] = rand() / (float)RAND_MAX;
    const long nq = bd_qgemm_work_bytes(8, k, 1);
    void *wq = aligned_alloc(64, (nq + 63) & ~63L);
    double best = 1e9;
    for (int pass = 0; pass < 7; pass++) {
        const double t0 = wall_now();
        for (long i = 0; i < count; i++)
            if (bd_qgemm(8, w[i], wb, n, k, x, 1, y, n, BD_ISA_AUTO, threads, wq, nq) != 0) return 1;
        const double t = (wall_now() - t0) / count;
        if (t < best) best = t;
    }
    printf("Q8_0 %ld x %ld (%.0f KB), one row through %ld of them, %d threads, best of 7: %.2f us a call (%.1f GB/s)\n",
            n, k, wb / 1e3, count, threads, best * 1e6, wb / best / 1e9);
    return 0;
}

static int stream(long n, long k, int threads, int iters) {
    if (n <= 0 || k <= 0 || k % 32 != 0 || threads < 1 || iters < 1) {
        fprintf(stderr, "stream: N, K, THREADS, ITERS positive; K whole blocks of 32\n");
        return 2;
    }
    srand(1);
    long wb;
    uint8_t *w = q8_matrix(n, k, &wb);
    if (!w) return 1;
    const long rb = (wb + 127) / 128 * 128;
    float *x = malloc(k * 4), *y = malloc(n * 4);
    for (long i = 0; i < k; i++) x[i] = rand() / (float)RAND_MAX;
    const long nq = bd_qgemm_work_bytes(8, k, 1);
    void *wq = aligned_alloc(64, (nq + 63) & ~63L);
    double best_q = 1e9, best_r = 1e9;
    volatile uint64_t sink = 0;
    for (int i = 0; i < iters; i++) {
        double t0 = wall_now();
        if (bd_qgemm(8, w, wb, n, k, x, 1, y, n, BD_ISA_AUTO, threads, wq, nq) != 0) return 1;
        double t = wall_now() - t0;
        if (t < best_q) best_q = t;
        t0 = wall_now();
        sink += bd_qgemm_read_sum(w, rb, threads);
        t = wall_now() - t0;
        if (t < best_r) best_r = t;
    }
    printf("Q8_0 %ld x %ld (%.1f MB), one row, %d threads, best of %d: qgemm %.3f ms (%.1f GB/s), "
           "reading the same bytes %.3f ms (%.1f GB/s): %.2f of the read\n",
            n, k, wb / 1e6, threads, iters, best_q * 1e3, wb / best_q / 1e9, best_r * 1e3, rb / best_r / 1e9,
            (wb / best_q) / (rb / best_r));
    return 0;
}

static int token(long layers, long hidden, long kvdim, long inter, long vocab, int threads, int iters) {
    if (layers <= 0 || layers > 256 || hidden <= 0 || hidden % 32 || kvdim <= 0 || inter <= 0 || inter % 32 ||
            vocab <= 0 || threads < 1 || iters < 1) {
        fprintf(stderr, "token: sizes positive, HIDDEN and INTER whole blocks of 32, LAYERS at most 256\n");
        return 2;
    }
    // Per layer: q, k, v, o, gate and up, down (rows x k); then the head.
    const long per = 6, nm = layers * per + 1;
    const long rows[6] = {hidden, kvdim, kvdim, hidden, 2 * inter, hidden}, ks[6] = {hidden, hidden, hidden, hidden, hidden, inter};
    long *n = malloc(nm * sizeof(long)), *k = malloc(nm * sizeof(long)), *wb = malloc(nm * sizeof(long));
    uint8_t **w = malloc(nm * sizeof(uint8_t *));
    if (!n || !k || !wb || !w) return 1;
    srand(1);
    long total = 0, most = 0;
    for (long i = 0; i < nm; i++) {
        n[i] = i == nm - 1 ? vocab : rows[i % per];
        k[i] = i == nm - 1 ? hidden : ks[i % per];
        if (!(w[i] = q8_matrix(n[i], k[i], &wb[i]))) return 1;
        total += wb[i];
        if (n[i] > most) most = n[i];
    }
    const long widest = inter > hidden ? inter : hidden;
    float *x = malloc(widest * 4), *y = malloc(most * 4);
    for (long i = 0; i < widest; i++) x[i] = rand() / (float)RAND_MAX;
    const long nq = bd_qgemm_work_bytes(8, widest, 1);
    void *wq = aligned_alloc(64, (nq + 63) & ~63L);
    double best_t = 1e9, best_r = 1e9;
    volatile uint64_t sink = 0;
    for (int it = 0; it < iters; it++) {
        double t0 = wall_now();
        for (long i = 0; i < nm; i++)
            if (bd_qgemm(8, w[i], wb[i], n[i], k[i], x, 1, y, n[i], BD_ISA_AUTO, threads, wq, nq) != 0) return 1;
        double t = wall_now() - t0;
        if (t < best_t) best_t = t;
        t0 = wall_now();
        for (long i = 0; i < nm; i++) sink += bd_qgemm_read_sum(w[i], wb[i] / 128 * 128, threads);
        t = wall_now() - t0;
        if (t < best_r) best_r = t;
    }
    printf("Q8_0 token, %ld layers (hidden %ld, kv %ld, intermediate %ld) and a %ld-row head, %.1f MB, one row, "
           "%d threads, best of %d: the products %.3f ms (%.1f GB/s, %.1f tokens/s at most), reading the same "
           "bytes %.3f ms (%.1f GB/s): %.2f of the read\n",
            layers, hidden, kvdim, inter, vocab, total / 1e6, threads, iters, best_t * 1e3, total / best_t / 1e9,
            1 / best_t, best_r * 1e3, total / best_r / 1e9, best_r / best_t);
    return 0;
}

// threads_mode: bd_qamx on THREADS threads as the daemon calls it (with
// swiglu: N/2 outputs of silu(gate)*up), wall time, best of 15 runs of ITERS.
static int threads_mode(int type, long n, long k, long m, int threads, int iters, int swiglu) {
    int eb, ee;
    if (!qtype_block(type, &eb, &ee) || n <= 0 || k <= 0 || m <= 0 || threads < 1 || iters < 1 ||
            k % ee != 0 || (swiglu && (n % 32 != 0 || m < 64))) {
        fprintf(stderr, "threads: TYPE 8, 12, 13 or 14; sizes positive, K whole blocks; swiglu: N a multiple of 32, M >= 64\n");
        return 2;
    }
    if (!bd_qamx_available()) {
        fprintf(stderr, "threads: no AMX here\n");
        return 1;
    }
    const long ny = swiglu ? n / 2 : n;
    uint8_t *w;
    long wb;
    // y 64-byte aligned as the daemon's buffers are (page-aligned): malloc's
    // 16-byte alignment split each 16-float row store over two lines.
    float *x, *y = aligned_alloc(64, (m * ny * 4 + 63) & ~63L);
    rand_problem(type, n, k, m, &w, &wb, &x);
    const long na = bd_qamx_work_bytes(type, k, m, threads);
    void *wa = aligned_alloc(64, (na + 63) & ~63L);
    const int flags = swiglu ? BD_QAMX_SWIGLU : 0;
    double best = -1;
    for (int r = 0; r < 15; r++) {
        const double t0 = wall_now();
        for (int i = 0; i < iters; i++)
            if (bd_qamx(type, w, wb, n, k, x, m, y, ny, threads, flags, wa, na) != 0) return 1;
        const double t = (wall_now() - t0) / iters;
        if (best < 0 || t < best) best = t;
    }
    printf("type %d, %ld x %ld weights%s, %ld rows, %d threads, wall, best of 15: qamx %.1f us (%.0f GFLOP/s)\n", type, n, k,
            swiglu ? " (swiglu)" : "", m, threads, best * 1e6, 2.0 * n * k * m / best / 1e9);
    return 0;
}

static float frand(void) { return (float)rand() / RAND_MAX * 2 - 1; }

static int attend_mode(long hq, long hkv, long dim, long tokens, int iters) {
    const long group = hkv > 0 ? hq / hkv : 0, bs = 16;
    if (hq <= 0 || hkv <= 0 || hq % hkv || dim % 32 || dim > 256 || group > 64 || tokens <= 0 || iters <= 0) {
        fprintf(stderr, "HQ a multiple of HKV, at most 64 times; DIM a multiple of 32 up to 256\n");
        return 2;
    }
    if (!bd_qamx_available()) {
        fprintf(stderr, "no AMX here\n");
        return 1;
    }
    const long nb = (tokens + bs - 1) / bs, kvn = nb * bs * hkv * dim;
    float *q = malloc(tokens * hq * dim * 4), *kc = malloc(kvn * 4), *vc = malloc(kvn * 4);
    float *y[2] = {malloc(tokens * hq * dim * 4), malloc(tokens * hq * dim * 4)};
    int32_t *row = malloc(nb * 4), *pos = malloc(tokens * 4);
    for (long i = 0; i < tokens * hq * dim; i++) q[i] = 3 * frand();
    for (long i = 0; i < kvn; i++) kc[i] = frand(), vc[i] = frand();
    for (long i = 0; i < nb; i++) row[i] = (int32_t)(nb - 1 - i); // blocks in reverse, as a server's are not in order
    for (long i = 0; i < tokens; i++) pos[i] = (int32_t)i;
    void *work = aligned_alloc(64, (bd_attend_amx_bytes(dim) + 63) & ~63L);
    const float scale = 1 / sqrtf((float)dim);
    double flops = 0;
    for (long i = 0; i < tokens; i++) flops += 4.0 * hq * dim * (i + 1);
    double best[2] = {1e30, 1e30};
    for (int r = 0; r < 15; r++) {
        for (int v = 0; v < 2; v++) {
            const long tb = v ? 64 / group : (group < 16 ? 16 / group : 1);
            const double t0 = cpu_now();
            if (v) bd_attend_amx_begin();
            for (int it = 0; it < iters; it++)
                for (long t = 0; t < tokens; t += tb)
                    for (long g = 0; g < hkv; g++) {
                        const long tn = tokens - t < tb ? tokens - t : tb;
                        if (v)
                            bd_attend_amx(q, 0, kc, vc, 0, row, pos, t, tn, g, hq, hkv, dim, bs, scale, y[1], work);
                        else
                            for (long h = 0; h < group; h += 16)
                                bd_attend_rows_avx512(q, 0, kc, vc, 0, row, pos, t, tn, g * group + h,
                                        group - h < 16 ? group - h : 16, g, hq, hkv, dim, bs, scale, y[0]);
                    }
            if (v) bd_attend_amx_end();
            const double dt = (cpu_now() - t0) / iters;
            if (dt < best[v]) best[v] = dt;
        }
    }
    double diff = 0;
    for (long i = 0; i < tokens * hq * dim; i++) diff = fmax(diff, fabs(y[0][i] - y[1][i]));
    printf("attention, %ld tokens, %ld query and %ld kv heads of %ld, one thread, best of 15x%d: "
           "f32 rows %.3f ms (%.1f GFLOP/s), AMX %.3f ms (%.1f GFLOP/s), %.2fx; largest difference %.2g\n",
            tokens, hq, hkv, dim, iters, best[0] * 1e3, flops / best[0] / 1e9, best[1] * 1e3, flops / best[1] / 1e9,
            best[0] / best[1], diff);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 7 && !strcmp(argv[1], "attend"))
        return attend_mode(atol(argv[2]), atol(argv[3]), atol(argv[4]), atol(argv[5]), atoi(argv[6]));
    if ((argc == 8 || argc == 9) && !strcmp(argv[1], "threads"))
        return threads_mode(atoi(argv[2]), atol(argv[3]), atol(argv[4]), atol(argv[5]), atoi(argv[6]), atoi(argv[7]),
                argc == 9 && !strcmp(argv[8], "swiglu"));
    if (argc == 6 && !strcmp(argv[1], "stream")) return stream(atol(argv[2]), atol(argv[3]), atoi(argv[4]), atoi(argv[5]));
    if (argc == 6 && !strcmp(argv[1], "many")) return many(atol(argv[2]), atol(argv[3]), atol(argv[4]), atoi(argv[5]));
    if (argc == 9 && !strcmp(argv[1], "token"))
        return token(atol(argv[2]), atol(argv[3]), atol(argv[4]), atol(argv[5]), atol(argv[6]), atoi(argv[7]),
                atoi(argv[8]));
    if (argc != 6) {
        fprintf(stderr, "usage: qkernels TYPE N K M ITERS (TYPE 8 Q8_0, 12 Q4_K, 13 Q5_K, 14 Q6_K; 1008, 1012-1014 relaid)\n"
                        "       qkernels stream N K THREADS ITERS\n"
                        "       qkernels many N K COUNT THREADS\n"
                        "       qkernels token LAYERS HIDDEN KVDIM INTER VOCAB THREADS ITERS\n"
                        "       qkernels threads TYPE N K M THREADS ITERS [swiglu]\n"
                        "       qkernels attend HQ HKV DIM TOKENS ITERS\n");
        return 2;
    }
    const int type = atoi(argv[1]), iters = atoi(argv[5]);
    const long n = atol(argv[2]), k = atol(argv[3]), m = atol(argv[4]);
    int eb, ee;
    if (!qtype_block(type, &eb, &ee)) {
        fprintf(stderr, "TYPE: 8, 12, 13, 14, 1008 or 1012\n");
        return 2;
    }
    if (n <= 0 || k <= 0 || m <= 0 || iters <= 0 || k % ee != 0) {
        fprintf(stderr, "N, K, M, ITERS positive; K whole blocks of %d\n", ee);
        return 2;
    }
    uint8_t *w;
    long wb;
    float *x, *y = aligned_alloc(64, (m * n * 4 + 63) & ~63L); // as in threads_mode
    rand_problem(type, n, k, m, &w, &wb, &x);
    if (type >= BD_X16(0) && bd_x16_relayout(type - BD_X16(0), w, n, k, 1, 1) != BD_QGEMM_OK) {
        fprintf(stderr, "relaid types need N a multiple of 16\n");
        return 2;
    }

    // qamx as the daemon calls it (flags 0), and, where that is AMX-INT8
    // (Q8_0, up to 16 rows), on bf16 panels as well.
    double best_amx[2] = {-1, -1};
    const long na = bd_qamx_work_bytes(type, k, m, 1);
    if (na > 0 && bd_qamx_available()) {
        void *wa = aligned_alloc(64, (na + 63) & ~63L);
        for (int v = 0; v < 1 + bd_qamx_int8(type, m); v++) {
            const int flags = v ? BD_QAMX_NO_INT8 : 0;
            bd_qamx(type, w, wb, n, k, x, m, y, n, 1, flags, wa, na);
            for (int r = 0; r < 15; r++) {
                const double t0 = cpu_now();
                for (int i = 0; i < iters; i++) bd_qamx(type, w, wb, n, k, x, m, y, n, 1, flags, wa, na);
                const double t = (cpu_now() - t0) / iters;
                if (best_amx[v] < 0 || t < best_amx[v]) best_amx[v] = t;
            }
        }
        free(wa);
    }
    double best_q = -1;
    const long nq = bd_qgemm_work_bytes(type, k, m);
    void *wq = aligned_alloc(64, (nq + 63) & ~63L);
    for (int r = 0; r < 15; r++) {
        const double t0 = cpu_now();
        for (int i = 0; i < iters; i++) bd_qgemm(type, w, wb, n, k, x, m, y, n, BD_ISA_AUTO, 1, wq, nq);
        const double t = (cpu_now() - t0) / iters;
        if (best_q < 0 || t < best_q) best_q = t;
    }
    printf("type %d, %ld x %ld weights, %ld rows, one thread: qgemm %.1f us", type, n, k, m, best_q * 1e6);
    if (best_amx[0] < 0) {
        printf(", qamx not available here\n");
        return 0;
    }
    printf(", qamx %.1f us (%.3f ns a weight)", best_amx[0] * 1e6, best_amx[0] * 1e9 / (n * k));
    if (best_amx[1] >= 0) printf(" on AMX-INT8, %.1f us on bf16 panels", best_amx[1] * 1e6);
    printf("\n");
    return 0;
}
