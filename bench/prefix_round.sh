#!/usr/bin/env bash
# A council round's prompts arriving together with one system prompt,
# through the OpenAI HTTP API of two brokerd binaries, in interleaved
# rounds (A B B A ...): N chats that share a system prompt of about
# SYSTEM_WORDS words and differ in their user message, max_tokens 1 (the
# round's prefill), greedy. Each round has a system prompt of its own, so
# no round finds an earlier one's blocks cached. Prints each round's wall
# time per binary, the mean ratio, and checks both binaries answered the
# same first token to every chat.
#
# usage: bench/prefix_round.sh OLD_BROKERD NEW_BROKERD MODEL_REPO MODEL
#        (env: N=4 ROUNDS=4 SYSTEM_WORDS=600 COMPUTE_DTYPE=cpu=bf16 MODE=chats)
# MODE=chats sends N requests at once (each admitted when it arrives: a
# step may start before the last comes); MODE=n sends one request for N
# choices ("n": N, all admitted to one step), the user message the same.
set -euo pipefail
old=$1 new=$2 repo=$3 model=$4
n=${N:-4} rounds=${ROUNDS:-4} words=${SYSTEM_WORDS:-600} dtype=${COMPUTE_DTYPE:-cpu=bf16} mode=${MODE:-chats}
bin=$(cd "$(dirname "$0")/.." && pwd)/bin
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

start() { # name binary port (metrics on port+100)
  mkdir -p "$work/$1"
  "$2" --state-dir "$work/$1" --socket "$work/$1/s.sock" --model-repo "$repo" --compute-dtype "$dtype" \
    --http-listen "127.0.0.1:$3" --http-allow-unauthenticated --metrics-listen "127.0.0.1:$(($3 + 100))" \
    --log-level warn >"$work/$1/log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -S "$work/$1/s.sock" ] && break; sleep 0.2; done
  BROKERD_SOCKET="$work/$1/s.sock" "$bin/brokerctl" load "$model" >/dev/null
}
start a "$old" 18431
start b "$new" 18432

# system prompt r: words from a fixed list, shuffled by round
system() {
  awk -v r="$1" -v n="$words" 'BEGIN { srand(r + 1); printf "Session %d. ", r; split("the council weighs each advisor verdict evidence memory record risk cost plan with care and states its reasons in order", w, " "); for (i = 0; i < n; i++) printf "%s ", w[int(rand() * 21) + 1] }'
}

chat() { # port system advisor extra-fields
  curl -sf "http://127.0.0.1:$1/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"model\":\"$model\",$4\"max_tokens\":1,\"temperature\":0,\"messages\":[{\"role\":\"system\",\"content\":\"$2\"},{\"role\":\"user\",\"content\":\"advisor $3, your verdict?\"}]}"
}

round() { # port round → prints seconds; first tokens to $work/out.<port>.<round>
  local port=$1 r=$2 sys t0 t1
  sys=$(system "$r")
  t0=$(date +%s%N)
  if [ "$mode" = n ]; then
    chat "$port" "$sys" 1 "\"n\":$n," >"$work/resp.$port.$r.1"
  else
    for i in $(seq "$n"); do
      chat "$port" "$sys" "$i" "" >"$work/resp.$port.$r.$i" &
    done
    wait # round runs in a subshell ($(round ...)): its jobs are the requests
  fi
  t1=$(date +%s%N)
  for f in "$work/resp.$port.$r".*; do
    python3 -c 'import json,sys; [print(c["message"]["content"]) for c in json.load(open(sys.argv[1]))["choices"]]' "$f"
  done >"$work/out.$port.$r"
  echo "scale=3; ($t1 - $t0) / 1000000000" | bc
}

_=$(round 18431 0) # warm-up
_=$(round 18432 0)
echo "round  old_s   new_s   old/new"
sum=0
for r in $(seq "$rounds"); do
  if [ $((r % 2)) = 1 ]; then a=$(round 18431 "$r"); b=$(round 18432 "$r"); else b=$(round 18432 "$r"); a=$(round 18431 "$r"); fi
  cmp -s "$work/out.18431.$r" "$work/out.18432.$r" || { echo "round $r: the binaries answered differently" >&2; exit 1; }
  ratio=$(echo "scale=3; $a / $b" | bc)
  sum=$(echo "scale=3; $sum + $ratio" | bc)
  printf '%-6s %-7s %-7s %s\n' "$r" "$a" "$b" "$ratio"
done
echo "mean old/new: $(echo "scale=2; $sum / $rounds" | bc) (mode $mode, $n a round, one system prompt of $words words)"
curl -s http://127.0.0.1:18532/metrics | grep -E '^brokerd_generation_(prefix_cache_hit_tokens_total|prompt_tokens_total)' || true
