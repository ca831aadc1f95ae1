#include "dnnl_ops.h"
#include "attend.h"
#include "dequant.h"
#include "vec_avx512.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// TRY records the failing step and jumps to the function's cleanup label.
#define TRY(call, name)                                                      \
    do {                                                                     \
        st = (call);                                                         \
        if (st != dnnl_success) {                                            \
            *step = (name);                                                  \
            goto out;                                                        \
        }                                                                    \
    } while (0)

// Work below this many elements is not worth waking OpenMP threads for.
// Such work runs outside any OpenMP region: a region with
// if(0) still builds a team, a malloc and a free in libgomp, and a decode
// step runs a few hundred of these small ops.
#define BD_PAR_MIN (1 << 15)

// Ops below about this much work (flops, or elements × 8) run on one thread:
// waking the OpenMP pool for a 8×384×384 matmul costs more than it saves, and
// idle pool threads spin on cores the gRPC server needs.
#define BD_PAR_MIN_WORK (1 << 22)

static int bd_threads_for(const bd_device *d, double work) {
    return work < (double)BD_PAR_MIN_WORK ? 1 : d->nthreads;
}

dnnl_status_t bd_device_open(int nthreads, bd_device **out, const char **step) {
    dnnl_status_t st = dnnl_success;
    bd_device *d = calloc(1, sizeof *d);
    if (d == NULL) {
        *step = "allocate device";
        return dnnl_out_of_memory;
    }
    d->nthreads = nthreads;
    // oneDNN sizes its kernels from omp_get_max_threads() when it creates
    // them, so the count must be in force before anything is created.
    omp_set_num_threads(nthreads);
    TRY(dnnl_engine_create(&d->engine, dnnl_cpu, 0), "create CPU engine");
    TRY(dnnl_stream_create(&d->stream, d->engine, dnnl_stream_default_flags),
            "create stream");
    *out = d;
    return dnnl_success;
out:
    bd_device_close(d);
    return st;
}

void bd_device_close(bd_device *d) {
    if (d == NULL) return;
    if (d->stream) dnnl_stream_destroy(d->stream);
    if (d->engine) dnnl_engine_destroy(d->engine);
    free(d);
}

dnnl_status_t bd_device_wait(bd_device *d, const char **step) {
    dnnl_status_t st = dnnl_stream_wait(d->stream);
    if (st != dnnl_success) *step = "wait for stream";
    return st;
}

void bd_prim_destroy(bd_prim *p) {
    if (p == NULL) return;
    for (int i = 0; i < p->nargs; i++)
        if (p->args[i].memory) dnnl_memory_destroy(p->args[i].memory);
    if (p->prim) dnnl_primitive_destroy(p->prim);
    free(p);
}

dnnl_status_t bd_exec(bd_device *d, bd_prim *p, void *h0, void *h1, void *h2,
        void *h3, void *h4, const char **step) {
    dnnl_status_t st = dnnl_success;
    void *h[BD_MAX_ARGS] = {h0, h1, h2, h3, h4};
    // The ICV is per OS thread; setting it here keeps the count the
    // primitive was created for, whichever thread the call arrives on.
    omp_set_num_threads(p->nthreads > 0 ? p->nthreads : d->nthreads);
    for (int i = 0; i < p->nargs; i++)
        TRY(dnnl_memory_set_data_handle(p->args[i].memory, h[i]),
                "set data handle");
    TRY(dnnl_primitive_execute(p->prim, d->stream, p->nargs, p->args),
            "execute");
    TRY(dnnl_stream_wait(d->stream), "wait for stream");
out:
    return st;
}

// finish turns an op descriptor into a bd_prim with a memory object for
// each of the nargs execution arguments, taking their descriptors from the
// primitive descriptor so they match what the kernel was built for.
static dnnl_status_t finish(bd_device *d, const_dnnl_op_desc_t desc,
        const_dnnl_primitive_attr_t attr, int nargs, const int *argids,
        bd_prim **out, const char **step) {
    dnnl_status_t st = dnnl_success;
    dnnl_primitive_desc_t pd = NULL;
    bd_prim *p = calloc(1, sizeof *p);
    if (p == NULL) {
        *step = "allocate primitive";
        return dnnl_out_of_memory;
    }
    TRY(dnnl_primitive_desc_create(&pd, desc, attr, d->engine, NULL),
            "create primitive descriptor");
    TRY(dnnl_primitive_create(&p->prim, pd), "create primitive");
    // The creator set the thread count for this op's size; executions keep it.
    p->nthreads = omp_get_max_threads();
    for (int i = 0; i < nargs; i++) {
        const dnnl_memory_desc_t *md =
                dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, argids[i]);
        if (md == NULL || md->ndims == 0) {
            st = dnnl_invalid_arguments;
            *step = "query argument memory descriptor";
            goto out;
        }
        p->args[i].arg = argids[i];
        TRY(dnnl_memory_create(&p->args[i].memory, md, d->engine, DNNL_MEMORY_NONE),
                "create argument memory");
        p->nargs = i + 1;
    }
    *out = p;
    p = NULL;
out:
    if (pd) dnnl_primitive_desc_destroy(pd);
    bd_prim_destroy(p);
    return st;
}

dnnl_status_t bd_matmul_create(bd_device *d, int64_t batch, int64_t m,
        int64_t k, int64_t n, int trans_b, dnnl_data_type_t ab_dt,
        dnnl_data_type_t dst_dt, int has_bias, dnnl_alg_kind_t act, float scale,
        int has_res, int pack_b, bd_prim **out, const char **step) {
    dnnl_status_t st = dnnl_success;
    dnnl_memory_desc_t src, wei, weiany, bias, dst, res;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    int nd = batch > 0 ? 3 : 2;
    omp_set_num_threads(bd_threads_for(d, 2.0 * (double)(batch > 0 ? batch : 1) * (double)m * (double)k * (double)n));

    dnnl_dims_t sdims, wdims, wstrides, ddims, bdims;
    if (nd == 2) {
        sdims[0] = m, sdims[1] = k;
        wdims[0] = k, wdims[1] = n;
        ddims[0] = m, ddims[1] = n;
        bdims[0] = 1, bdims[1] = n;
        // TransB reads the [n,k] row-major weights in place through strides.
        if (trans_b)
            wstrides[0] = 1, wstrides[1] = k;
        else
            wstrides[0] = n, wstrides[1] = 1;
    } else {
        sdims[0] = batch, sdims[1] = m, sdims[2] = k;
        wdims[0] = batch, wdims[1] = k, wdims[2] = n;
        ddims[0] = batch, ddims[1] = m, ddims[2] = n;
        bdims[0] = 1, bdims[1] = 1, bdims[2] = n;
        wstrides[0] = k * n;
        if (trans_b)
            wstrides[1] = 1, wstrides[2] = k;
        else
            wstrides[1] = n, wstrides[2] = 1;
    }
    dnnl_format_tag_t tag = nd == 2 ? dnnl_ab : dnnl_abc;
    TRY(dnnl_memory_desc_init_by_tag(&src, nd, sdims, ab_dt, tag), "describe src");
    TRY(dnnl_memory_desc_init_by_strides(&wei, nd, wdims, ab_dt, wstrides),
            "describe weights");
    TRY(dnnl_memory_desc_init_by_tag(&dst, nd, ddims, dst_dt, tag), "describe dst");
    if (has_bias)
        TRY(dnnl_memory_desc_init_by_tag(&bias, nd, bdims, dnnl_f32, tag),
                "describe bias");
    pack_b = pack_b && nd == 2;
    if (pack_b)
        TRY(dnnl_memory_desc_init_by_tag(&weiany, nd, wdims, ab_dt, dnnl_format_tag_any),
                "describe packed weights");
    TRY(dnnl_matmul_desc_init(&desc, &src, pack_b ? &weiany : &wei, has_bias ? &bias : NULL, &dst),
            "init matmul descriptor");

    TRY(dnnl_primitive_attr_create(&attr), "create attributes");
    if (scale != 1.0f)
        TRY(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &scale),
                "set output scale");
    has_res = has_res && has_bias && nd == 2;
    if (act != dnnl_alg_kind_undef || has_res) {
        TRY(dnnl_post_ops_create(&po), "create post-ops");
        if (act != dnnl_alg_kind_undef)
            TRY(dnnl_post_ops_append_eltwise(po, 1.0f, act, 0.0f, 0.0f),
                    "append eltwise post-op");
        if (has_res) {
            TRY(dnnl_memory_desc_init_by_tag(&res, nd, ddims, dnnl_f32, tag),
                    "describe residual");
            TRY(dnnl_post_ops_append_binary(po, dnnl_binary_add, &res),
                    "append residual post-op");
        }
        TRY(dnnl_primitive_attr_set_post_ops(attr, po), "set post-ops");
    }
    {
        int res_arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(act != dnnl_alg_kind_undef ? 1 : 0) | DNNL_ARG_SRC_1;
        int with_res[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS, res_arg, DNNL_ARG_DST};
        int with_bias[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS, DNNL_ARG_DST};
        int without[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
        if (has_res)
            st = finish(d, &desc, attr, 5, with_res, out, step);
        else
            st = finish(d, &desc, attr, has_bias ? 4 : 3, has_bias ? with_bias : without,
                    out, step);
    }
    if (st == dnnl_success && pack_b) {
        // The weights argument's memory was made from the kernel's choice.
        const dnnl_memory_desc_t *md = NULL;
        TRY(dnnl_memory_get_memory_desc((*out)->args[1].memory, &md), "query packed weights");
        (*out)->wplain = wei;
        (*out)->wpacked = *md;
        (*out)->wpack = !dnnl_memory_desc_equal(&wei, md);
    }
out:
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return st;
}

