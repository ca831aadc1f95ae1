#!/usr/bin/env bash
# The llama.cpp comparison (this directory's main.go) on another x86-64 host
# that has neither Go nor network, such as a GPU host lent for minutes with
# many more cores than the build machine. Two steps:
#
#   bash bench/peers/llamacpp/wide_host.sh bundle [FILE]
#       on the build machine (after npm ci here, which main.go does on its
#       first run): the harness, brokerd and brokerctl built stripped, the
#       libraries a stock image lacks (libdnnl, libgomp, libOpenCL), this
#       machine's node, and node_modules without node-llama-cpp's 34 MB git
#       bundle of llama.cpp's source, into one xz file
#       (default .devbench/bundle.tar.xz; about 52 MiB; with DAEMON=0
#       without brokerd and brokerctl, about 42 MiB).
#   bash bench/peers/llamacpp/wide_host.sh run [FILE]
#       on the other host, from the repository root: unpacks it and runs
#       main.go's comparison, with -daemon, for each JOBS entry
#       shape:quant:seconds (default "llama-12x1024:q8_0:150
#       qwen2.5-0.5b:q8_0:200"), each under its own timeout and all within
#       BUDGET seconds (default 450); ROUNDS (3) interleaved rounds, DD (8s)
#       each daemon window (DAEMON=0: in process only); ARGS, more flags for
#       main.go (e.g. ARGS=-amx-relaid on an AMX host), with TAG naming their
#       outputs. Outputs go to $OUT (default /tmp/wide-host): facts.txt
#       (lscpu, memory, node) and SHAPE-QUANT[-TAG].txt.
#   LLM_ONLY=1 bash bench/peers/llamacpp/wide_host.sh bundle [FILE]
#       only runtime/models/llm's test binary and the libraries (about 9
#       MiB), for the ab step below. ONEDNN_TEST=1 adds runtime/onednn's
#       test binary (bin/onednn.test, about 3 MiB more), to run its tests
#       and kernel benchmarks on that host's CPU (from runtime/onednn, with
#       LD_LIBRARY_PATH at the bundle's lib), e.g. its AMX paths; then:
#   bash bench/peers/llamacpp/wide_host.sh ab [FILE]
#       on the other host: runtime/models/llm's decode and prefill
#       benchmarks (the bundle's llm.test; LLM_TEST=1 adds it to a full
#       bundle, which then nears the device's 64 MiB with the tree) for
#       each BENCH regexp (default: Qwen Q8_0 and llama1024 Q4_K decode,
#       the 512-token prefills), alternating FLAG=false and FLAG=true
#       (default FLAG -llm.amxrelaid; true first in even passes) for PASSES
#       passes (2) of BENCHTIME
#       (10x), on every core, within BUDGET seconds; to $OUT/ab.txt.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
cmd=${1:-}
file=${2:-$root/.devbench/bundle.tar.xz}

