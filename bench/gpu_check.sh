#!/usr/bin/env bash
# Every GPU verification of brokerd in one call, for a GPU host lent for
# minutes: no Go, no network, everything built beforehand on the CPU machine
# by `make gpu-bundle` (bench/gpu_bundle.sh, into .gpu/). Run from the
# repository root on the GPU host:
#
#   bash bench/gpu_check.sh DIR        (make gpu-check; DIR default $OUT, else bench/gpu-results)
#
# Each step runs under its own timeout and the next runs whatever happened
# (no set -e across steps); all of them share a budget (GPU_CHECK_BUDGET,
# 420 s), so the whole run, unpacking included, stays under 8 minutes. Steps:
#   facts            nvidia-smi, OS, glibc, Python packages, the PJRT plugin, ldd
#   nvidia-compare   brokerd's GPU facts against nvidia-smi (bench/nvidia-compare.sh)
#   pjrt-devices     brokerd lists the GPU runnable on pjrt (bench/pjrt_gpu.sh);
#                    if not, again with the pip nvidia libraries on LD_LIBRARY_PATH
#   against-cpu      pjrt.test TestAgainstCPU: every op and graph, GPU vs oneDNN
#   bert-fixture     runtime/models/repo/testdata/hf-bert/make_fixture.py (transformers
#                    BertModel), repo.test TestHuggingFaceFixture on the CPU, then the
#                    fixture's Encode through brokerd on the GPU against BertModel
#   bert-throughput  Encode items/s through brokerd vs PyTorch eager (pjrt_gpu.sh, short)
#   llm-greedy       a random Qwen2.5-0.5B-shaped checkpoint (mkllm): brokerd's greedy
#                    tokens on the GPU (bench/gpucheck) vs transformers generate
#                    (bench/peers/hf_generate.py), float32, same prompt ids
#   gguf-greedy      that checkpoint as a Q4_K_M GGUF (bench/mkgguf, llama.cpp's own
#                    quantizer): brokerd must log dequantizing it onto the GPU, its greedy
#                    tokens there vs transformers on the file's dequantized float32
#                    weights, then the CPU adapter's tokens from the same file (quantized
#                    kernels) counted against the GPU's (informational)
#   llm-throughput   decode tokens/s through brokerd (brokerctl bench --generate) at
#                    1, 16 and 64 sequences vs transformers generate at batch 1, 16, 64
# DIR gets summary.md (one line per step, rewritten as each step ends, so a
# killed run leaves it), results.json, logs.tar.gz (every step's output, the
# brokerd logs and metrics) and hf-bert-fixture.tar.gz (the fixture, to commit).
#
# GPU_CHECK_CPU=1 runs the same script on a CPU machine (make test does, via
# bench/gpucheck's test): brokerd on the CPU adapter, a tiny checkpoint; the
# steps that need a GPU, CUDA or torch say SKIP.
set -uo pipefail

self=$(readlink -f "$0")
here=$(dirname "$self")
root=$(dirname "$here")

# ---------------------------------------------------------------- helpers

# x echoes a command into the step's log, then runs it.
x() {
  echo "+ $*" >&2
  "$@"
}

# key records a step's key figures for the summary (last call wins).
key() { printf '%s\n' "$*" >"$GC_KEY"; }

# start_brokerd NAME [ARGS...]: brokerd on a fresh socket with the step's
# device preference; sets SOCK and BPID; its log and metrics go to the logs.
start_brokerd() {
  local name=$1
  shift
  SOCK=$GC_WORK/$name.sock
  BMETRICS=127.0.0.1:$((19400 + RANDOM % 500))
  local dev=(--prefer gpu)
  [ -n "$GC_PLUGIN" ] && dev+=(--pjrt-plugin "cuda=$GC_PLUGIN")
  [ "$GC_CPU" = 1 ] || [ "${PREFER_CPU:-}" = 1 ] && dev=(--prefer cpu)
  echo "+ brokerd --socket $SOCK --state-dir $GC_WORK/$name-state --metrics-listen $BMETRICS ${dev[*]} $*" >&2
  "$GC_BIN/brokerd" --socket "$SOCK" --state-dir "$GC_WORK/$name-state" --metrics-listen "$BMETRICS" \
    --log-level info "${dev[@]}" "$@" 2>"$GC_LOGS/$name-brokerd.log" &
  BPID=$!
  BNAME=$name
  local _
  for _ in $(seq 1 600); do
    "$GC_BIN/brokerctl" --socket "$SOCK" health >/dev/null 2>&1 && return 0
    if ! kill -0 "$BPID" 2>/dev/null; then
      echo "brokerd exited during start; its log:" >&2
      tail -n 40 "$GC_LOGS/$name-brokerd.log" >&2
      BPID=
      return 1
    fi
    sleep 0.2
  done
  echo "brokerd not healthy after 120 s" >&2
  return 1
}

# brokerd_said is the last lines of the step's brokerd log, on one line.
brokerd_said() { tail -n 3 "$GC_LOGS/$BNAME-brokerd.log" 2>/dev/null | tr '\n' ' ' | head -c 600; }