dnnl_status_t bd_matmul4_create(bd_device *d, const int64_t *sdims,
        const int64_t *sstrides, const int64_t *wdims, const int64_t *wstrides,
        const int64_t *ddims, const int64_t *dstrides, dnnl_data_type_t ab_dt,
        dnnl_data_type_t dst_dt, float scale, bd_prim **out, const char **step) {
    dnnl_status_t st = dnnl_success;
    dnnl_memory_desc_t src, wei, dst;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_dims_t sd, ss, wd, ws, dd, ds;
    for (int i = 0; i < 4; i++) {
        sd[i] = sdims[i], ss[i] = sstrides[i];
        wd[i] = wdims[i], ws[i] = wstrides[i];
        dd[i] = ddims[i], ds[i] = dstrides[i];
    }
    omp_set_num_threads(bd_threads_for(d, 2.0 * (double)sd[0] * (double)sd[1] *
            (double)sd[2] * (double)sd[3] * (double)wd[3]));
    TRY(dnnl_memory_desc_init_by_strides(&src, 4, sd, ab_dt, ss), "describe src");
    TRY(dnnl_memory_desc_init_by_strides(&wei, 4, wd, ab_dt, ws), "describe weights");
    TRY(dnnl_memory_desc_init_by_strides(&dst, 4, dd, dst_dt, ds), "describe dst");
    TRY(dnnl_matmul_desc_init(&desc, &src, &wei, NULL, &dst), "init matmul descriptor");
    TRY(dnnl_primitive_attr_create(&attr), "create attributes");
    if (scale != 1.0f)
        TRY(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &scale),
                "set output scale");
    {
        int args[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
        st = finish(d, &desc, attr, 3, args, out, step);
    }
out:
    if (attr) dnnl_primitive_attr_destroy(attr);
    return st;
}

dnnl_status_t bd_add_create(bd_device *d, int64_t rows, int64_t n, int bcast,
        bd_prim **out, const char **step) {
    dnnl_status_t st = dnnl_success;
    dnnl_memory_desc_t s0, s1, dst;
    dnnl_binary_desc_t desc;
    omp_set_num_threads(bd_threads_for(d, 8.0 * (double)rows * (double)n));
    dnnl_dims_t dims = {rows, n}, bdims = {bcast ? 1 : rows, n};
    TRY(dnnl_memory_desc_init_by_tag(&s0, 2, dims, dnnl_f32, dnnl_ab), "describe src0");
    TRY(dnnl_memory_desc_init_by_tag(&s1, 2, bdims, dnnl_f32, dnnl_ab), "describe src1");
    TRY(dnnl_memory_desc_init_by_tag(&dst, 2, dims, dnnl_f32, dnnl_ab), "describe dst");
    TRY(dnnl_binary_desc_init(&desc, dnnl_binary_add, &s0, &s1, &dst),
            "init binary descriptor");
    {
        int args[] = {DNNL_ARG_SRC_0, DNNL_ARG_SRC_1, DNNL_ARG_DST};
        st = finish(d, &desc, NULL, 3, args, out, step);
    }
out:
    return st;
}

dnnl_status_t bd_layernorm_create(bd_device *d, int64_t rows, int64_t n,
        float eps, bd_prim **out, const char **step) {
    dnnl_status_t st = dnnl_success;
    dnnl_memory_desc_t data;
    dnnl_layer_normalization_desc_t desc;
    omp_set_num_threads(bd_threads_for(d, 8.0 * (double)rows * (double)n));
    dnnl_dims_t dims = {rows, n};
    TRY(dnnl_memory_desc_init_by_tag(&data, 2, dims, dnnl_f32, dnnl_ab), "describe src");
    // Separate [n] scale and shift (2.6's use_scale|use_shift), so gamma and
    // beta are bound as they are stored instead of packed into one [2,n].
    TRY(dnnl_layer_normalization_forward_desc_init(&desc, dnnl_forward_inference,
                &data, NULL, eps, dnnl_use_scale | dnnl_use_shift),
            "init layer normalization descriptor");
    {
        int args[] = {DNNL_ARG_SRC, DNNL_ARG_SCALE, DNNL_ARG_SHIFT, DNNL_ARG_DST};
        st = finish(d, &desc, NULL, 4, args, out, step);
    }
out:
    return st;
}

dnnl_status_t bd_softmax_create(bd_device *d, int64_t rows, int64_t n,
        bd_prim **out, const char **step) {
    dnnl_status_t st = dnnl_success;
    dnnl_memory_desc_t data;
    dnnl_softmax_desc_t desc;
    omp_set_num_threads(bd_threads_for(d, 8.0 * (double)rows * (double)n));
    dnnl_dims_t dims = {rows, n};
    TRY(dnnl_memory_desc_init_by_tag(&data, 2, dims, dnnl_f32, dnnl_ab), "describe src");
    TRY(dnnl_softmax_forward_desc_init(&desc, dnnl_forward_inference, &data, 1),
            "init softmax descriptor");
    {
        int args[] = {DNNL_ARG_SRC, DNNL_ARG_DST};
        st = finish(d, &desc, NULL, 2, args, out, step);
    }
out:
    return st;
}

