#!/usr/bin/env bash
# Instructions per proxied request: `kvroute serve --cores 1` under callgrind before one
# stand-in worker, wrk with $CONNS connections for $SECS s (non-streamed completions of
# 256 tokens, as tools/router_tier.sh's tput part), instructions counted only while wrk
# runs (`callgrind_control`), divided by the requests wrk completed.
#
# Why: a count of one build moves by ~0.3 % from run to run whatever else the machine
# does, where CPU time per request moves by ±10 % between neighbouring rounds on a
# shared 2-vCPU machine. It is the A/B measure for a small change to the request path;
# the time it saves still has to be shown with tools/router_tier.sh.
#
# BIN=DIR (default target/release): the build measured; ALT=DIR: a second build,
# measured in turn with it (rows "alt"), the two taking turns going first.
# ROUNDS (2), CONNS (16), SECS (10). Needs valgrind, wrk, root (unshare -n).
# E.g.: BIN=/tmp/new ALT=/tmp/old ROUNDS=2 tools/proxy_instructions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${KVR_INSN_NETNS:-}" ]; then
  exec unshare -n env KVR_INSN_NETNS=1 "$0" "$@"
fi
ip link set lo up
BIN=${BIN:-target/release}
ALT=${ALT:-}
ROUNDS=${ROUNDS:-2}
CONNS=${CONNS:-16}
SECS=${SECS:-10}
OUT=${OUT:-$(mktemp -d /tmp/proxy_insn.XXXXXX)}; mkdir -p "$OUT"
for tool in valgrind callgrind_control wrk; do
  command -v "$tool" >/dev/null || { echo "proxy_instructions: needs $tool" >&2; exit 2; }
done
# shellcheck source=tools/proxy_fleet.sh
source tools/proxy_fleet.sh
start_fleet stand --workers 1 --timing "$FAST" --max-active 4096 --time-scale 10
ENGINE=$(grep -o 'engine=[^ ]*' "$OUT/stand.fleet" | cut -d= -f2-)
completion_lua "$OUT/post.lua"

# count LABEL DIR: one round of DIR/kvroute under callgrind.
count() {
  local label=$1 dir=$2 pp pid n ir
  pp=$(free_port)
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$OUT/cg.%p" \
    "$dir/kvroute" serve --cores 1 --pin-cores=false --block-size 16 --index-layout replicated \
    --tokenizer "sim-model=$TOK" --proxy-addr "127.0.0.1:$pp" --http-addr 127.0.0.1:0 \
    --events-addr 127.0.0.1:0 --api-addr 127.0.0.1:0 --engine "$ENGINE" >>"$OUT/kvroute.log" 2>&1 &
  pid=$!; PIDS+=("$pid")
  for _ in $(seq 600); do curl -sf "127.0.0.1:$pp/health" >/dev/null 2>&1 && break; sleep 0.1; done
  # Warm-up uninstrumented (first connections, pool, allocator), then count.
  wrk -t 1 -c "$CONNS" -d 3s -s "$OUT/post.lua" "http://127.0.0.1:$pp/v1/completions" >/dev/null 2>&1 || true
  callgrind_control -i on "$pid" >/dev/null
  callgrind_control -z "$pid" >/dev/null
  wrk -t 1 -c "$CONNS" -d "${SECS}s" -s "$OUT/post.lua" "http://127.0.0.1:$pp/v1/completions" >"$OUT/wrk.txt" 2>&1 || true
  callgrind_control -d "$pid" >/dev/null
  # The count is taken: no graceful stop (under valgrind it can take long).
  kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
  n=$(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' "$OUT/wrk.txt")
  ir=$(grep -h '^totals:' "$OUT/cg.$pid.1" | awk '{print $2}')
  rm -f "$OUT"/cg.*
  printf '%-14s %6s requests | %8d instructions per request\n' "$label" "$n" "$((ir / n))" | tee -a "$OUT/table.txt"
}

echo "== instructions per proxied request (callgrind, wrk -c $CONNS, ${SECS}s): $OUT" | tee "$OUT/table.txt"
for round in $(seq "$ROUNDS"); do
  [ -n "$ALT" ] && [ $((round % 2)) = 0 ] && count "alt     r$round" "$ALT"
  count "kvroute r$round" "$BIN"
  [ -n "$ALT" ] && [ $((round % 2)) = 1 ] && count "alt     r$round" "$ALT"
done
echo "table: $OUT/table.txt"