# stop_brokerd saves brokerd's devices, models and metrics, then stops it.
stop_brokerd() {
  [ -n "${BPID:-}" ] || return 0
  "$GC_BIN/brokerctl" --socket "$SOCK" devices --json >"$GC_LOGS/$BNAME-devices.json" 2>&1 || true
  "$GC_BIN/brokerctl" --socket "$SOCK" models >"$GC_LOGS/$BNAME-models.txt" 2>&1 || true
  "$GC_BIN/brokerctl" --socket "$SOCK" stats >"$GC_LOGS/$BNAME-stats.txt" 2>&1 || true
  "$GC_BIN/brokerctl" --socket "$SOCK" report >"$GC_LOGS/$BNAME-report.txt" 2>&1 || true
  python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("http://" + sys.argv[1] + "/metrics", timeout=5).read().decode())' \
    "$BMETRICS" >"$GC_LOGS/$BNAME-metrics.txt" 2>&1 || true
  kill "$BPID" 2>/dev/null
  wait "$BPID" 2>/dev/null
  BPID=
}

# need_gpu SKIPs (exit 77) a step that cannot run without the GPU stack.
need_gpu() {
  if [ "$GC_CPU" = 1 ]; then
    key "SKIP: CPU mode (GPU_CHECK_CPU=1)"
    exit 77
  fi
}

need_plugin() {
  if [ -z "$GC_PLUGIN" ]; then
    key "no PJRT CUDA plugin (jax_plugins/xla_cuda*/xla_cuda_plugin.so) under Python site-packages"
    exit 1
  fi
}

# need_python MODULE... SKIPs (77) when a module is missing.
need_python() {
  local m
  for m in "$@"; do
    if ! python3 -c "import $m" 2>/dev/null; then
      key "SKIP: no Python module $m"
      exit 77
    fi
  done
}

# ---------------------------------------------------------------- steps

step_facts() {
  x date -u
  x uname -a
  head -4 /etc/os-release 2>/dev/null
  x ldd --version 2>&1 | head -1
  echo "cores: $(nproc)"
  free -g 2>/dev/null | head -2
  df -h /tmp 2>/dev/null | tail -1
  echo "== bundle"
  cat "$GC_LOGS/unpack.log" 2>/dev/null
  head -3 "$GC_GPU/MANIFEST" 2>/dev/null
  local nobundle=
  [ -x "$GC_GPU/libexec/brokerd" ] || nobundle="NO BUNDLE ($(head -c 200 "$GC_LOGS/unpack.log" 2>/dev/null)); "
  local gpu=none
  if command -v nvidia-smi >/dev/null; then
    x nvidia-smi
    x nvidia-smi -q
    gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null | head -1)
  else
    echo "no nvidia-smi"
  fi
  echo "== Python"
  python3 - <<'PY'
import glob, importlib.metadata as md, site, sys
print("python", sys.version.split()[0], sys.executable)
for d in ["torch", "transformers", "tokenizers", "safetensors", "numpy", "grpcio", "jax", "jaxlib",
          "jax-cuda13-pjrt", "jax-cuda13-plugin", "jax-cuda12-pjrt", "jax-cuda12-plugin", "accelerate"]:
    try:
        print(f"{d} {md.version(d)}")
    except md.PackageNotFoundError:
        print(f"{d} absent")
dirs = site.getsitepackages() + [site.getusersitepackages()]
for d in dirs:
    for p in sorted(glob.glob(d + "/jax_plugins/*")):
        print("jax plugin dir:", p)
    for p in sorted(glob.glob(d + "/nvidia/*/lib")):
        print("nvidia lib dir:", p)
PY
  echo "== PJRT plugin: ${GC_PLUGIN:-none}"
  local missing=""
  if [ -n "$GC_PLUGIN" ]; then
    ls -la "$GC_PLUGIN"
    x ldd "$GC_PLUGIN"
    ldd "$GC_PLUGIN" 2>&1 | grep -q 'not found' && missing="plugin: $(ldd "$GC_PLUGIN" 2>&1 | awk '/not found/ {print $1}' | tr '\n' ' ')"
  fi
  echo "== ldd of the bundle's binaries (with its lib/)"
  local f
  for f in "$GC_GPU"/libexec/*; do
    echo "-- $f"
    LD_LIBRARY_PATH="$GC_GPU/lib" ldd "$f" 2>&1
    if LD_LIBRARY_PATH="$GC_GPU/lib" ldd "$f" 2>&1 | grep -q 'not found'; then
      missing="$missing $(basename "$f"): $(LD_LIBRARY_PATH="$GC_GPU/lib" ldd "$f" 2>&1 | awk '/not found/ {print $1}' | tr '\n' ' ')"
    fi
  done
  x "$GC_BIN/brokerd" --version 2>&1 | head -2
  local vers
  vers=$(python3 -c '
import importlib.metadata as md
out = []
for d in ["torch", "transformers", "jax", "jax-cuda13-pjrt"]:
    try: out.append(d + " " + md.version(d))
    except md.PackageNotFoundError: out.append(d + " absent")
print(", ".join(out))')
  key "${nobundle}GPU: $gpu; $(ldd --version 2>&1 | head -1 | awk '{print "glibc", $NF}'); $vers; plugin ${GC_PLUGIN:-none}; missing libraries: ${missing:-none}"
  [ -z "$missing$nobundle" ] || exit 1
  # Without nvidia-smi there is no GPU to check: the facts are still facts.
  return 0
}

step_nvidia_compare() {
  need_gpu
  command -v nvidia-smi >/dev/null || { key "no nvidia-smi"; exit 1; }
  BIN=$GC_BIN LOG_DIR=$GC_LOGS/nvidia-compare x bash "$here/nvidia-compare.sh" | tee "$GC_WORK/nvcmp.txt"
  local rc=${PIPESTATUS[0]}
  key "$(grep -c ' yes$' "$GC_WORK/nvcmp.txt") fields agree, $(grep -c ' NO$' "$GC_WORK/nvcmp.txt") differ: $(grep ' NO$' "$GC_WORK/nvcmp.txt" | awk '{print $1}' | tr '\n' ' ')"
  return "$rc"
}

step_pjrt_devices() {
  need_gpu
  need_plugin
  local common=(env BIN="$GC_BIN" PJRT_PLUGIN="$GC_PLUGIN" PJRT_GPU_STEPS=devices)
  if x "${common[@]}" LOG_DIR="$GC_LOGS/pjrt-devices" bash "$here/pjrt_gpu.sh"; then
    key "every GPU runnable on pjrt: $(grep -h '^gpu:' "$GC_LOG" | head -2 | tr '\n' ';')"
    return 0
  fi
  # The jax plugin may rely on jax (Python) to have loaded CUDA's pip
  # libraries first; brokerd dlopens it alone. Try again with them on
  # LD_LIBRARY_PATH, and keep that for the later steps if it helps.
  local nv
  nv=$(python3 -c '
import glob, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
print(":".join(sorted(p for d in dirs for p in glob.glob(d + "/nvidia/*/lib"))))')
  if [ -z "$nv" ]; then
    key "GPU NOT runnable on pjrt (no pip nvidia libraries to retry with); see the log"
    return 1
  fi
  echo "== again with the pip nvidia libraries on LD_LIBRARY_PATH"
  if LD_LIBRARY_PATH="$nv${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" x "${common[@]}" LOG_DIR="$GC_LOGS/pjrt-devices-nvlibs" bash "$here/pjrt_gpu.sh"; then
    echo "export LD_LIBRARY_PATH=\"$nv\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\"" >"$GC_WORK/env.sh"
    key "runnable on pjrt ONLY with the pip nvidia libraries on LD_LIBRARY_PATH (later steps use them): $(grep -h '^gpu:' "$GC_LOG" | head -2 | tr '\n' ';')"
    return 1
  fi
  key "GPU NOT runnable on pjrt, even with the pip nvidia libraries; see the log"
  return 1
}