dnnl_status_t bd_softmax_to_create(bd_device *d, int64_t rows, int64_t n,
        dnnl_data_type_t dst_dt, bd_prim **out, const char **step) {
    dnnl_status_t st = dnnl_success;
    dnnl_memory_desc_t src, dst;
    dnnl_softmax_v2_desc_t desc;
    omp_set_num_threads(bd_threads_for(d, 8.0 * (double)rows * (double)n));
    dnnl_dims_t dims = {rows, n};
    TRY(dnnl_memory_desc_init_by_tag(&src, 2, dims, dnnl_f32, dnnl_ab), "describe src");
    TRY(dnnl_memory_desc_init_by_tag(&dst, 2, dims, dst_dt, dnnl_ab), "describe dst");
    TRY(dnnl_softmax_v2_forward_desc_init(&desc, dnnl_forward_inference,
                dnnl_softmax_accurate, &src, &dst, 1),
            "init softmax descriptor");
    {
        int args[] = {DNNL_ARG_SRC, DNNL_ARG_DST};
        st = finish(d, &desc, NULL, 2, args, out, step);
    }
out:
    return st;
}

dnnl_status_t bd_eltwise_create(bd_device *d, int64_t count,
        dnnl_alg_kind_t alg, float alpha, bd_prim **out, const char **step) {
    dnnl_status_t st = dnnl_success;
    dnnl_memory_desc_t data;
    dnnl_eltwise_desc_t desc;
    omp_set_num_threads(bd_threads_for(d, 8.0 * (double)count));
    dnnl_dims_t dims = {count};
    TRY(dnnl_memory_desc_init_by_tag(&data, 1, dims, dnnl_f32, dnnl_a), "describe src");
    TRY(dnnl_eltwise_forward_desc_init(&desc, dnnl_forward_inference, alg, &data,
                alpha, 0.0f),
            "init eltwise descriptor");
    {
        int args[] = {DNNL_ARG_SRC, DNNL_ARG_DST};
        st = finish(d, &desc, NULL, 2, args, out, step);
    }
out:
    return st;
}

// reorder_create makes a reorder from src to dst (arguments: src, dst) for
// the OpenMP thread count in force.
static dnnl_status_t reorder_create(bd_device *d, const dnnl_memory_desc_t *src,
        const dnnl_memory_desc_t *dst, bd_prim **out, const char **step) {
    dnnl_status_t st = dnnl_success;
    dnnl_primitive_desc_t pd = NULL;
    bd_prim *p = calloc(1, sizeof *p);
    if (p == NULL) {
        *step = "allocate primitive";
        return dnnl_out_of_memory;
    }
    TRY(dnnl_reorder_primitive_desc_create(&pd, src, d->engine, dst, d->engine, NULL),
            "create reorder primitive descriptor");
    TRY(dnnl_primitive_create(&p->prim, pd), "create reorder primitive");
    p->nthreads = omp_get_max_threads();
    p->args[0].arg = DNNL_ARG_FROM;
    TRY(dnnl_memory_create(&p->args[0].memory, src, d->engine, DNNL_MEMORY_NONE),
            "create argument memory");
    p->nargs = 1;
    p->args[1].arg = DNNL_ARG_TO;
    TRY(dnnl_memory_create(&p->args[1].memory, dst, d->engine, DNNL_MEMORY_NONE),
            "create argument memory");
    p->nargs = 2;
    *out = p;
    p = NULL;
out:
    if (pd) dnnl_primitive_desc_destroy(pd);
    bd_prim_destroy(p);
    return st;
}

dnnl_status_t bd_permute_create(bd_device *d, int ndims, const int64_t *dims,
        const int *perm, dnnl_data_type_t dt, bd_prim **out, const char **step) {
    dnnl_status_t st = dnnl_success;
    dnnl_memory_desc_t src, dst;
    dnnl_dims_t in_strides, odims, ostrides, dstrides;
    omp_set_num_threads(d->nthreads);
    if (ndims < 1 || ndims > DNNL_MAX_NDIMS) {
        *step = "check permute rank";
        return dnnl_invalid_arguments;
    }
    // The source is described in the output's dimension order with the
    // input's strides, so the reorder writes the permuted tensor densely.
    in_strides[ndims - 1] = 1;
    for (int i = ndims - 2; i >= 0; i--) in_strides[i] = in_strides[i + 1] * dims[i + 1];
    for (int i = 0; i < ndims; i++) {
        odims[i] = dims[perm[i]];
        ostrides[i] = in_strides[perm[i]];
    }
    dstrides[ndims - 1] = 1;
    for (int i = ndims - 2; i >= 0; i--) dstrides[i] = dstrides[i + 1] * odims[i + 1];
    TRY(dnnl_memory_desc_init_by_strides(&src, ndims, odims, dt, ostrides), "describe src");
    TRY(dnnl_memory_desc_init_by_strides(&dst, ndims, odims, dt, dstrides), "describe dst");
    return reorder_create(d, &src, &dst, out, step);
out:
    return st;
}

dnnl_status_t bd_convert_create(bd_device *d, int64_t n, dnnl_data_type_t from_dt,
        dnnl_data_type_t to_dt, bd_prim **out, const char **step) {
    dnnl_status_t st = dnnl_success;
    dnnl_memory_desc_t src, dst;
    dnnl_dims_t dims = {n};
    omp_set_num_threads(bd_threads_for(d, (double)n * 8));
    TRY(dnnl_memory_desc_init_by_tag(&src, 1, dims, from_dt, dnnl_a), "describe src");
    TRY(dnnl_memory_desc_init_by_tag(&dst, 1, dims, to_dt, dnnl_a), "describe dst");
    return reorder_create(d, &src, &dst, out, step);
out:
    return st;
}

void bd_mask_fill(const bd_device *d, const float *x, const void *mask,
        int mask_i32, int64_t b, int64_t rows, int64_t n, float *out) {
    int64_t per = rows / b; // rows of one batch element
    omp_set_num_threads(d->nthreads);
#pragma omp parallel for if (rows * n >= BD_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t bi = r / per;
        const float *xr = x + r * n;
        float *o = out + r * n;
        if (mask_i32) {
            const int32_t *m = (const int32_t *)mask + bi * n;
            for (int64_t j = 0; j < n; j++) o[j] = m[j] != 0 ? xr[j] : -FLT_MAX;
        } else {
            const float *m = (const float *)mask + bi * n;
            for (int64_t j = 0; j < n; j++) o[j] = m[j] != 0.0f ? xr[j] : -FLT_MAX;
        }
    }
}

// Copies, conversions and adds below this many bytes run on one thread.
#define BD_PAR_BYTES (1 << 18)

void bd_add(const bd_device *d, const float *a, const float *b, int64_t n, float *out) {
    int64_t chunks = (n * 4 + BD_PAR_BYTES - 1) / BD_PAR_BYTES;
    if (chunks <= 1) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
        return;
    }
    const int64_t per = BD_PAR_BYTES / 4;
    omp_set_num_threads(d->nthreads);
#pragma omp parallel for
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t i1 = (c + 1) * per < n ? (c + 1) * per : n;
#pragma omp simd
        for (int64_t i = c * per; i < i1; i++) out[i] = a[i] + b[i];
    }
}

void bd_add_bias(const bd_device *d, float *y, const float *bias, int64_t rows, int64_t n) {
    if (rows * n < BD_PAR_MIN) {
        for (int64_t r = 0; r < rows; r++) {
            float *yr = y + r * n;
#pragma omp simd
            for (int64_t j = 0; j < n; j++) yr[j] += bias[j];
        }
        return;
    }
    omp_set_num_threads(d->nthreads);
#pragma omp parallel for
    for (int64_t r = 0; r < rows; r++) {
        float *yr = y + r * n;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) yr[j] += bias[j];
    }
}

void bd_copy(const bd_device *d, const void *src, void *dst, int64_t bytes) {
    int64_t chunks = (bytes + BD_PAR_BYTES - 1) / BD_PAR_BYTES;
    if (chunks <= 1) {
        memcpy(dst, src, (size_t)bytes);
        return;
    }
    omp_set_num_threads(d->nthreads);
#pragma omp parallel for
    for (int64_t c = 0; c < chunks; c++) {
        int64_t off = c * BD_PAR_BYTES;
        int64_t len = bytes - off < BD_PAR_BYTES ? bytes - off : BD_PAR_BYTES;
        memcpy((char *)dst + off, (const char *)src + off, (size_t)len);
    }
}

