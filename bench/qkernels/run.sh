#!/usr/bin/env bash
# Builds bench/qkernels/qkernels.c against runtime/onednn's kernel sources
# (gcc, -O3 -fopenmp, as cgo builds them; libdnnl for dnnl_ops.c) into a
# temporary directory and runs it with the arguments given:
#
#   bash bench/qkernels/run.sh TYPE N K M ITERS
#   e.g. bash bench/qkernels/run.sh 12 2816 1024 16 20   (Q4_K, 16 rows)
#   bash bench/qkernels/run.sh stream N K THREADS ITERS
#   e.g. bash bench/qkernels/run.sh stream 128256 1024 2 20   (a Q8_0 lm_head, one row)
#   bash bench/qkernels/run.sh many N K COUNT THREADS
#   e.g. bash bench/qkernels/run.sh many 128 896 3000 2   (one row through 3000 k projections, from memory)
#   bash bench/qkernels/run.sh token LAYERS HIDDEN KVDIM INTER VOCAB THREADS ITERS
#   e.g. bash bench/qkernels/run.sh token 12 1024 256 2816 128256 2 10   (llama-12x1024's Q8_0 token)
#   bash bench/qkernels/run.sh threads TYPE N K M THREADS ITERS [swiglu]
#   e.g. bash bench/qkernels/run.sh threads 8 896 4864 512 16 4   (qamx on 16 threads, wall time)
#   bash bench/qkernels/run.sh attend HQ HKV DIM TOKENS ITERS
#   e.g. bash bench/qkernels/run.sh attend 14 2 64 512 5   (a prefill's attention, f32 rows against AMX)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
src=$root/runtime/onednn
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
gcc -O3 -fopenmp -I"$src" "$root/bench/qkernels/qkernels.c" "$src/qamx.c" "$src/qgemm.c" "$src/dequant.c" \
  "$src/dnnl_ops.c" "$src/vec_avx512.c" "$src/attend_avx512.c" "$src/attend_amx.c" "$src/gemv_bf16.c" -o "$out/qkernels" -ldnnl -lm
"$out/qkernels" "$@"