step_against_cpu() {
  need_gpu
  need_plugin
  (cd "$root/runtime/pjrt" && BROKERD_PJRT_PLUGIN=$GC_PLUGIN x "$GC_BIN/pjrt.test" -test.run TestAgainstCPU -test.v -test.count=1)
  local rc=$?
  key "$(grep -c -- '--- PASS' "$GC_LOG") passed, $(grep -c -- '--- FAIL' "$GC_LOG") failed, $(grep -c -- '--- SKIP' "$GC_LOG") skipped$(grep -- '--- FAIL' "$GC_LOG" | head -4 | awk '{printf "; %s", $3}')"
  return "$rc"
}

step_bert_fixture() {
  need_python torch transformers
  local fx=$GC_WORK/hf-bert
  mkdir -p "$fx"
  cp "$root/runtime/models/repo/testdata/hf-bert/make_fixture.py" "$fx/"
  x python3 "$fx/make_fixture.py" || { key "make_fixture.py failed"; exit 1; }
  (cd "$GC_WORK/hf-bert" && tar -czf "$GC_OUT/hf-bert-fixture.tar.gz" --transform 's,^,runtime/models/repo/testdata/hf-bert/,' repo expected.json)
  # The CPU adapter against transformers, from a package directory of its own.
  mkdir -p "$GC_WORK/repo-pkg/testdata"
  cp -r "$fx" "$GC_WORK/repo-pkg/testdata/hf-bert"
  local cpu=fail
  (cd "$GC_WORK/repo-pkg" && x "$GC_BIN/repo.test" -test.run TestHuggingFaceFixture -test.v -test.count=1) && cpu=pass
  local texts
  mapfile -t texts < <(python3 -c '
import json, sys
for c in json.load(open(sys.argv[1]))["cases"]:
    if not c["pair"]: print(c["text"])' "$fx/expected.json")
  local typ=gpu
  [ "$GC_CPU" = 1 ] && typ=cpu
  start_brokerd bert-fixture --model-repo "$fx/repo" --load-models tiny-hf-bert || { key "TestHuggingFaceFixture (CPU) $cpu; brokerd did not start: $(brokerd_said)"; exit 1; }
  x "$GC_BIN/brokerctl" --socket "$SOCK" encode --model tiny-hf-bert --type "$typ" --no-normalize --json "${texts[@]}" >"$GC_LOGS/bert-fixture-encode.json"
  local rc=$?
  stop_brokerd
  [ "$rc" = 0 ] || { key "TestHuggingFaceFixture (CPU) $cpu; brokerctl encode on $typ failed"; exit 1; }
  python3 - "$fx/expected.json" "$GC_LOGS/bert-fixture-encode.json" "$GC_KEY" "$cpu" <<'PY'
import json, math, sys
cases = [c for c in json.load(open(sys.argv[1]))["cases"] if not c["pair"]]
raw, dec, docs, i = open(sys.argv[2]).read(), json.JSONDecoder(), [], 0
while i < len(raw):
    while i < len(raw) and raw[i].isspace():
        i += 1
    if i >= len(raw):
        break
    d, i = dec.raw_decode(raw, i)
    docs.append(d)
results = [r for d in docs for r in d.get("results", [])]
devs = sorted({r.get("device_id", d.get("execution", {}).get("device_id", "?")) for d in docs for r in d.get("results", [])})
worst, rows = 0.0, []
for c, r in zip(cases, results):
    got = r.get("vector", [])
    errs = {}
    for pool in ("mean", "cls"):
        want = c[pool]
        if len(got) != len(want):
            errs[pool] = (math.inf, math.inf)
            continue
        d = math.sqrt(sum((g - w) ** 2 for g, w in zip(got, want)))
        n = math.sqrt(sum(w * w for w in want))
        errs[pool] = (d / n, max(abs(g - w) for g, w in zip(got, want)))
    pool = min(errs, key=lambda p: errs[p][0])
    rel, mx = errs[pool]
    worst = max(worst, rel)
    rows.append(f"{c['text']!r}: {pool} pooling, rel {rel:.3g}, max abs {mx:.3g}")
    print(rows[-1])
ok = len(results) == len(cases) and worst < 1e-4
key = (f"TestHuggingFaceFixture (CPU) {sys.argv[4]}; Encode on {','.join(devs)} vs BertModel: "
       f"{len(results)}/{len(cases)} texts, worst rel L2 {worst:.3g} (want < 1e-4)")
open(sys.argv[3], "w").write(key + "\n")
sys.exit(0 if ok and sys.argv[4] == "pass" else 1)
PY
}

step_bert_throughput() {
  need_gpu
  need_plugin
  need_python torch transformers
  x env BIN="$GC_BIN" PJRT_PLUGIN="$GC_PLUGIN" PJRT_GPU_STEPS=encode DURATION=5s WARMUP=30s TORCH_SECONDS=4 MODELS=bert-4x256 \
    LOG_DIR="$GC_LOGS/bert-throughput" bash "$here/pjrt_gpu.sh"
  local rc=$?
  key "$(awk '$2 == "fp32" || $2 == "bf16" {printf "%s %s brokerd %s torch %s (batch %s, ratio %s); ", $1, $2, $3, $5, $4, $6}' "$GC_LOG")"
  return "$rc"
}

# The generation checkpoint: Qwen2.5-0.5B's shape with Qwen's tokenizer
# (untied: random tied embeddings repeat their input), written in the
# background while the first steps run; tiny in CPU mode.
make_llm() {
  local shape=(-layers 24 -hidden 896 -heads 14 -kv-heads 2 -intermediate 4864)
  [ "$GC_CPU" = 1 ] && shape=(-layers 2 -hidden 64 -heads 4 -kv-heads 2 -intermediate 128)
  if "$GC_BIN/mkllm" -repo "$GC_WORK/llm-repo" -name qwen2-rand -arch qwen2 "${shape[@]}" -dtype bf16 \
    -tokenizer-dir "$root/runtime/models/tokenizer/bpe/testdata/qwen3" >"$GC_LOGS/mkllm.log" 2>&1; then
    touch "$GC_WORK/llm.done"
  else
    touch "$GC_WORK/llm.failed"
    return
  fi
  make_gguf
}

# make_gguf writes the generation checkpoint again as a Q4_K_M GGUF model
# (llama.cpp's own quantizer, the bundle's lib/libggml-base.so, through
# bench/mkgguf) and the file's weights dequantized to float32 (brokerd's
# runtime/quant) as a checkpoint for transformers.
make_gguf() {
  local lib=$GC_GPU/lib/libggml-base.so
  if ! [ -e "$lib" ]; then
    echo "no libggml-base.so in the bundle's lib/" >"$GC_LOGS/mkgguf.log"
    touch "$GC_WORK/gguf.nolib"
  elif "$GC_BIN/mkgguf" -from "$GC_WORK/llm-repo/qwen2-rand/1" -type q4_k_m -repo "$GC_WORK/gguf-repo" -name qwen2-q4km \
    -ggml-lib "$lib" -dequantized "$GC_WORK/gguf-f32" >"$GC_LOGS/mkgguf.log" 2>&1; then
    touch "$GC_WORK/gguf.done"
  else
    touch "$GC_WORK/gguf.failed"
  fi
}

llm_ready() {
  local _
  for _ in $(seq 1 600); do
    [ -e "$GC_WORK/llm.done" ] || [ -e "$GC_WORK/llm.failed" ] && break
    sleep 0.2
  done
  if ! [ -e "$GC_WORK/llm.done" ]; then
    key "mkllm did not write the checkpoint: $(tail -n 2 "$GC_LOGS/mkllm.log" 2>/dev/null | tr '\n' ' ')"
    exit 1
  fi
  cat "$GC_LOGS/mkllm.log"
  LLM=$GC_WORK/llm-repo/qwen2-rand/1
}

step_llm_greedy() {
  llm_ready
  local typ=gpu torchdev=cuda n=32
  [ "$GC_CPU" = 1 ] && typ=cpu torchdev=cpu n=8
  start_brokerd llm-greedy --model-repo "$GC_WORK/llm-repo" --load-models qwen2-rand || { key "brokerd did not start with the checkpoint: $(brokerd_said)"; exit 1; }
  x "$GC_BIN/gpucheck" -socket "$SOCK" -model qwen2-rand -dir "$LLM" -type "$typ" -max-tokens "$n" -out "$GC_LOGS/llm-brokerd.json"
  local rc=$?
  stop_brokerd
  local got
  got=$(python3 -c '
import json, sys
b = json.load(open(sys.argv[1]))
n = sorted({len(t) for t in b["tokens"]})
line = "brokerd on %s: %d prompts x %s tokens in %.2f s" % (b.get("device_id") or "-", len(b["tokens"]), "/".join(map(str, n)), b["seconds"])
print(line + ("; problems: %s" % b["problems"] if b["problems"] else ""))' "$GC_LOGS/llm-brokerd.json" 2>&1)
  [ "$rc" = 0 ] || { key "gpucheck failed: ${got:-no answer}"; exit 1; }
  x python3 "$here/peers/hf_generate.py" check "$LLM" --brokerd "$GC_LOGS/llm-brokerd.json" --out "$GC_LOGS/llm-compare.json" --device "$torchdev" | tee "$GC_WORK/hfcheck.txt"
  rc=${PIPESTATUS[0]}
  key "$got; $(grep -E '^(PASS|FAIL|SKIP)' "$GC_WORK/hfcheck.txt" | tail -1)"
  return "$rc"
}

# gguf-greedy: the quantized path. brokerd loads the Q4_K_M file onto the
# GPU, which cannot hold the blocks, so it dequantizes them at load (its log
# must say so; on the CPU it must not); its greedy tokens against
# transformers on the very weights it dequantized (float32, TF32 off); then
# the same file on the CPU adapter's quantized kernels, whose agreement
# with the first run is reported, not judged (the CPU quantizes
# activations to int8: after a near tie the tokens may part).
step_gguf_greedy() {
  llm_ready
  local _
  for _ in $(seq 1 600); do
    [ -e "$GC_WORK/gguf.done" ] || [ -e "$GC_WORK/gguf.failed" ] || [ -e "$GC_WORK/gguf.nolib" ] && break
    sleep 0.2
  done
  cat "$GC_LOGS/mkgguf.log"
  if [ -e "$GC_WORK/gguf.nolib" ]; then
    key "SKIP: no libggml-base.so in the bundle (make gpu-bundle copies node-llama-cpp's)"
    exit 77
  fi
  if ! [ -e "$GC_WORK/gguf.done" ]; then
    key "mkgguf did not write the GGUF model: $(tail -n 2 "$GC_LOGS/mkgguf.log" 2>/dev/null | tr '\n' ' ')"
    exit 1
  fi
  local deq=$GC_WORK/gguf-f32 typ=gpu n=32 want=yes
  [ "$GC_CPU" = 1 ] && typ=cpu n=8 want=no
  local made
  made="Q4_K_M GGUF of $(grep -o 'q4_k_m, [0-9.]* MiB' "$GC_LOGS/mkgguf.log" | head -1 | sed 's/^q4_k_m, //') ($(grep -o 'tensors ([^)]*)' "$GC_LOGS/mkgguf.log" | head -1 | sed 's/^tensors (//; s/)$//'))"
  start_brokerd gguf-greedy --model-repo "$GC_WORK/gguf-repo" --load-models qwen2-q4km || { key "$made; brokerd did not start with it: $(brokerd_said)"; exit 1; }
  x "$GC_BIN/gpucheck" -socket "$SOCK" -model qwen2-q4km -dir "$deq" -type "$typ" -max-tokens "$n" -out "$GC_LOGS/gguf-brokerd.json"
  local rc=$?
  x "$GC_BIN/brokerctl" --socket "$SOCK" models
  stop_brokerd
  local got
  got=$(python3 - "$GC_LOGS/gguf-brokerd.json" "$GC_LOGS/gguf-greedy-brokerd.log" "$want" <<'PY' 2>&1
import json, sys
b = json.load(open(sys.argv[1]))
n = sorted({len(t) for t in b["tokens"]})
dq, placed = set(), []
for line in open(sys.argv[2]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("msg") == "dequantizing weights for a device that cannot hold them":
        dq.add((r.get("device"), r.get("from"), r.get("to")))
    if r.get("msg") == "generator placed" and r.get("model") == "qwen2-q4km":
        placed.append("%.0f MiB (weights, step, KV cache) on %s" % (r.get("memory_bytes", 0) / 2**20, r.get("device")))
devs = sorted({d for d, _, _ in dq})
line = "brokerd on %s: %d prompts x %s tokens in %.2f s" % (b.get("device_id") or "-", len(b["tokens"]), "/".join(map(str, n)), b["seconds"])
if dq:
    line += "; dequantized at load on %s (%s to %s)" % (",".join(devs), ",".join(sorted({f for _, f, _ in dq})), ",".join(sorted({t for _, _, t in dq})))
else:
    line += "; kept quantized (no dequantizing at load)"
if (bool(dq) != (sys.argv[3] == "yes")):
    line += " — WRONG: want %s" % ("dequantizing on the GPU" if sys.argv[3] == "yes" else "no dequantizing on the CPU")
line += "; placed: " + ("; ".join(placed) or "not logged")
print(line + ("; problems: %s" % b["problems"] if b["problems"] else ""))
PY
)
  [ "$rc" = 0 ] || { key "$made; gpucheck failed: ${got:-no answer}"; exit 1; }
  local bad=0
  case $got in *WRONG*) bad=1 ;; esac
  key "$made; $got"
  local hf
  if [ "$GC_CPU" = 1 ]; then
    # The CPU adapter runs the blocks themselves (int8 activations), not
    # the float32 weights transformers would run: nothing to compare.
    hf="SKIP: CPU mode (transformers runs the dequantized weights, the CPU adapter the blocks)"
    rc=77
  else
    x python3 "$here/peers/hf_generate.py" check "$deq" --brokerd "$GC_LOGS/gguf-brokerd.json" --out "$GC_LOGS/gguf-compare.json" --device cuda | tee "$GC_WORK/gguf-hfcheck.txt"
    rc=${PIPESTATUS[0]}
    hf=$(grep -E '^(PASS|FAIL|SKIP)' "$GC_WORK/gguf-hfcheck.txt" | tail -1)
  fi
  key "$made; $got; ${hf:-hf_generate.py said nothing (rc $rc)}"

  # The CPU adapter on the same file, within what the step has left.
  local left=$((${GC_STEP_END:-0} - $(date +%s) - 5)) cpu
  if [ "$left" -lt 20 ]; then
    cpu="CPU adapter not run: ${left} s left of the step"
  elif PREFER_CPU=1 start_brokerd gguf-cpu --model-repo "$GC_WORK/gguf-repo" --load-models qwen2-q4km; then
    x timeout "$((left - 5))" "$GC_BIN/gpucheck" -socket "$SOCK" -model qwen2-q4km -dir "$deq" -type cpu -max-tokens "$n" -out "$GC_LOGS/gguf-cpu.json"
    local crc=$?
    stop_brokerd
    cpu=$(python3 - "$GC_LOGS/gguf-brokerd.json" "$GC_LOGS/gguf-cpu.json" "$GC_LOGS/gguf-cpu-brokerd.log" "$crc" <<'PY' 2>&1
import json, sys
a = json.load(open(sys.argv[1]))
try:
    c = json.load(open(sys.argv[2]))
except (OSError, ValueError) as e:
    print("CPU adapter: gpucheck wrote nothing (rc %s: %s)" % (sys.argv[4], e))
    sys.exit()
dq = sum('"dequantizing weights for a device that cannot hold them"' in l for l in open(sys.argv[3]))
placed = []
for line in open(sys.argv[3]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("msg") == "generator placed" and r.get("model") == "qwen2-q4km":
        placed.append("%.0f MiB" % (r.get("memory_bytes", 0) / 2**20))
same, parts = 0, []
for i, (x, y) in enumerate(zip(a["tokens"], c["tokens"])):
    if x == y:
        same += 1
        continue
    k = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
    g = c.get("gaps") or []
    gap = g[i][k] if i < len(g) and k < len(g[i]) else None
    parts.append("prompt %d parts at token %d%s" % (i, k, " (CPU top-1/top-2 gap %.3g)" % gap if gap is not None and gap >= 0 else ""))
print("CPU adapter (%s, %s, %s) on %s: %d/%d prompts' tokens agree with %s%s%s" % (
    "quantized kernels" if dq == 0 else "DEQUANTIZED at load", "placed " + ("/".join(placed) or "?"), "%.2f s" % c["seconds"],
    c.get("device_id") or "-", same, len(a["tokens"]), a.get("device_id") or "-",
    ": " + "; ".join(parts) if parts else "", " (gpucheck rc %s: %s)" % (sys.argv[4], c["problems"]) if sys.argv[4] != "0" else ""))
PY
)
  else
    cpu="CPU adapter: brokerd did not start: $(brokerd_said)"
  fi
  echo "$cpu"
  key "$made; $got; ${hf:-hf_generate.py said nothing (rc $rc)}; $cpu"
  [ "$bad" = 0 ] || exit 1
  return "$rc"
}

step_llm_throughput() {
  llm_ready
  # LLM_WARMUP: XLA compiles each new step shape on first use (seconds
  # each), so the first levels' windows need room for it.
  local levels=1,16,64 dur=8s warm=${LLM_WARMUP:-5s} n=64
  [ "$GC_CPU" = 1 ] && levels=1,2 dur=1s warm=1s n=8
  start_brokerd llm-throughput --model-repo "$GC_WORK/llm-repo" --load-models qwen2-rand || { key "brokerd did not start with the checkpoint: $(brokerd_said)"; exit 1; }
  # A model that is not on the device type asked for would be measured
  # where it landed (bench sends no device type): find out first.
  local typ=gpu
  [ "$GC_CPU" = 1 ] && typ=cpu
  if ! x "$GC_BIN/gpucheck" -socket "$SOCK" -model qwen2-rand -dir "$LLM" -type "$typ" -max-tokens 2 -out "$GC_LOGS/llm-probe.json"; then
    key "a 2-token Generate on $typ failed, nothing measured: $(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["problems"][-1:])' "$GC_LOGS/llm-probe.json" 2>&1 | head -c 600)"
    exit 1
  fi
  x "$GC_BIN/brokerctl" --socket "$SOCK" bench --generate --model qwen2-rand --concurrency "$levels" \
    --duration "$dur" --warmup "$warm" --max-tokens "$n" --text-bytes 128 --json >"$GC_LOGS/llm-bench.json"
  local rc=$?
  stop_brokerd
  [ "$rc" = 0 ] || { key "brokerctl bench --generate failed"; exit 1; }
  local prompt
  prompt=$(python3 -c '
import json, sys
ls = json.load(open(sys.argv[1]))["levels"]
r = sum(l["requests"] for l in ls)
print(round(sum(l["prompt_tokens"] for l in ls) / r) if r else 32)' "$GC_LOGS/llm-bench.json")
  local hf=0
  if [ "$GC_CPU" = 1 ]; then
    echo "CPU mode: no transformers comparison"
    hf=77
  else
    x python3 "$here/peers/hf_generate.py" bench "$LLM" --batches "$levels" --prompt-tokens "$prompt" --new-tokens "$n" \
      --seconds 4 --dtype fp32 --device cuda | tee "$GC_LOGS/llm-hf-bench.jsonl"
    hf=${PIPESTATUS[0]}
  fi
  python3 - "$GC_LOGS/llm-bench.json" "$GC_LOGS/llm-hf-bench.jsonl" "$GC_KEY" "$prompt" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
hf = {}
try:
    for line in open(sys.argv[2]):
        if line.startswith("{"):
            d = json.loads(line)
            hf[d["batch"]] = d["tokens_per_second"]
except OSError:
    pass
parts = []
print(f"{'sequences':>9} {'brokerd tok/s':>14} {'transformers tok/s':>19} {'ratio':>6} {'batch':>6} {'failed':>6}")
for l in b["levels"]:
    c, t = l["concurrency"], l["output_tokens_per_second"]
    h = hf.get(c)
    r = f"{t / h:.2f}" if h else "-"
    print(f"{c:>9} {t:>14.1f} {h if h else '-':>19} {r:>6} {l['mean_batch_size']:>6.1f} {l['failed_requests']:>6}")
    parts.append(f"{c} seq: brokerd {t:.1f}" + (f" vs transformers {h:.1f} tok/s ({r}x)" if h else " tok/s") +
                 (f", {l['failed_requests']} failed" if l["failed_requests"] else ""))
open(sys.argv[3], "w").write(f"~{sys.argv[4]} prompt + {b['max_tokens']} output tokens, float32: " + "; ".join(parts) + "\n")
PY
  local bad
  bad=$(python3 -c 'import json, sys; print(sum(l["failed_requests"] + (l["requests"] == 0) for l in json.load(open(sys.argv[1]))["levels"]))' "$GC_LOGS/llm-bench.json")
  [ "$bad" = 0 ] || return 1
  return "$hf"
}

# ---------------------------------------------------------------- driver

# run_step NAME CAP: the step under min(CAP, what the budget has left),
# then its summary line, results.json and logs.tar.gz, rewritten.
run_step() {
  local name=$1 cap=$2 now left t rc status
  now=$(date +%s)
  left=$((GC_DEADLINE - now - 5))
  t=$((cap < left ? cap : left))
  export GC_KEY=$GC_LOGS/$name.key GC_LOG=$GC_LOGS/$name.log GC_STEP_END=$((now + t))
  : >"$GC_KEY"
  if [ "$t" -lt 15 ]; then
    status=SKIP
    key "SKIP: out of the time budget (${GPU_CHECK_BUDGET:-420} s)"
    echo "not run: out of the time budget" >"$GC_LOG"
    rc=-
    t=0
  else
    echo "== $name (timeout ${t}s)"
    timeout -k 10 "$t" bash "$self" __step "$name" >"$GC_LOG" 2>&1
    rc=$?
    case $rc in
      0) status=PASS ;;
      77) status=SKIP ;;
      124 | 137) status=TIMEOUT ;;
      *) status=FAIL ;;
    esac
  fi
  local secs=$(($(date +%s) - now))
  local k
  k=$(head -c 1500 "$GC_KEY" | tr '\n' ' ')
  [ -n "$k" ] || k=$(grep -v '^+ ' "$GC_LOG" | tail -n 2 | head -c 400 | tr '\n' ' ')
  echo "   $status ${secs}s: $k"
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$secs" "$rc" "$k" >>"$GC_WORK/steps.tsv"
  write_outputs
}