int64_t bd_gather(const bd_device *d, const void *table, int64_t v,
        int64_t dim, int64_t elem, const int32_t *idx, int64_t n, void *out) {
    // Check every index before writing, so a bad one leaves out untouched.
    for (int64_t i = 0; i < n; i++)
        if (idx[i] < 0 || (int64_t)idx[i] >= v) return i;
    const size_t row = (size_t)(dim * elem);
    if (n * dim < BD_PAR_MIN) {
        for (int64_t i = 0; i < n; i++)
            memcpy((char *)out + i * row, (const char *)table + (int64_t)idx[i] * row, row);
        return -1;
    }
    omp_set_num_threads(d->nthreads);
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++)
        memcpy((char *)out + i * row, (const char *)table + (int64_t)idx[i] * row, row);
    return -1;
}

void bd_masked_mean_pool(const bd_device *d, const float *x, const void *mask,
        int mask_i32, int64_t b, int64_t s, int64_t dim, float *out) {
    omp_set_num_threads(d->nthreads);
#pragma omp parallel for if (b * s * dim >= BD_PAR_MIN)
    for (int64_t bi = 0; bi < b; bi++) {
        float *o = out + bi * dim;
        memset(o, 0, (size_t)dim * sizeof(float));
        int64_t kept = 0;
        for (int64_t si = 0; si < s; si++) {
            int keep = mask_i32 ? ((const int32_t *)mask)[bi * s + si] != 0
                                : ((const float *)mask)[bi * s + si] != 0.0f;
            if (!keep) continue;
            kept++;
            const float *row = x + (bi * s + si) * dim;
            for (int64_t j = 0; j < dim; j++) o[j] += row[j];
        }
        if (kept > 0) {
            float c = (float)kept;
            for (int64_t j = 0; j < dim; j++) o[j] /= c;
        }
    }
}

void bd_l2_normalize(const bd_device *d, const float *x, int64_t rows,
        int64_t dim, float *out) {
    omp_set_num_threads(d->nthreads);
#pragma omp parallel for if (rows * dim >= BD_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *o = out + r * dim;
        // The sum of squares in double, then an IEEE sqrt and a true
        // division: for float inputs of moderate size every partial sum is
        // exact in double, so the result does not depend on summation order
        // and matches any other device that follows the same recipe (the
        // built-in encoder relies on this for bit-identical vectors).
        double acc[4] = {0};
        int64_t j = 0;
        for (; j + 4 <= dim; j += 4)
            for (int l = 0; l < 4; l++) acc[l] += (double)xr[j + l] * (double)xr[j + l];
        double ss = acc[0] + acc[1] + acc[2] + acc[3];
        for (; j < dim; j++) ss += (double)xr[j] * (double)xr[j];
        if (ss == 0.0) {
            memset(o, 0, (size_t)dim * sizeof(float));
            continue;
        }
        double norm = sqrt(ss);
        for (j = 0; j < dim; j++) o[j] = (float)((double)xr[j] / norm);
    }
}

void bd_f32_to_bf16(const float *src, uint16_t *dst, int64_t n) {
    if (bd_have_avx512()) {
        bd_f32_to_bf16_avx512(src, dst, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], sizeof u);
        if ((u & 0x7fffffffu) > 0x7f800000u) {
            dst[i] = (uint16_t)((u >> 16) | 0x40u); // keep NaN a (quiet) NaN
        } else {
            u += 0x7fffu + ((u >> 16) & 1u); // round to nearest even
            dst[i] = (uint16_t)(u >> 16);
        }
    }
}

void bd_bf16_to_f32(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, sizeof u);
    }
}

size_t bd_packed_size(const bd_prim *p) {
    return dnnl_memory_desc_get_size(&p->wpacked);
}

dnnl_status_t bd_relayout(bd_device *d, const dnnl_memory_desc_t *from,
        const dnnl_memory_desc_t *to, void *ptr, const char **step) {
    dnnl_status_t st = dnnl_success;
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_primitive_t r = NULL;
    dnnl_memory_t src = NULL, dst = NULL;
    size_t size = dnnl_memory_desc_get_size(to);
    void *tmp = bd_alloc(size);
    if (tmp == NULL) {
        *step = "allocate the relayout copy";
        return dnnl_out_of_memory;
    }
    omp_set_num_threads(d->nthreads);
    TRY(dnnl_memory_create(&src, from, d->engine, ptr), "wrap weights");
    TRY(dnnl_memory_create(&dst, to, d->engine, tmp), "wrap relayout copy");
    TRY(dnnl_reorder_primitive_desc_create(&rpd, from, d->engine, to, d->engine, NULL),
            "create weights reorder");
    TRY(dnnl_primitive_create(&r, rpd), "create weights reorder");
    {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
        TRY(dnnl_primitive_execute(r, d->stream, 2, args), "reorder weights");
        TRY(dnnl_stream_wait(d->stream), "wait for stream");
    }
    memcpy(ptr, tmp, size);
out:
    if (r) dnnl_primitive_destroy(r);
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    if (src) dnnl_memory_destroy(src);
    if (dst) dnnl_memory_destroy(dst);
    free(tmp);
    return st;
}

void *bd_alloc(size_t size) {
    // Large buffers start on a page: glibc puts a 64-byte-aligned mmap'd
    // block 64 bytes into its first page, so every 4 KiB row of a matrix
    // straddles two pages; measured 5-10% slower sgemm at 1024^3 than the
    // same matmul on page-aligned memory.
    void *p = NULL;
    if (posix_memalign(&p, size >= (1 << 16) ? 4096 : 64, size) != 0) return NULL;
    return p;
}

void bd_free(void *p) { free(p); }

dnnl_status_t bd_bf16_matmul_works(bd_device *d, const char **step) {
    bd_prim *p = NULL;
    dnnl_status_t st = bd_matmul_create(d, 0, 16, 16, 16, 0, dnnl_bf16, dnnl_f32, 0,
            dnnl_alg_kind_undef, 1.0f, 0, 0, &p, step);
    bd_prim_destroy(p);
    return st;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

dnnl_status_t bd_direct_matmul(int64_t m, int64_t n, int64_t k, int iters,
        int nthreads, dnnl_data_type_t ab_dt, double *seconds,
        const char **step) {
    dnnl_status_t st = dnnl_success;
    dnnl_engine_t engine = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t mem[3] = {NULL, NULL, NULL};
    dnnl_memory_desc_t src, wei, dst;
    dnnl_matmul_desc_t desc;

    omp_set_num_threads(nthreads);
    TRY(dnnl_engine_create(&engine, dnnl_cpu, 0), "create CPU engine");
    TRY(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags), "create stream");
    dnnl_dims_t sd = {m, k}, wd = {k, n}, dd = {m, n};
    TRY(dnnl_memory_desc_init_by_tag(&src, 2, sd, ab_dt, dnnl_ab), "describe src");
    TRY(dnnl_memory_desc_init_by_tag(&wei, 2, wd, ab_dt, dnnl_ab), "describe weights");
    TRY(dnnl_memory_desc_init_by_tag(&dst, 2, dd, dnnl_f32, dnnl_ab), "describe dst");
    TRY(dnnl_matmul_desc_init(&desc, &src, &wei, NULL, &dst), "init matmul descriptor");
    TRY(dnnl_primitive_desc_create(&pd, &desc, NULL, engine, NULL),
            "create primitive descriptor");
    TRY(dnnl_primitive_create(&prim, pd), "create primitive");
    TRY(dnnl_memory_create(&mem[0], &src, engine, DNNL_MEMORY_ALLOCATE), "allocate src");
    TRY(dnnl_memory_create(&mem[1], &wei, engine, DNNL_MEMORY_ALLOCATE), "allocate weights");
    TRY(dnnl_memory_create(&mem[2], &dst, engine, DNNL_MEMORY_ALLOCATE), "allocate dst");
    for (int i = 0; i < 2; i++) {
        // Small non-zero values: timing must not depend on zeros or denormals.
        void *h = NULL;
        TRY(dnnl_memory_get_data_handle(mem[i], &h), "map input");
        int64_t cnt = i == 0 ? m * k : k * n;
        if (ab_dt == dnnl_bf16) {
            uint16_t *p = h;
            for (int64_t j = 0; j < cnt; j++) p[j] = 0x3c00 + (uint16_t)(j % 97); // ~2^-7..
        } else {
            float *p = h;
            for (int64_t j = 0; j < cnt; j++) p[j] = (float)(j % 97) / 97.0f - 0.5f;
        }
    }
    dnnl_exec_arg_t args[3] = {
            {DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]}};
    TRY(dnnl_primitive_execute(prim, stream, 3, args), "warm-up execute");
    TRY(dnnl_stream_wait(stream), "wait for stream");
    double t0 = now_seconds();
    for (int i = 0; i < iters; i++) {
        TRY(dnnl_primitive_execute(prim, stream, 3, args), "execute");
        TRY(dnnl_stream_wait(stream), "wait for stream");
    }
    *seconds = now_seconds() - t0;
