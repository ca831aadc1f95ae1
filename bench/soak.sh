#!/usr/bin/env bash
# A bounded mixed-load soak of one brokerd: small and large Encode loads,
# lossless codes, health checks, admin reads and refused requests, all at
# once for SOAK_DURATION. It samples brokerd's RSS, goroutines, threads and
# open descriptors every SOAK_INTERVAL and fails when they drift between the
# first and the last fifth of the run (after a warm-up), when brokerd dies,
# or when the loads' failure rate is too high.
#
# usage: bench/soak.sh                       # 10 minutes
#        SOAK_DURATION=2m bench/soak.sh      # shorter
# Settings (environment): SOAK_DURATION (10m), SOAK_WARMUP (30s),
# SOAK_INTERVAL (5s), SOAK_MAX_RSS_DRIFT (percent, 15), SOAK_MAX_GOROUTINE_DRIFT
# (20), SOAK_MAX_FD_DRIFT (10), SOAK_MAX_FAILURE_RATE (percent, 1),
# MODEL_REPO and LOAD_MODELS (passed to brokerd), BROKERD_FLAGS (extra brokerd
# flags). Needs bin/brokerd and bin/brokerctl (make build), curl and python3.
set -euo pipefail

bin=${BIN:-bin}
duration=${SOAK_DURATION:-10m}
warmup=${SOAK_WARMUP:-30s}
interval=${SOAK_INTERVAL:-5s}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

secs() { # a Go-style duration (90s, 10m, 1h) in seconds
  python3 -c 'import re,sys
m={"s":1,"m":60,"h":3600}
print(sum(int(n)*m[u] for n,u in re.findall(r"(\d+)([smh])", sys.argv[1])))' "$1"
}
dur_s=$(secs "$duration")
warm_s=$(secs "$warmup")
int_s=$(secs "$interval")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

extra=()
if [ -n "${MODEL_REPO:-}" ]; then extra+=(--model-repo "$MODEL_REPO"); fi
if [ -n "${LOAD_MODELS:-}" ]; then extra+=(--load-models "$LOAD_MODELS"); fi
sock=$work/brokerd.sock
# Word splitting of BROKERD_FLAGS is intended.
# shellcheck disable=SC2086
"$bin/brokerd" --socket "$sock" --state-dir "$work/state" --metrics-listen "127.0.0.1:$port" \
  --log-level warn "${extra[@]}" ${BROKERD_FLAGS:-} 2>"$work/brokerd.log" &
bpid=$!
pids+=("$bpid")
for _ in $(seq 1 300); do
  "$bin/brokerctl" --socket "$sock" health >/dev/null 2>&1 && break
  sleep 0.1
done
ctl() { "$bin/brokerctl" --socket "$sock" "$@"; }
ctl health >/dev/null

load_s=$((warm_s + dur_s))
echo "soak: brokerd pid $bpid, ${warm_s}s warm-up then ${dur_s}s measured, sampling every ${int_s}s" >&2

# The loads, each one long bench level over the whole soak.
ctl bench --json --concurrency 16 --duration "${load_s}s" --warmup 0s >"$work/small.json" 2>"$work/small.err" &
pids+=($!)
ctl bench --json --concurrency 4 --duration "${load_s}s" --warmup 0s --items-per-request 16 \
  --text-bytes 4096 --fidelity both --seed 2 >"$work/large.json" 2>"$work/large.err" &
pids+=($!)
( # admin reads, refused requests and short-lived connections, in a loop
  end=$((SECONDS + load_s))
  while [ $SECONDS -lt $end ]; do
    ctl stats >/dev/null 2>&1 || true
    ctl devices >/dev/null 2>&1 || true
    ctl report >/dev/null 2>&1 || true
    ctl encode --model no-such-model x >/dev/null 2>&1 || true
    ctl encode "" >/dev/null 2>&1 || true
    curl -fsS "http://127.0.0.1:$port/metrics" >/dev/null || true
    sleep 0.2
  done
) &
pids+=($!)

