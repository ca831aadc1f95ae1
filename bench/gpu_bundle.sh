#!/usr/bin/env bash
# Builds, on this CPU machine, everything bench/gpu_check.sh needs on a GPU
# host that has no Go and no network, as one compressed file (make gpu-bundle):
#   libexec/  stripped brokerd, brokerctl, mkbert, mkllm, mkgguf, gpucheck
#             (bench/gpucheck) and the test binaries pjrt.test
#             (TestAgainstCPU) and repo.test (TestHuggingFaceFixture);
#   bin/      one wrapper per binary that puts lib/ first on
#             LD_LIBRARY_PATH for that binary alone (Python's torch keeps its
#             own libraries);
#   lib/      the shared libraries of the binaries that a stock CUDA image
#             lacks: Debian's oneDNN (libdnnl.so.2), libOpenCL.so.1 and
#             libgomp.so.1 (glibc, libstdc++ and libgcc_s are the host's),
#             and llama.cpp's libggml-base.so, which mkgguf opens to quantize;
#   MANIFEST  version, Go, build host, sizes and sha256 of every file.
# The random checkpoints are written on the GPU host by mkbert, mkllm and mkgguf
# (the 0.5B-shaped LLM is 1.3 GB: smaller to make than to carry).
#
#   bench/gpu_bundle.sh [OUT_DIR]   (default .gpu; env GPU_BUNDLE_COMPRESS=xz|gz, default xz;
#                                    GPU_BUNDLE_MINIMAL=1: only what GPU_CHECK_CPU=1 runs, for the test)
#
# Writes OUT_DIR/bundle.tar.xz (or .tar.gz) and prints its size and the
# working tree's: the device tool carries both, 64 MiB at most.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/.gpu}
compress=${GPU_BUNDLE_COMPRESS:-xz}
GO=${GO:-go}
version=$(git -C "$root" describe --always --dirty 2>/dev/null || echo dev)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/libexec" "$stage/bin" "$stage/lib" "$out"

cd "$root"
echo "== building (stripped) into $stage"
# (No -trimpath: the compile cache is then the one make build and the tests fill.)
if [ "${GPU_BUNDLE_MINIMAL:-0}" = 1 ]; then
  $GO build -ldflags "-s -w -X main.version=$version" -o "$stage/libexec/" \
    ./cmd/brokerd ./cmd/brokerctl ./bench/mkllm ./bench/mkgguf ./bench/gpucheck
else
  $GO build -ldflags "-s -w -X main.version=$version" -o "$stage/libexec/" \
    ./cmd/brokerd ./cmd/brokerctl ./bench/mkbert ./bench/mkllm ./bench/mkgguf ./bench/gpucheck
  $GO test -c -ldflags '-s -w' -o "$stage/libexec/pjrt.test" ./runtime/pjrt
  $GO test -c -ldflags '-s -w' -o "$stage/libexec/repo.test" ./runtime/models/repo
fi

echo "== shared libraries a stock CUDA image lacks"
# Copy by soname, following links; everything else ldd names is the host's.
ldd "$stage"/libexec/* 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r soname path; do
    case "$soname" in
      libdnnl.so.* | libOpenCL.so.* | libgomp.so.*)
        cp -L "$path" "$stage/lib/$soname"
        echo "$soname <- $path"
        ;;
    esac
  done
[ -e "$stage/lib/libdnnl.so.2" ] || { echo "libdnnl.so.2 not found by ldd (make deps)" >&2; exit 1; }

# llama.cpp's libggml-base.so, which mkgguf opens (dlopen, by path) to
# quantize as llama-quantize does: node-llama-cpp's copy, as
# runtime/quant/ggmlref's tests use it. Without it gpu_check.sh's
# gguf-greedy step says SKIP, so only the minimal (test) bundle may lack it.
ggml=
for f in "${BROKERD_GGML_LIB:-}" "$root/bench/peers/llamacpp/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so" \
  "$root/runtime/quant/ggmlref/testdata/npm/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so"; do
  if [ -n "$f" ] && [ -e "$f" ]; then
    ggml=$f
    break
  fi
done
if [ -n "$ggml" ]; then
  cp -L "$ggml" "$stage/lib/libggml-base.so"
  echo "libggml-base.so <- $ggml"
elif [ "${GPU_BUNDLE_MINIMAL:-0}" != 1 ]; then
  echo "no libggml-base.so (npm ci in bench/peers/llamacpp, or BROKERD_GGML_LIB=PATH)" >&2
  exit 1
fi

for f in "$stage"/libexec/*; do
  n=$(basename "$f")
  cat >"$stage/bin/$n" <<'SH'
#!/bin/sh
# bench/gpu_bundle.sh's wrapper: the bundle's libraries for this binary only.
d=$(cd "$(dirname "$0")/.." && pwd)
LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/libexec/$(basename "$0")" "$@"
SH
  chmod 0755 "$stage/bin/$n"
done

{
  echo "version $version"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -sr), $($GO version | cut -d' ' -f3-)"
  echo "glibc needed: $(objdump -T "$stage"/libexec/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
  (cd "$stage" && find libexec lib -type f -printf '%s %p\n' | sort -k2)
  (cd "$stage" && sha256sum libexec/* lib/*)
} >"$stage/MANIFEST"

rm -f "$out"/bundle.tar.*
case "$compress" in
  xz) file=$out/bundle.tar.xz; tar -C "$stage" -cf - . | xz -T0 -6 >"$file" ;;
  gz) file=$out/bundle.tar.gz; tar -C "$stage" -cf - . | gzip -1 >"$file" ;;
  *) echo "GPU_BUNDLE_COMPRESS=$compress: want xz or gz" >&2; exit 2 ;;
esac
bundle=$(stat -c %s "$file")
tree=$( (git -C "$root" ls-files -z --cached --others --exclude-standard 2>/dev/null || true) |
  (cd "$root" || exit 0; xargs -0 -r stat -c %s 2>/dev/null || true) | awk '{s += $1} END {print s + 0}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "bundle: $file $(mib "$bundle"); working tree (tracked and untracked, not ignored): $(mib "$tree"); together $(mib $((bundle + tree))) of the 64 MiB the device tool carries"
if [ $((bundle + tree)) -gt $((60 << 20)) ]; then
  echo "WARNING: over 60 MiB together: the device tool may refuse the carry" >&2
fi