out:
    for (int i = 0; i < 3; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    if (prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (stream) dnnl_stream_destroy(stream);
    if (engine) dnnl_engine_destroy(engine);
    return st;
}

// ---- Decoder-LLM kernels ----

static inline __attribute__((always_inline)) float bf16_f(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// load reads n elements at element offset off of p (f32 or bf16) into dst.
static inline __attribute__((always_inline)) void load(const void *p, int bf16, int64_t off, int64_t n, float *restrict dst) {
    if (bf16) {
        const uint16_t *s = (const uint16_t *)p + off;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_f(s[i]);
    } else {
        memcpy(dst, (const float *)p + off, (size_t)n * sizeof(float));
    }
}

static inline __attribute__((always_inline)) void store(void *p, int bf16, int64_t off, int64_t n, const float *restrict src) {
    if (bf16) {
        uint16_t *o = (uint16_t *)p + off;
        for (int64_t i = 0; i < n; i++) o[i] = f_bf16(src[i]);
    } else {
        memcpy((float *)p + off, src, (size_t)n * sizeof(float));
    }
}

// Rows are processed through a stack copy in f32 of at most this many
// elements at a time, so bf16 and f32 share one vectorisable loop.
#define BD_CHUNK 1024

static inline __attribute__((always_inline)) void rms_row(const void *x, int bf16, const float *w,
        int64_t r, int64_t n, float eps, void *out) {
    if (!bf16) { // f32 in place, as below without the stack copies
        const float *xr = (const float *)x + r * n;
        float *o = (float *)out + r * n, ss = 0.0f;
        for (int64_t c = 0; c < n; c += BD_CHUNK) {
            int64_t len = n - c < BD_CHUNK ? n - c : BD_CHUNK;
#pragma omp simd reduction(+ : ss)
            for (int64_t j = 0; j < len; j++) ss += xr[c + j] * xr[c + j];
        }
        float inv = 1.0f / sqrtf(ss / (float)n + eps);
#pragma omp simd
        for (int64_t j = 0; j < n; j++) o[j] = xr[j] * inv * w[j];
        return;
    }
    float buf[BD_CHUNK];
    float ss = 0.0f;
    for (int64_t c = 0; c < n; c += BD_CHUNK) {
        int64_t len = n - c < BD_CHUNK ? n - c : BD_CHUNK;
        load(x, bf16, r * n + c, len, buf);
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < len; j++) ss += buf[j] * buf[j];
    }
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t c = 0; c < n; c += BD_CHUNK) {
        int64_t len = n - c < BD_CHUNK ? n - c : BD_CHUNK;
        load(x, bf16, r * n + c, len, buf);
#pragma omp simd
        for (int64_t j = 0; j < len; j++) buf[j] = buf[j] * inv * w[c + j];
        store(out, bf16, r * n + c, len, buf);
    }
}

void bd_rms_norm(const bd_device *d, const void *x, int bf16, const float *w,
        int64_t rows, int64_t n, float eps, void *out) {
    if (rows * n < BD_PAR_MIN) { // outside any OpenMP region: see BD_PAR_MIN
        for (int64_t r = 0; r < rows; r++) rms_row(x, bf16, w, r, n, eps, out);
        return;
    }
    omp_set_num_threads(d->nthreads);
#pragma omp parallel for
    for (int64_t r = 0; r < rows; r++) rms_row(x, bf16, w, r, n, eps, out);
}

static inline __attribute__((always_inline)) void swiglu_row(const void *x, int bf16, int64_t r,
        int64_t inter, void *out, int avx512) {
    if (!bf16 && avx512) {
        // f32 in place: no stack copies (they were half the op's time
        // at a 512-token prefill, whose rows are past the L2).
        const float *xr = (const float *)x + r * 2 * inter;
        bd_silu_mul_avx512(xr, xr + inter, (float *)out + r * inter, inter);
        return;
    }
    float g[BD_CHUNK], u[BD_CHUNK];
    for (int64_t c = 0; c < inter; c += BD_CHUNK) {
        int64_t len = inter - c < BD_CHUNK ? inter - c : BD_CHUNK;
        load(x, bf16, r * 2 * inter + c, len, g);
        load(x, bf16, r * 2 * inter + inter + c, len, u);
        if (avx512) {
            bd_silu_mul_avx512(g, u, g, len);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < len; j++) g[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
        }
        if (bf16 && avx512)
            bd_f32_to_bf16_avx512(g, (uint16_t *)out + r * inter + c, len);
        else
            store(out, bf16, r * inter + c, len, g);
    }
}

void bd_swiglu(const bd_device *d, const void *x, int bf16, int64_t rows,
        int64_t inter, void *out) {
    int avx512 = bd_have_avx512();
    if (rows * inter < BD_PAR_MIN / 4) {
        for (int64_t r = 0; r < rows; r++) swiglu_row(x, bf16, r, inter, out, avx512);
        return;
    }
    omp_set_num_threads(d->nthreads);
#pragma omp parallel for
    for (int64_t r = 0; r < rows; r++) swiglu_row(x, bf16, r, inter, out, avx512);
}

void bd_rope_table(const bd_device *d, const int32_t *pos, const float *inv_freq, int64_t t, int64_t half,
        float *tab) {
    omp_set_num_threads(d->nthreads);
#pragma omp parallel for if (t * half >= BD_PAR_MIN / 16)
    for (int64_t ti = 0; ti < t; ti++) {
        const float p = (float)pos[ti];
        float *cs = tab + ti * 2 * half, *sn = cs + half;
        for (int64_t i = 0; i < half; i++) {
            const float ang = p * inv_freq[i]; // f32, as HF computes it
            cs[i] = cosf(ang);
            sn[i] = sinf(ang);
        }
    }
}

