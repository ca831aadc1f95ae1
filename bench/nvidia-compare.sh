#!/usr/bin/env bash
# Compares what brokerd reports for each NVIDIA GPU with nvidia-smi, field by
# field: name, UUID, total memory, driver version, compute capability.
# Run on a host with the NVIDIA driver, from the repository root, after
# `make build`. Exits non-zero on any mismatch. Env: BIN (default bin),
# LOG_DIR (keep brokerd's log and answer there; bench/gpu_check.sh sets it).
set -euo pipefail

bin=${BIN:-bin}
log_dir=${LOG_DIR:-}
work=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  if [ -n "$log_dir" ] && mkdir -p "$log_dir"; then cp "$work"/* "$log_dir"/ 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

"$bin/brokerd" --socket "$work/b.sock" --state-dir "$work/state" --metrics-listen "" \
  --log-format console 2>"$work/brokerd.log" &
pid=$!
for _ in $(seq 1 100); do
  "$bin/brokerctl" --socket "$work/b.sock" health >/dev/null 2>&1 && break
  sleep 0.1
done
"$bin/brokerctl" --socket "$work/b.sock" devices --json >"$work/brokerd.json"
nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version,compute_cap \
  --format=csv,noheader,nounits >"$work/smi.csv"

python3 - "$work/brokerd.json" "$work/smi.csv" <<'PY'
import csv, json, sys
devs = {d["uuid"]: d for d in json.load(open(sys.argv[1]))["devices"] if d["type"] == "DEVICE_TYPE_GPU"}
rows = [[c.strip() for c in r] for r in csv.reader(open(sys.argv[2]))]
bad = 0
print(f"{'field':<20} {'nvidia-smi':<45} {'brokerd':<45} ok")
for idx, name, uuid, mem_mib, driver, cc in rows:
    d = devs.get(uuid)
    if d is None:
        print(f"GPU {idx} {uuid}: not reported by brokerd"); bad += 1; continue
    pairs = [
        ("id", f"gpu:{idx}", d["id"]),
        ("name", name, d["name"]),
        ("uuid", uuid, d["uuid"]),
        ("memory.total MiB", mem_mib, str(int(d["memory_total_bytes"]) // (1 << 20))),
        ("driver_version", driver, d["driver_version"]),
        ("compute_cap", cc, d["compute_capability"]),
    ]
    for field, want, got in pairs:
        ok = want == got
        bad += not ok
        print(f"{field:<20} {want:<45} {got:<45} {'yes' if ok else 'NO'}")
if len(devs) != len(rows):
    print(f"brokerd lists {len(devs)} GPUs, nvidia-smi {len(rows)}"); bad += 1
sys.exit(1 if bad else 0)
PY