write_outputs() {
  python3 - "$GC_WORK/steps.tsv" "$GC_OUT" "$GC_WORK/header.txt" "$GC_CPU" <<'PY'
import json, sys
rows = [l.rstrip("\n").split("\t", 4) for l in open(sys.argv[1]) if l.strip()]
head = open(sys.argv[3]).read()
cmds = {
    "facts": "nvidia-smi -q; ldd --version; python3 importlib.metadata; ldd libexec/*",
    "nvidia-compare": "bash bench/nvidia-compare.sh",
    "pjrt-devices": "PJRT_GPU_STEPS=devices bash bench/pjrt_gpu.sh",
    "against-cpu": "BROKERD_PJRT_PLUGIN=... pjrt.test -test.run TestAgainstCPU -test.v",
    "bert-fixture": "make_fixture.py; repo.test -test.run TestHuggingFaceFixture; brokerctl encode --model tiny-hf-bert --type gpu --no-normalize --json",
    "bert-throughput": "PJRT_GPU_STEPS=encode DURATION=5s bash bench/pjrt_gpu.sh",
    "llm-greedy": "mkllm -arch qwen2 -layers 24 -hidden 896 ...; gpucheck -type gpu -max-tokens 32; hf_generate.py check",
    "gguf-greedy": "mkgguf -type q4_k_m -dequantized DIR; brokerd (GPU) gpucheck -type gpu; hf_generate.py check DIR; brokerd --prefer cpu gpucheck -type cpu",
    "llm-throughput": "brokerctl bench --generate --concurrency 1,16,64 --duration 8s --max-tokens 64; hf_generate.py bench",
}
with open(sys.argv[2] + "/summary.md", "w") as f:
    f.write(head)
    for name, status, secs, rc, key in rows:
        f.write(f"- **{name}** {status} ({secs} s): {key.strip()} — `{cmds.get(name, '')}`\n")
    try:
        f.write(open(sys.argv[3].replace("header.txt", "footer.txt")).read())
    except OSError:
        pass
json.dump({"cpu_mode": sys.argv[4] == "1", "header": head,
           "steps": [dict(name=n, status=s, seconds=int(t), rc=r, key=k.strip()) for n, s, t, r, k in rows]},
          open(sys.argv[2] + "/results.json", "w"), indent=1)
PY
  tar -C "$GC_WORK" -czf "$GC_OUT/logs.tar.gz" logs 2>/dev/null
}