static inline __attribute__((always_inline)) void rope_row(const void *x, int bf16, const float *tab, int64_t ti,
        int64_t h, int64_t dim, int64_t half, void *out) {
    // dim <= runtime.MaxHeadDim (1024): the rows fit the stack.
    const float *cs = tab + ti * 2 * half, *sn = cs + half;
    if (!bf16) { // in place or not: each pair is read before it is written
        for (int64_t hi = 0; hi < h; hi++) {
            const float *xa = (const float *)x + (ti * h + hi) * dim, *xb = xa + half;
            float *oa = (float *)out + (ti * h + hi) * dim, *ob = oa + half;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                const float a = xa[i], b = xb[i];
                oa[i] = a * cs[i] - b * sn[i];
                ob[i] = b * cs[i] + a * sn[i];
            }
        }
        return;
    }
    float a[512], b[512];
    for (int64_t hi = 0; hi < h; hi++) {
        int64_t off = (ti * h + hi) * dim;
        load(x, bf16, off, half, a);
        load(x, bf16, off + half, half, b);
        float ra[512], rb[512];
#pragma omp simd
        for (int64_t i = 0; i < half; i++) {
            ra[i] = a[i] * cs[i] - b[i] * sn[i];
            rb[i] = b[i] * cs[i] + a[i] * sn[i];
        }
        store(out, bf16, off, half, ra);
        store(out, bf16, off + half, half, rb);
    }
}

void bd_rope(const bd_device *d, const void *x, int bf16, const float *tab, int64_t t, int64_t h, int64_t dim,
        void *out) {
    int64_t half = dim / 2;
    if (t * h * dim < BD_PAR_MIN) {
        for (int64_t ti = 0; ti < t; ti++) rope_row(x, bf16, tab, ti, h, dim, half, out);
        return;
    }
    omp_set_num_threads(d->nthreads);
#pragma omp parallel for
    for (int64_t ti = 0; ti < t; ti++) rope_row(x, bf16, tab, ti, h, dim, half, out);
}

int64_t bd_kv_write(const bd_device *d, const void *x, const int32_t *slots,
        int64_t t, int64_t row, int64_t elem, void *cache, int64_t nslots) {
    for (int64_t i = 0; i < t; i++)
        if ((int64_t)slots[i] >= nslots) return i;
    const size_t bytes = (size_t)(row * elem);
    if ((int64_t)bytes * t < BD_PAR_BYTES) {
        for (int64_t i = 0; i < t; i++)
            if (slots[i] >= 0)
                memcpy((char *)cache + (int64_t)slots[i] * bytes, (const char *)x + i * bytes, bytes);
        return -1;
    }
    // Two rows may name one slot, and the later must win: a thread takes
    // the rows whose slots fall in its runs of about a page, in order, so
    // rows of one slot stay on one thread. (A prompt's rows land on fresh
    // cache pages, whose first-touch faults made this serial copy 6% of a
    // 512-token prefill on 16 threads.)
    const int64_t run = bytes >= 4096 ? 1 : (int64_t)(4096 / bytes);
    omp_set_num_threads(d->nthreads);
#pragma omp parallel
    {
        const int me = omp_get_thread_num(), all = omp_get_num_threads();
        for (int64_t i = 0; i < t; i++)
            if (slots[i] >= 0 && (int64_t)slots[i] / run % all == me)
                memcpy((char *)cache + (int64_t)slots[i] * bytes, (const char *)x + i * bytes, bytes);
    }
    return -1;
}

// Attention works through the cache a block at a time: the scores of one
// block for every query head of a kv-head group, one rescale of the running
// sums per block (online softmax), then the weighted V rows. Each K and V row
// is read once per (token, kv head) for the whole group.
#define BD_ATT_MAXG 16     // query heads per kv head handled together
#define BD_ATT_TILE 32     // cache positions per score tile