sample() { # epoch rss_kb threads fds goroutines
  local rss threads fds gor
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$bpid/status")
  threads=$(awk '/^Threads:/ {print $2}' "/proc/$bpid/status")
  fds=$(find "/proc/$bpid/fd" -mindepth 1 -maxdepth 1 | wc -l)
  gor=$(curl -fsS "http://127.0.0.1:$port/metrics" | awk '/^go_goroutines / {print $2}')
  echo "$SECONDS $rss $threads $fds $gor"
}

sleep "$warm_s"
end=$((SECONDS + dur_s))
: >"$work/samples"
while [ $SECONDS -lt $end ]; do
  if ! kill -0 "$bpid" 2>/dev/null; then
    echo "soak: brokerd died" >&2
    tail -50 "$work/brokerd.log" >&2
    exit 1
  fi
  sample >>"$work/samples"
  sleep "$int_s"
done
sample >>"$work/samples"
wait "${pids[1]}" "${pids[2]}" || true
ctl health >/dev/null || { echo "soak: brokerd unhealthy at the end" >&2; exit 1; }

python3 - "$work" "$dur_s" <<'PY'
import json, os, sys
work, dur = sys.argv[1], int(sys.argv[2])
rows = [list(map(float, l.split())) for l in open(os.path.join(work, "samples")) if l.strip()]
if len(rows) < 5:
    sys.exit("soak: too few samples (%d); lengthen SOAK_DURATION" % len(rows))
k = max(1, len(rows) // 5)
first, last = rows[:k], rows[-k:]
mean = lambda rs, i: sum(r[i] for r in rs) / len(rs)
env = lambda n, d: float(os.environ.get(n, d))
checks = [
    # name, column, limit, relative?
    ("RSS MiB", 1, env("SOAK_MAX_RSS_DRIFT", 15), True),
    ("threads", 2, None, False),
    ("descriptors", 3, env("SOAK_MAX_FD_DRIFT", 10), False),
    ("goroutines", 4, env("SOAK_MAX_GOROUTINE_DRIFT", 20), False),
]
bad = []
print("%-12s %12s %12s %10s %10s" % ("", "first 1/5", "last 1/5", "drift", "limit"))
for name, i, limit, rel in checks:
    a, b = mean(first, i), mean(last, i)
    scale = 1024 if name == "RSS MiB" else 1
    if rel:
        drift = 100 * (b - a) / a if a else 0
        shown = "%+.1f%%" % drift
        lim = "%.0f%%" % limit
    else:
        drift = b - a
        shown = "%+.1f" % drift
        lim = "-" if limit is None else "%.0f" % limit
    print("%-12s %12.1f %12.1f %10s %10s" % (name, a / scale, b / scale, shown, lim))
    if limit is not None and drift > limit:
        bad.append(name)
peak = max(r[1] for r in rows) / 1024
print("peak RSS %.1f MiB over %d samples in %d s" % (peak, len(rows), dur))

fail_rate_limit = env("SOAK_MAX_FAILURE_RATE", 1)
for load in ("small", "large"):
    try:
        res = json.load(open(os.path.join(work, load + ".json")))
    except Exception as e:
        bad.append("%s load (no result: %s)" % (load, e))
        continue
    for lv in res.get("levels", []):
        ph = lv["encode"]
        ok, failed = ph.get("requests", 0), ph.get("failed_requests", 0)
        rate = 100 * failed / max(1, ok + failed)
        print("%s load: %d requests, %d failed (%.2f%%) %s, %.0f req/s, p99 %.1f ms" % (
            load, ok, failed, rate, ph.get("failures") or "", ph.get("requests_per_second", 0),
            ph.get("latency_ms", {}).get("p99", 0)))
        if rate > fail_rate_limit:
            bad.append("%s load failure rate" % load)
if bad:
    sys.exit("soak: FAILED: " + ", ".join(bad))
print("soak: passed")
PY
