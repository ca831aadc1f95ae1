#!/usr/bin/env bash
# Two brokerd configurations under the same load, measured in one run:
# starts two brokerds on this host (by default the default batch plan, and
# --max-batch 1), runs the same brokerctl bench load against each,
# alternating, and prints both figures and their ratio (first over second).
#
# usage: bench/batching.sh [brokerctl bench flags...]
#   e.g. bench/batching.sh --concurrency 64 --duration 10s
#        MODEL_REPO=/path/to/repo LOAD_MODELS=bert-4x256 bench/batching.sh --model bert-4x256 --text-bytes 80
# Other configurations: A_FLAGS and B_FLAGS are each daemon's extra flags,
# A_NAME and B_NAME their column names; e.g. bf16 against f32, both batched:
#   A_NAME=bf16 A_FLAGS="--compute-dtype cpu=bf16" B_NAME=f32 B_FLAGS="" bench/batching.sh ...
# Needs bin/brokerd and bin/brokerctl (make build) and python3.
set -euo pipefail

bin=${BIN:-bin}
rounds=${ROUNDS:-2}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

start() { # name, extra brokerd flags...
  local name=$1
  shift
  local extra=()
  if [ -n "${MODEL_REPO:-}" ]; then extra+=(--model-repo "$MODEL_REPO"); fi
  if [ -n "${LOAD_MODELS:-}" ]; then extra+=(--load-models "$LOAD_MODELS"); fi
  "$bin/brokerd" --socket "$work/$name.sock" --state-dir "$work/$name" --metrics-listen "" \
    --log-level warn "${extra[@]}" "$@" 2>"$work/$name.log" &
  pids+=($!)
  for _ in $(seq 1 300); do
    "$bin/brokerctl" --socket "$work/$name.sock" health >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "brokerd $name did not start:" >&2
  cat "$work/$name.log" >&2
  return 1
}

a_name=${A_NAME:-batched}
b_name=${B_NAME:-max_batch=1}
# Word splitting of the flag strings is intended.
# shellcheck disable=SC2086
start a ${A_FLAGS:-}
# shellcheck disable=SC2086
start b ${B_FLAGS---max-batch 1}

for r in $(seq 1 "$rounds"); do
  for name in a b; do
    "$bin/brokerctl" --socket "$work/$name.sock" bench --json "$@" >"$work/$name.$r.json" 2>/dev/null
  done
done

python3 - "$work" "$rounds" "$a_name" "$b_name" <<'PY'
import json, sys
work, rounds, an, bn = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(name):
    return [json.load(open(f"{work}/{name}.{r}.json")) for r in range(1, rounds + 1)]
b, u = load("a"), load("b")
print(f"{'round':<6}{'concurrency':<13}{an + ' items/s':>17}{'p99 ms':>9}{'mean batch':>12}"
      f"{bn + ' items/s':>21}{'p99 ms':>9}{'ratio':>8}")
for r in range(rounds):
    for lb, lu in zip(b[r]["levels"], u[r]["levels"]):
        eb, eu = lb["encode"], lu["encode"]
        ratio = eb["items_per_second"] / eu["items_per_second"] if eu["items_per_second"] else float("nan")
        print(f"{r + 1:<6}{lb['concurrency']:<13}{eb['items_per_second']:>17.1f}{eb['latency_ms']['p99']:>9.2f}"
              f"{eb['mean_batch_size']:>12.2f}{eu['items_per_second']:>21.1f}{eu['latency_ms']['p99']:>9.2f}{ratio:>8.2f}")
PY