static inline __attribute__((always_inline)) float dot_f32(const float *restrict a, const float *restrict b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline __attribute__((always_inline)) float dot_bf16(const float *restrict a, const uint16_t *restrict b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * bf16_f(b[i]);
    return s;
}

static inline __attribute__((always_inline)) void axpy_f32(float *restrict y, float a, const float *restrict x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static inline __attribute__((always_inline)) void axpy_bf16(float *restrict y, float a, const uint16_t *restrict x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] += a * bf16_f(x[i]);
}

// kv_widen puts the f16, Q8_0 or Q4_0 (kvt) cache row at element off in
// dst as f32 (dequant.c's decoders).
static void kv_widen(const void *base, int kvt, int64_t off, float *dst, int64_t dim) {
    if (kvt == BD_KV_F16)
        bd_dequant_f16((const uint16_t *)base + off, dst, dim);
    else if (kvt == BD_KV_Q4_0)
        bd_dequant_q4_0((const uint8_t *)base + off / 32 * BD_KV_BLOCK(kvt), dst, dim);
    else
        bd_dequant_q8_0((const uint8_t *)base + off / 32 * BD_KV_BLOCK(kvt), dst, dim);
}

// attend_body computes the output of token ti's query heads of kv head g
// over the n cache positions its block-table row maps. It is inlined into
// one function per instruction set (below), chosen at run time from the
// CPU's features: the file's default target is baseline x86-64 (SSE2),
// where the dot products run at a quarter of AVX-512's width.
#define BD_INLINE static inline __attribute__((always_inline))
BD_INLINE void attend_body(const void *q, int q_bf16, const void *kc, const void *vc,
        int kvt, const int32_t *row, int64_t n, int64_t ti, int64_t g,
        int64_t hq, int64_t hkv, int64_t dim, int64_t bs, int64_t group,
        float scale, void *out, int fastexp) {
    int64_t kvrow = hkv * dim; // elements of one cache position
    for (int64_t g0 = 0; g0 < group; g0 += BD_ATT_MAXG) {
        int64_t gn = group - g0 < BD_ATT_MAXG ? group - g0 : BD_ATT_MAXG;
        // Stack: gn*dim*2 floats of q and acc, and a row (<= 132 KiB at
        // the limits; typical 7*128*2*4 = 7 KiB).
        float qs[gn * dim], acc[gn * dim], kr[dim]; // kr: an f16, Q8_0 or Q4_0 row widened
        const int blk = kvt == BD_KV_Q8_0 || kvt == BD_KV_Q4_0 || kvt == BD_KV_F16;
        float mx[BD_ATT_MAXG], sum[BD_ATT_MAXG], sc[BD_ATT_MAXG][BD_ATT_TILE];
        int64_t h0 = g * group + g0;
        for (int64_t j = 0; j < gn; j++) {
            load(q, q_bf16, (ti * hq + h0 + j) * dim, dim, qs + j * dim);
            mx[j] = -INFINITY;
            sum[j] = 0.0f;
        }
        memset(acc, 0, sizeof acc);
        for (int64_t p0 = 0; p0 < n; p0 += BD_ATT_TILE) {
            int64_t pn = n - p0 < BD_ATT_TILE ? n - p0 : BD_ATT_TILE;
            // Scores of the tile.
            for (int64_t k = 0; k < pn; k++) {
                int64_t p = p0 + k;
                int64_t off = ((int64_t)row[p / bs] * bs + p % bs) * kvrow + g * dim;
                if (blk) kv_widen(kc, kvt, off, kr, dim);
                for (int64_t j = 0; j < gn; j++)
                    sc[j][k] = scale * (kvt == BD_KV_BF16 ? dot_bf16(qs + j * dim, (const uint16_t *)kc + off, dim)
                                        : dot_f32(qs + j * dim, blk ? kr : (const float *)kc + off, dim));
            }
            // Online softmax: rescale the running sums once per tile.
            for (int64_t j = 0; j < gn; j++) {
                float m = mx[j];
                for (int64_t k = 0; k < pn; k++) m = sc[j][k] > m ? sc[j][k] : m;
                float c = expf(mx[j] - m); // 0 on the first tile
                if (c != 1.0f) {
                    sum[j] *= c;
                    for (int64_t i = 0; i < dim; i++) acc[j * dim + i] *= c;
                }
                mx[j] = m;
                if (fastexp) {
                    for (int64_t k = 0; k < pn; k++) sc[j][k] -= m;
                    bd_exp_avx512(sc[j], pn);
                } else {
                    for (int64_t k = 0; k < pn; k++) sc[j][k] = expf(sc[j][k] - m);
                }
                for (int64_t k = 0; k < pn; k++) sum[j] += sc[j][k];
            }
            for (int64_t k = 0; k < pn; k++) {
                int64_t p = p0 + k;
                int64_t off = ((int64_t)row[p / bs] * bs + p % bs) * kvrow + g * dim;
                if (blk) kv_widen(vc, kvt, off, kr, dim);
                for (int64_t j = 0; j < gn; j++) {
                    if (kvt == BD_KV_BF16)
                        axpy_bf16(acc + j * dim, sc[j][k], (const uint16_t *)vc + off, dim);
                    else
                        axpy_f32(acc + j * dim, sc[j][k], blk ? kr : (const float *)vc + off, dim);
                }
            }
        }
        for (int64_t j = 0; j < gn; j++) {
            float inv = 1.0f / sum[j];
            for (int64_t i = 0; i < dim; i++) acc[j * dim + i] *= inv;
            store(out, q_bf16, (ti * hq + h0 + j) * dim, dim, acc + j * dim);
        }
    }
}

#define BD_ATTEND_ARGS const void *q, int q_bf16, const void *kc, const void *vc, \
        int kvt, const int32_t *row, int64_t n, int64_t ti, int64_t g,  \
        int64_t hq, int64_t hkv, int64_t dim, int64_t bs, int64_t group,    \
        float scale, void *out
#define BD_ATTEND_CALL q, q_bf16, kc, vc, kvt, row, n, ti, g, hq, hkv, dim, bs, group, scale, out

__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
static void attend_avx512(BD_ATTEND_ARGS) { attend_body(BD_ATTEND_CALL, 1); }

__attribute__((target("avx2,fma")))
static void attend_avx2(BD_ATTEND_ARGS) { attend_body(BD_ATTEND_CALL, 0); }

static void attend_base(BD_ATTEND_ARGS) { attend_body(BD_ATTEND_CALL, 0); }

typedef void (*attend_fn)(BD_ATTEND_ARGS);

// split_blocks cuts t tokens into blocks of up to tb consecutive tokens of
// one sequence: block b is tokens start[b]..start[b+1]-1. Returns the
// number of blocks.
static int64_t split_blocks(const int32_t *seq, int64_t t, int64_t tb, int64_t *start) {
    int64_t nb = 0;
    for (int64_t ti = 0; ti < t;) {
        int64_t e = ti + 1;
        while (e < t && e - ti < tb && seq[e] == seq[ti]) e++;
        start[nb++] = ti;
        ti = e;
    }
    start[nb] = t;
    return nb;
}

typedef void (*attend_rows_fn)(const void *q, int q_bf16, const void *kc, const void *vc, int kvt,
        const int32_t *row, const int32_t *pos, int64_t t0, int64_t tn, int64_t h0, int64_t hc, int64_t g,
        int64_t hq, int64_t hkv, int64_t dim, int64_t bs, float scale, void *out);

// attend_block_avx512 runs one block (tokens t0..t0+tn-1 × query heads
// h0..h0+hn-1 of kv head g, at most 16 rows) on the AVX-512 kernels: a
// block of fewer than BD_FA_MINROWS rows that holds the whole group (a
// decode step with a small group) takes one a token (the group kernel or
// attend_body, which waste no vector lanes), any other the row kernel.
static void attend_block_avx512(attend_fn one, attend_rows_fn rows, int whole, const void *q, int q_bf16, const void *kc,
        const void *vc, int kvt, const int32_t *row, const int32_t *pos, int64_t t0, int64_t tn, int64_t h0,
        int64_t hn, int64_t g, int64_t hq, int64_t hkv, int64_t dim, int64_t bs, float scale, void *out) {
    if (tn * hn < BD_FA_MINROWS && whole) {
        for (int64_t ti = t0; ti < t0 + tn; ti++)
            one(q, q_bf16, kc, vc, kvt, row, (int64_t)pos[ti] + 1, ti, g, hq, hkv, dim, bs, hq / hkv, scale, out);
        return;
    }
    rows(q, q_bf16, kc, vc, kvt, row, pos, t0, tn, h0, hn, g, hq, hkv, dim, bs, scale, out);
}

// paged_attention_amx runs bd_paged_attention's checked work with the
// blocks of at least 16 query rows (prefill chunks) on AMX tiles
// (attend_amx.c) and the rest (decode steps) on the AVX-512 kernels, as
// the caller would. A block is up to BD_AMX_ROWS rows (tokens of one
// sequence × a kv head's query heads); blocks shrink, down to 16 rows,
// while there would be fewer than two a thread. Returns -1 (nothing
// written) when it cannot allocate its scratch, 1 (nothing written) when
// no block has 16 rows: a decode step's blocks are one token each, and
// building the AMX team, its scratch and its tile state for them cost a
// decode step's every layer a few microseconds.
static int paged_attention_amx(const bd_device *d, attend_fn one, attend_rows_fn rows, const void *q, int q_bf16, const void *kc,
        const void *vc, int kvt, const int32_t *table, const int32_t *seq, const int32_t *pos, int64_t t,
        int64_t hq, int64_t hkv, int64_t dim, int64_t bs, int64_t maxb, float scale, int64_t work, void *out) {
    const int64_t group = hq / hkv, minb = (16 + group - 1) / group;
    int64_t *start = malloc((size_t)(t + 1) * sizeof *start);
    if (start == NULL) return -1;
    int64_t nb = 0;
    for (int64_t tb = BD_AMX_ROWS / group;; tb = tb / 2 > minb ? tb / 2 : minb) {
        nb = split_blocks(seq, t, tb, start);
        if (tb <= minb || nb * hkv >= 2 * d->nthreads) break;
    }
    int64_t b16 = 0;
    while (b16 < nb && (start[b16 + 1] - start[b16]) * group < 16) b16++;
    if (b16 == nb) {
        free(start);
        return 1;
    }
    const int64_t tasks = nb * hkv, wbytes = (bd_attend_amx_bytes(dim) + 63) & ~(int64_t)63;
    int failed = 0;
#pragma omp parallel if (work >= BD_PAR_MIN && tasks > 1)
    {
        void *mine = aligned_alloc(64, (size_t)wbytes);
        if (mine == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) {
            bd_attend_amx_begin();
            // Largest first: a prefill's last blocks see the most keys.
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = tasks - 1; i >= 0; i--) {
                const int64_t b = i / hkv, g = i % hkv, t0 = start[b], tn = start[b + 1] - t0;
                const int32_t *row = table + (int64_t)seq[t0] * maxb;
                if (tn * group >= 16)
                    bd_attend_amx(q, q_bf16, kc, vc, kvt, row, pos, t0, tn, g, hq, hkv, dim, bs, scale, out, mine);
                else
                    attend_block_avx512(one, rows, 1, q, q_bf16, kc, vc, kvt, row, pos, t0, tn, g * group, group, g, hq,
                            hkv, dim, bs, scale, out);
            }
            bd_attend_amx_end();
        }
        free(mine);
    }
    free(start);
    return failed ? -1 : 0;
}