main() {
  local out=${1:-${OUT:-$root/bench/gpu-results}}
  mkdir -p "$out" || exit 1
  export GC_OUT GC_CPU=${GPU_CHECK_CPU:-0} GC_WORK GC_LOGS GC_GPU GC_BIN GC_PLUGIN GC_DEADLINE
  GC_OUT=$(cd "$out" && pwd)
  local start budget=${GPU_CHECK_BUDGET:-420}
  start=$(date +%s)
  GC_DEADLINE=$((start + budget))
  GC_WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
  GC_LOGS=$GC_WORK/logs
  mkdir -p "$GC_LOGS"
  rm -f "$GC_OUT/summary.md" "$GC_OUT/results.json" "$GC_OUT/logs.tar.gz" "$GC_OUT/hf-bert-fixture.tar.gz"
  : >"$GC_WORK/steps.tsv"

  # The bundle: GPU_BUNDLE (a directory or archive), else .gpu/bundle.tar.*.
  local bundle=${GPU_BUNDLE:-}
  [ -n "$bundle" ] || bundle=$(find "$root/.gpu" -maxdepth 1 -name 'bundle.tar.*' 2>/dev/null | head -1)
  GC_GPU=$GC_WORK/gpu
  if [ -d "$bundle" ]; then
    GC_GPU=$bundle
  elif [ -f "$bundle" ]; then
    python3 -c '
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    t.extractall(sys.argv[2], **kw)' "$bundle" "$GC_GPU" 2>"$GC_LOGS/unpack.log" || echo "unpacking $bundle failed" >>"$GC_LOGS/unpack.log"
  else
    echo "no bundle: run make gpu-bundle on the build machine (or set GPU_BUNDLE)" >"$GC_LOGS/unpack.log"
  fi
  GC_BIN=$GC_GPU/bin
  GC_PLUGIN=${PJRT_PLUGIN:-$(timeout 30 python3 -c '
import glob, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
hits = sorted(p for d in dirs for p in glob.glob(d + "/jax_plugins/xla_cuda*/xla_cuda_plugin.so"))
print(hits[0] if hits else "")' 2>/dev/null)}
  [ "$GC_CPU" = 1 ] && GC_PLUGIN=

  local gpu="none (CPU mode)"
  if [ "$GC_CPU" != 1 ]; then
    gpu=$(timeout 20 nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | tr '\n' ';')
  fi
  {
    echo "# brokerd GPU check"
    echo
    echo "- started $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), budget ${budget} s$([ "$GC_CPU" = 1 ] && echo ', CPU mode (GPU_CHECK_CPU=1)')"
    echo "- device: $gpu"
    echo "- bundle: $(head -2 "$GC_GPU/MANIFEST" 2>/dev/null | tr '\n' ' ')(from ${bundle:-nothing})"
    echo "- command: bash bench/gpu_check.sh $GC_OUT; each step's full output is logs/<step>.log in logs.tar.gz"
    echo
  } >"$GC_WORK/header.txt"
  write_outputs

  local mk=
  if [ -x "$GC_BIN/mkllm" ]; then
    make_llm &
    mk=$!
  else
    echo "no mkllm in the bundle" >"$GC_LOGS/mkllm.log"
    touch "$GC_WORK/llm.failed"
  fi

  # GPU_CHECK_STEPS="against-cpu llm-throughput" runs only those (a rerun
  # of what failed, in the minutes a lease has left).
  local steps=${GPU_CHECK_STEPS:-facts nvidia-compare pjrt-devices against-cpu bert-fixture bert-throughput llm-greedy gguf-greedy llm-throughput}
  local step limit
  for step in facts:30 nvidia-compare:30 pjrt-devices:60 against-cpu:100 bert-fixture:60 bert-throughput:90 llm-greedy:100 gguf-greedy:100 llm-throughput:110; do
    limit=${step#*:} step=${step%%:*}
    [ "$step" = llm-throughput ] && limit=${LLM_STEP_SECONDS:-$limit}
    [ "$step" = gguf-greedy ] && limit=${GGUF_STEP_SECONDS:-$limit}
    case " $steps " in *" $step "*) run_step "$step" "$limit" ;; esac
  done

  [ -z "$mk" ] || kill "$mk" 2>/dev/null
  wait 2>/dev/null
  echo "- total $(($(date +%s) - start)) s" >"$GC_WORK/footer.txt"
  write_outputs
  cat "$GC_OUT/summary.md"
  rm -rf "$GC_WORK"
  # The exit status: 1 when any step failed or timed out.
  python3 -c 'import json, sys; sys.exit(any(s["status"] in ("FAIL", "TIMEOUT") for s in json.load(open(sys.argv[1]))["steps"]))' "$GC_OUT/results.json"
}

if [ "${1:-}" = __step ]; then
  # One step, in a process of its own (run_step's timeout ends it and its
  # children); brokerd is stopped on the way out, whatever happened.
  # shellcheck source=/dev/null
  [ -f "$GC_WORK/env.sh" ] && . "$GC_WORK/env.sh"
  BPID=
  trap 'stop_brokerd' EXIT
  trap 'exit 143' TERM INT
  "step_${2//-/_}"
  exit $?
fi
main "$@"
