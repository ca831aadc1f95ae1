// Measures one oneDNN matmul with row-major (transposed) weights against the
// same weights packed once into the kernel's layout: the experiment behind
// the adapter's packed weights (bench/RESULTS.md, "Decode with prepacked
// weights").
//
//	gcc -O2 -o /tmp/prepack bench/peers/onednn_prepack.c -ldnnl -fopenmp
//	OMP_NUM_THREADS=2 /tmp/prepack 16 384 384      # M K N
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <omp.h>
#define CHECK(x) do { dnnl_status_t s_ = (x); if (s_ != dnnl_success) { printf("fail %s: %d\n", #x, s_); exit(1);} } while(0)
static double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc, char **argv) {
  int64_t M = atoi(argv[1]), K = atoi(argv[2]), N = atoi(argv[3]); int iters = 2000;
  dnnl_engine_t eng; dnnl_stream_t str;
  CHECK(dnnl_engine_create(&eng, dnnl_cpu, 0)); CHECK(dnnl_stream_create(&str, eng, dnnl_stream_default_flags));
  dnnl_memory_desc_t src, weiplain, weiany, dst;
  dnnl_dims_t sd = {M, K}, wd = {K, N}, dd = {M, N}, ws = {1, K};
  CHECK(dnnl_memory_desc_init_by_tag(&src, 2, sd, dnnl_f32, dnnl_ab));
  CHECK(dnnl_memory_desc_init_by_strides(&weiplain, 2, wd, dnnl_f32, ws));
  CHECK(dnnl_memory_desc_init_by_tag(&weiany, 2, wd, dnnl_f32, dnnl_format_tag_any));
  CHECK(dnnl_memory_desc_init_by_tag(&dst, 2, dd, dnnl_f32, dnnl_ab));
  float *a = malloc(4*M*K), *w = malloc(4*K*N), *y = malloc(4*M*N);
  for (int64_t i = 0; i < M*K; i++) a[i] = (float)(i%7)*0.1f;
  for (int64_t i = 0; i < K*N; i++) w[i] = (float)(i%5)*0.01f;
  for (int variant = 0; variant < 2; variant++) {
    dnnl_matmul_desc_t desc; dnnl_primitive_desc_t pd; dnnl_primitive_t prim;
    CHECK(dnnl_matmul_desc_init(&desc, &src, variant ? &weiany : &weiplain, NULL, &dst));
    CHECK(dnnl_primitive_desc_create(&pd, &desc, NULL, eng, NULL));
    CHECK(dnnl_primitive_create(&prim, pd));
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (variant) {
      const dnnl_blocking_desc_t *bd = &wmd->format_desc.blocking;
      printf("  packed layout: strides %ld,%ld inner", (long)bd->strides[0], (long)bd->strides[1]);
      for (int i = 0; i < bd->inner_nblks; i++) printf(" %ld@%ld", (long)bd->inner_blks[i], (long)bd->inner_idxs[i]);
      printf(", %zu bytes\n", dnnl_memory_desc_get_size(wmd));
    }
    dnnl_memory_t ma, mw, my, mwplain;
    CHECK(dnnl_memory_create(&ma, &src, eng, a)); CHECK(dnnl_memory_create(&my, &dst, eng, y));
    CHECK(dnnl_memory_create(&mwplain, &weiplain, eng, w));
    if (variant) {
      CHECK(dnnl_memory_create(&mw, wmd, eng, DNNL_MEMORY_ALLOCATE));
      dnnl_primitive_desc_t rpd; dnnl_primitive_t r;
      CHECK(dnnl_reorder_primitive_desc_create(&rpd, &weiplain, eng, wmd, eng, NULL));
      CHECK(dnnl_primitive_create(&r, rpd));
      dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, mwplain}, {DNNL_ARG_TO, mw}};
      CHECK(dnnl_primitive_execute(r, str, 2, ra)); CHECK(dnnl_stream_wait(str));
    } else mw = mwplain;
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, my}};
    for (int i = 0; i < 50; i++) CHECK(dnnl_primitive_execute(prim, str, 3, args));
    CHECK(dnnl_stream_wait(str));
    double t0 = now();
    for (int i = 0; i < iters; i++) CHECK(dnnl_primitive_execute(prim, str, 3, args));
    CHECK(dnnl_stream_wait(str));
    double dt = (now()-t0)/iters;
    const char *impl; dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    printf("%s M=%ld K=%ld N=%ld: %.1f us, %.1f GFLOP/s (%s)\n", variant ? "prepacked" : "plain-strided", (long)M,(long)K,(long)N, dt*1e6, 2.0*M*K*N/dt/1e9, impl);
  }
  return 0;
}