// decode_parts runs a decode step of few tokens (one a sequence, groups
// for the group kernel) whose tasks, a token's kv head each, would leave
// threads idle, by parts of BD_FA_PART cache positions: each part's
// softmax state on any thread, then each token's parts merged in order, as
// bd_attend_group_avx512 merges them on one thread, so the result is the
// same. A single long context then runs on every thread instead of one a
// kv head (2 for Qwen2.5). Returns 1, having written nothing, when no
// context is longer than one part or it cannot allocate its scratch.
static int decode_parts(const bd_device *d, bd_attend_part_fn part, const void *q, int q_bf16, const void *kc, const void *vc,
        int kvt, const int32_t *table, const int32_t *seq, const int32_t *pos, int64_t t, int64_t hq,
        int64_t hkv, int64_t dim, int64_t bs, int64_t maxb, float scale, void *out) {
    const int64_t group = hq / hkv, sw = group * (dim + 2);
    int64_t items = 0;
    for (int64_t ti = 0; ti < t; ti++) items += hkv * (((int64_t)pos[ti] + BD_FA_PART) / BD_FA_PART);
    if (items == t * hkv) return 1;
    int64_t *first = malloc((size_t)(t + 1) * sizeof *first); // token ti's first item
    float *st = malloc((size_t)(items * sw) * sizeof *st);
    if (!first || !st) {
        free(first);
        free(st);
        return 1;
    }
    first[0] = 0;
    for (int64_t ti = 0; ti < t; ti++) first[ti + 1] = first[ti] + hkv * (((int64_t)pos[ti] + BD_FA_PART) / BD_FA_PART);
    omp_set_num_threads(d->nthreads);
#pragma omp parallel
    {
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < items; i++) {
            int64_t ti = 0;
            while (first[ti + 1] <= i) ti++;
            const int64_t parts = (first[ti + 1] - first[ti]) / hkv, g = (i - first[ti]) / parts,
                          s = (i - first[ti]) % parts, n = (int64_t)pos[ti] + 1, p0 = s * BD_FA_PART;
            part(q, q_bf16, kc, vc, kvt, table + (int64_t)seq[ti] * maxb, p0,
                    n - p0 < BD_FA_PART ? n : p0 + BD_FA_PART, ti, g, hq, hkv, dim, bs, group, scale, st + i * sw);
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < t * hkv; i++) {
            const int64_t ti = i / hkv, g = i % hkv, parts = (first[ti + 1] - first[ti]) / hkv;
            float *base = st + (first[ti] + g * parts) * sw;
            for (int64_t s = 1; s < parts; s++) bd_attend_group_merge(base, base + s * sw, group, dim);
            bd_attend_group_finish(base, q_bf16, ti, g, hq, dim, group, out);
        }
    }
    free(first);
    free(st);
    return 0;
}

static attend_fn attend_pick(void) {
    if (bd_have_avx512()) return attend_avx512;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return attend_avx2;
    return attend_base;
}

int64_t bd_paged_attention(const bd_device *d, const void *q, int q_bf16,
        const void *kc, const void *vc, int kvt, const int32_t *table,
        const int32_t *seq, const int32_t *pos, int64_t t, int64_t hq,
        int64_t hkv, int64_t dim, int64_t nblocks, int64_t bs, int64_t s,
        int64_t maxb, float scale, int amx, int bf16, void *out, int *why) {
    // Check every index first, so a bad one leaves out untouched.
    for (int64_t ti = 0; ti < t; ti++) {
        if (seq[ti] < 0 || seq[ti] >= s) { *why = 1; return ti; }
        if (pos[ti] < 0 || (int64_t)pos[ti] / bs >= maxb) { *why = 2; return ti; }
        const int32_t *row = table + (int64_t)seq[ti] * maxb;
        for (int64_t b = 0; b <= (int64_t)pos[ti] / bs; b++)
            if (row[b] < 0 || row[b] >= nblocks) { *why = 3; return ti; }
    }
    int64_t group = hq / hkv;
    int64_t work = 0;
    for (int64_t ti = 0; ti < t; ti++) work += ((int64_t)pos[ti] + 1) * hq * dim;
    attend_fn attend = attend_pick();
    // A decode token's group of heads takes the group kernel where it
    // fits (head dims up to BD_FA_GROUPDIM), blocks of more rows the row
    // kernel; both on bf16 products where the op allows them, the cache is
    // not f32 and the CPU has AVX512-BF16.
    const int b16 = bf16 && kvt != BD_KV_F32 && attend == attend_avx512 && dim % 32 == 0 && dim <= BD_FA_MAXDIM &&
            bd_have_avx512bf16();
    const int fits = attend == attend_avx512 && dim % 16 == 0 && dim <= BD_FA_GROUPDIM && group <= BD_FA_GROUP;
    const attend_fn one = fits ? (b16 ? bd_attend_group_bf16 : bd_attend_group_avx512) : attend;
    const attend_rows_fn rows = b16 ? bd_attend_rows_bf16 : bd_attend_rows_avx512;
    omp_set_num_threads(d->nthreads);
    if (amx && attend == attend_avx512 && dim % 32 == 0 && dim <= BD_FA_MAXDIM && group <= BD_AMX_ROWS &&
            paged_attention_amx(d, one, rows, q, q_bf16, kc, vc, kvt, table, seq, pos, t, hq, hkv, dim, bs, maxb, scale,
                    work, out) == 0)
        return -1;
    if (attend == attend_avx512 && dim % 16 == 0 && dim <= BD_FA_MAXDIM) {
        // Blocks of up to 16 query rows (consecutive tokens of one sequence
        // × query heads of one kv head) for the row kernel; a block of one
        // token with fewer than BD_FA_MINROWS heads (a decode step with a
        // small group) takes the group kernel (head dims up to
        // BD_FA_GROUPDIM) or attend_body, which waste no vector lanes.
        // (This branch's groups are under BD_FA_MINROWS <= BD_FA_GROUP.)
        int64_t hc = group < 16 ? group : 16, tb = 16 / hc;
        int64_t chunks = (group + hc - 1) / hc;
        int64_t *start = malloc((size_t)(t + 1) * sizeof *start);
        if (start != NULL) {
            int64_t nb = split_blocks(seq, t, tb, start);
            int64_t tasks = nb * hkv * chunks;
            if (fits && group < BD_FA_MINROWS && nb == t && tasks < 2 * d->nthreads && work >= BD_PAR_MIN &&
                    decode_parts(d, b16 ? bd_attend_group_part_bf16 : bd_attend_group_part_avx512, q, q_bf16, kc, vc,
                            kvt, table, seq, pos, t, hq, hkv, dim,
                            bs, maxb, scale, out) == 0) {
                free(start);
                return -1;
            }
            // Largest first: a prefill's last blocks see the most keys.
#pragma omp parallel for schedule(dynamic, 1) if (work >= BD_PAR_MIN && tasks > 1)
            for (int64_t i = tasks - 1; i >= 0; i--) {
                int64_t b = i / (hkv * chunks), g = i / chunks % hkv, c = i % chunks;
                int64_t t0 = start[b], tn = start[b + 1] - t0;
                int64_t h0 = g * group + c * hc, hn = group - c * hc < hc ? group - c * hc : hc;
                attend_block_avx512(one, rows, chunks == 1, q, q_bf16, kc, vc, kvt, table + (int64_t)seq[t0] * maxb,
                        pos, t0, tn, h0, hn, g, hq, hkv, dim, bs, scale, out);
            }
            free(start);
            return -1;
        }
    }
    int64_t tasks = t * hkv;
#pragma omp parallel for schedule(dynamic, 1) if (work >= BD_PAR_MIN && tasks > 1)
    for (int64_t task = 0; task < tasks; task++) {
        int64_t ti = task / hkv;
        attend(q, q_bf16, kc, vc, kvt, table + (int64_t)seq[ti] * maxb,
                (int64_t)pos[ti] + 1, ti, task % hkv, hq, hkv, dim, bs, group, scale, out);
    }
    return -1;
}