case "$cmd" in
bundle)
  set -e
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/bin" "$stage/lib" "$(dirname "$file")"
  if [ "${LLM_ONLY:-0}" = 1 ] || [ "${LLM_TEST:-0}" = 1 ]; then
    (cd "$root" && go test -c -ldflags '-s -w' -o "$stage/bin/llm.test" ./runtime/models/llm)
  fi
  if [ "${ONEDNN_TEST:-0}" = 1 ]; then
    (cd "$root" && go test -c -ldflags '-s -w' -o "$stage/bin/onednn.test" ./runtime/onednn)
  fi
  parts=(bin lib)
  if [ "${LLM_ONLY:-0}" != 1 ]; then
    [ -e "$here/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so" ] ||
      { echo "node-llama-cpp is not installed in $here: run the harness once (it runs npm ci)" >&2; exit 1; }
    pkgs=(./bench/peers/llamacpp)
    [ "${DAEMON:-1}" = 0 ] || pkgs+=(./cmd/brokerd ./cmd/brokerctl)
    (cd "$root" && go build -ldflags '-s -w' -o "$stage/bin/" "${pkgs[@]}")
    cp "$(command -v node)" "$stage/bin/node"
    tar -C "$here" -cf "$stage/nm.tar" --exclude='node_modules/node-llama-cpp/llama/gitRelease.bundle' node_modules
    parts+=(nm.tar)
  fi
  for b in "$stage"/bin/llamacpp "$stage"/bin/*.test; do
    [ -e "$b" ] || continue
    for l in $(ldd "$b" | awk '$3 ~ /^\// {print $3}'); do
      case $(basename "$l") in libdnnl.so.* | libgomp.so.* | libOpenCL.so.*) cp -L "$l" "$stage/lib/" ;; esac
    done
  done
  tar -C "$stage" -cf - "${parts[@]}" | xz -T0 -6 >"$file"
  echo "bundle: $file, $(($(stat -c %s "$file") >> 20)) MiB"
  ;;
run)
  OUT=${OUT:-/tmp/wide-host}
  mkdir -p "$OUT"
  t0=$(date +%s)
  el() { echo $(($(date +%s) - t0)); }
  db=$(mktemp -d)
  tar -C "$db" -xJf "$file" || { echo "cannot unpack $file" >&2; exit 1; }
  tar -C "$here" -xf "$db/nm.tar" || exit 1
  export PATH=$db/bin:$PATH LD_LIBRARY_PATH=$db/lib
  { lscpu; free -g; node --version; } >"$OUT/facts.txt" 2>&1
  cd "$root" || exit 1
  for job in ${JOBS:-llama-12x1024:q8_0:150 qwen2.5-0.5b:q8_0:200}; do
    IFS=: read -r s q lim <<<"$job"
    left=$((${BUDGET:-450} - $(el)))
    [ "$lim" -gt "$left" ] && lim=$left
    [ "$lim" -gt 60 ] || { echo "== $s $q: skipped, $left s of the budget left"; continue; }
    echo "== $s $q at $(el) s"
    daemon=(-daemon -daemon-duration "${DD:-8s}" -bin "$db/bin")
    [ "${DAEMON:-1}" = 0 ] && daemon=()
    res="$OUT/$s-$q${TAG:+-$TAG}.txt"
    # shellcheck disable=SC2086 # ARGS is a list of flags
    timeout "$lim" "$db/bin/llamacpp" -shape "$s" -quant "$q" -rounds "${ROUNDS:-3}" -gen-tokens 32 \
      -concurrency 1,16 -council=false -torch=false "${daemon[@]}" -work "$db/work" ${ARGS:-} >"$res" 2>&1
    echo "rc $? at $(el) s"
    tail -n 14 "$res"
  done
  ;;
ab)
  OUT=${OUT:-/tmp/wide-host}
  mkdir -p "$OUT"
  t0=$(date +%s)
  db=$(mktemp -d)
  tar -C "$db" -xJf "$file" bin lib || { echo "cannot unpack $file" >&2; exit 1; }
  [ -x "$db/bin/llm.test" ] || { echo "$file has no llm.test (bundled with LLM_TEST=0?)" >&2; exit 1; }
  export LD_LIBRARY_PATH=$db/lib
  cd "$root/runtime/models/llm" || exit 1
  { lscpu; free -g; } >"$OUT/facts.txt" 2>&1
  for pass in $(seq "${PASSES:-2}"); do
    for b in ${BENCH:-'DecodeQuantized/qwen0.5b/q8_0' 'DecodeQuantized/llama1024/q4_K' 'Prefill512/q4_K' 'Prefill512/q8_0'}; do
      # ABBA: the order flips every pass, since the second of two
      # processes in a row can run a third faster on that host with
      # nothing changed (bench/RESULTS.md: Q6_K, which the flag leaves as
      # it is, 1.33x in both passes when always second).
      order="false true"
      [ $((pass % 2)) = 0 ] && order="true false"
      for v in $order; do
        [ $(($(date +%s) - t0)) -lt "${BUDGET:-450}" ] || { echo "budget spent at pass $pass" | tee -a "$OUT/ab.txt"; exit 0; }
        echo "== pass $pass $b ${FLAG:--llm.amxrelaid}=$v" | tee -a "$OUT/ab.txt"
        "$db/bin/llm.test" -test.run '^$' -test.bench "$b" -test.benchtime "${BENCHTIME:-10x}" \
          -llm.threads="$(nproc)" "${FLAG:--llm.amxrelaid}=$v" 2>&1 | grep -E '^Benchmark' | tee -a "$OUT/ab.txt"
      done
    done
  done
  ;;
*)
  echo "usage: $0 bundle|run|ab [FILE]" >&2
  exit 2
  ;;
esac
