#!/usr/bin/env bash
# PJRT on an NVIDIA GPU host with jax's CUDA plugin, PyTorch and transformers
# (no internet needed). Builds nothing: on the build machine run
#   make build
#   go test -c -o bin/pjrt.test ./runtime/pjrt
#   go build -o bin/mkbert ./bench/mkbert
# and copy bin/ and bench/ over. Steps (the first failure stops it):
#  1. finds xla_cuda_plugin.so under Python site-packages ($PJRT_PLUGIN wins);
#  2. brokerd with --pjrt-plugin cuda=<it> lists every GPU runnable on pjrt;
#  3. bin/pjrt.test TestAgainstCPU: every op case and every model graph on
#     the GPU against oneDNN on the CPU, same weights and inputs (fp32 error
#     below 1e-4, GPU bf16 against CPU fp32 below 1e-2);
#  4. Encode throughput through gRPC with batching of random BERTs (4x256 and
#     12x768, texts of about SEQ tokens) against PyTorch eager on the same
#     weights and batch size (bench/torch_bert.py), in fp32 and bf16.
#     brokerd runs fp32 only: the daemon has no setting for a bf16 device
#     yet, so the bf16 rows are PyTorch's alone.
# usage: bench/pjrt_gpu.sh   (env: BIN, PJRT_PLUGIN, DURATION, WARMUP,
# CONCURRENCY, TEXT_BYTES, TORCH_SECONDS, MODELS; PJRT_GPU_STEPS picks steps
# 3 and 4, "against-cpu,encode" by default (1 and 2 always run); LOG_DIR
# keeps brokerd's log and the bench JSON there). bench/gpu_check.sh runs it
# with short durations as part of the one-call GPU check.
set -euo pipefail

bin=${BIN:-bin}
duration=${DURATION:-20s}
warmup=${WARMUP:-$duration}
torch_seconds=${TORCH_SECONDS:-10}
models=${MODELS:-bert-4x256 bert-12x768}
steps=${PJRT_GPU_STEPS:-against-cpu,encode}
log_dir=${LOG_DIR:-}
concurrency=${CONCURRENCY:-256}
text_bytes=${TEXT_BYTES:-600} # about 128 tokens with mkbert's vocabulary (it prints the count)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
  wait 2>/dev/null || true
  if [ -n "$log_dir" ]; then
    mkdir -p "$log_dir"
    cp "$work"/*.log "$work"/*.json "$work"/*.txt "$log_dir"/ 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

plugin=${PJRT_PLUGIN:-$(python3 -c '
import glob, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
hits = sorted(p for d in dirs for p in glob.glob(d + "/jax_plugins/xla_cuda*/xla_cuda_plugin.so"))
print(hits[0] if hits else "")')}
if [ -z "$plugin" ]; then
  echo "no jax_plugins/xla_cuda*/xla_cuda_plugin.so under Python site-packages; set PJRT_PLUGIN" >&2
  exit 1
fi
echo "== plugin: $plugin"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader

has_step() { case ",$steps," in *",$1,"*) return 0 ;; esac; return 1; }

echo "== random BERT checkpoints"
repo=$work/repo
"$bin/mkbert" -repo "$repo" -name bert-4x256 -layers 4 -hidden 256 -heads 4 -intermediate 1024 -sizes "$text_bytes" | tee "$work/mkbert.txt"
if has_step encode; then
  "$bin/mkbert" -repo "$repo" -name bert-12x768 -layers 12 -hidden 768 -heads 12 -intermediate 3072
fi
# brokerd pads a batch to its longest text rounded up to 8 tokens: PyTorch
# gets that length for every sequence, which favours PyTorch if anything.
seq=$(python3 -c '
import re, sys
hi = int(re.search(r"\((\d+) to (\d+)\)", open(sys.argv[1]).read()).group(2))
print((hi + 7) // 8 * 8)' "$work/mkbert.txt")
echo "texts of $text_bytes bytes: PyTorch runs sequences of $seq tokens"

echo "== brokerd on pjrt"
metrics=127.0.0.1:${METRICS_PORT:-19490}
"$bin/brokerd" --socket "$work/b.sock" --state-dir "$work/state" --metrics-listen "$metrics" --log-level info \
  --pjrt-plugin "cuda=$plugin" --prefer gpu --model-repo "$repo" --load-models all 2>"$work/brokerd.log" &
pid=$!
for _ in $(seq 1 600); do
  "$bin/brokerctl" --socket "$work/b.sock" health >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/brokerd.log" >&2; exit 1; }
  sleep 0.2
done
"$bin/brokerctl" --socket "$work/b.sock" devices --json >"$work/devices.json"
python3 - "$work/devices.json" <<'PY'
import json, sys
gpus = [d for d in json.load(open(sys.argv[1]))["devices"] if d["type"] == "DEVICE_TYPE_GPU"]
bad = [d for d in gpus if d.get("runtime") != "pjrt" or not d.get("runnable")]
for d in gpus:
    print(d["id"], d.get("name"), "runtime", d.get("runtime"), "runnable", d.get("runnable", False), d.get("runtime_reason", ""))
if not gpus or bad:
    sys.exit("FAIL: want every GPU runnable on pjrt")
PY

if has_step against-cpu; then
  echo "== every graph against the CPU"
  BROKERD_PJRT_PLUGIN=$plugin "$bin/pjrt.test" -test.run 'TestAgainstCPU' -test.v -test.count=1
fi
has_step encode || exit 0

echo "== Encode throughput: brokerd (gRPC, batching) vs PyTorch eager"
printf '%-12s %-6s %14s %10s %14s %7s\n' model dtype brokerd_items/s batch torch_items/s ratio
for model in $models; do
  "$bin/brokerctl" --socket "$work/b.sock" bench --model "$model" --text-bytes "$text_bytes" \
    --concurrency "$concurrency" --duration "$duration" --warmup "$warmup" --json >"$work/$model.json"
  read -r ips batch < <(python3 -c '
import json, sys
e = json.load(open(sys.argv[1]))["levels"][0]["encode"]
print(e["items_per_second"], max(1, round(e["mean_batch_size"])))' "$work/$model.json")
  for dtype in fp32 bf16; do
    torch=$(python3 "$here/torch_bert.py" --model-dir "$repo/$model/1" --batch "$batch" --seq "$seq" --dtype "$dtype" --seconds "$torch_seconds")
    if [ "$dtype" = fp32 ]; then b=$ips; else b=-; fi
    python3 -c 'import sys; b, t = sys.argv[4], float(sys.argv[5]); r = float(b) / t if b != "-" else float("nan")
print(f"{sys.argv[1]:<12} {sys.argv[2]:<6} {b:>14} {sys.argv[3]:>10} {t:>14.1f} {r:>7.2f}")' \
      "$model" "$dtype" "$batch" "$b" "$torch"
  done
done
echo "== PJRT compiles (one per graph, batch size and sequence length)"
python3 -c '
import sys, urllib.request
for line in urllib.request.urlopen("http://" + sys.argv[1] + "/metrics").read().decode().splitlines():
    if line.startswith(("brokerd_pjrt_compile_seconds_count", "brokerd_pjrt_compile_seconds_sum", "brokerd_pjrt_compile_cache_lookups_total")):
        print(line)' "$metrics"
