#!/usr/bin/env bash
# Serving policies at twice the fleet's capacity (docs/POLICIES.md, "At twice the
# fleet's capacity"). Run by hand, not in CI; loopback only; kills what it starts.
#
# A simulated fleet (kvroute-sim fleet) of $WORKERS workers that each run at most
# $MAX_ACTIVE requests at once (429 past that: a known capacity) and take 20 ms per
# decode step, behind `kvroute serve` with no busy threshold (the default config).
# 1. Capacity: one worker replayed directly, closed loop with $MAX_ACTIVE in flight;
#    the fleet's capacity is $WORKERS times its requests/s.
# 2. The conversation trace slice, its timestamps scaled so that its mean rate is
#    $LOAD times that capacity, $HIGH of the requests with "priority": -10 (the rest
#    none), streamed, replayed through a new `kvroute serve` per round, the configs
#    alternating round by round ($ROUNDS rounds):
#      off     admission.queue = false (a refused request gets 429 at once)
#      on      the default queue (max_wait_ms 30,000)
#      on-flat as on, admission.max_priority = 0 (priorities ignored)
#      on-slo  the queue with max_wait_ms = $SLO_MS (a request that cannot start
#              within the SLO leaves with 429 instead of waiting on)
#      on-slo-flat  as on-slo, admission.max_priority = 0 (priorities ignored)
#    Goodput: requests whose TTFT is within $SLO_MS ms.
#
# Needs: cargo build --release --bin kvroute --bin kvroute-sim (or BIN=target/debug).
# E.g. ROUNDS=3 LOAD=2 tools/policies_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
TRACE=${TRACE:-tests/data/mooncake_slice.jsonl}
N=${N:-1000}                 # requests per round
WORKERS=${WORKERS:-2}
MAX_ACTIVE=${MAX_ACTIVE:-4}  # requests a worker runs at once
MAX_IN=${MAX_IN:-2048}       # prompt tokens (truncated; shared prefixes stay shared)
MAX_OUT=${MAX_OUT:-16}       # output tokens
LOAD=${LOAD:-2}              # times the fleet's capacity
HIGH=${HIGH:-0.2}            # share of high-priority requests
SLO_MS=${SLO_MS:-1000}       # TTFT SLO of the goodput
ROUNDS=${ROUNDS:-2}
CONFIGS=${CONFIGS:-"off on on-flat on-slo on-slo-flat"}
OUT=${OUT:-$(mktemp -d /tmp/policies_bench.XXXXXX)}; mkdir -p "$OUT"
# shellcheck source=tools/proxy_fleet.sh
source tools/proxy_fleet.sh

TIMING="prefill_base_us=2000,prefill_us_per_token=0.5,prefill_attention_us=0,decode_step_base_us=20000,decode_us_per_seq=0"
start_fleet fleet --workers "$WORKERS" --max-active "$MAX_ACTIVE" --timing "$TIMING"
COMMON=(--trace "$TRACE" --stream --max-input-tokens "$MAX_IN" --max-output-tokens "$MAX_OUT")

# 1. Capacity of one worker, closed loop at its bound.
FIRST=${URLS%% *}
"$BIN/kvroute-sim" replay "${COMMON[@]}" --target "$FIRST" --limit 300 --rate 100000 \
  --max-inflight "$MAX_ACTIVE" --json "$OUT/capacity.json" >/dev/null
CAP=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['errors']==0, r['error_kinds']; print('%.2f' % (r['achieved_rps']*int(sys.argv[2])))" "$OUT/capacity.json" "$WORKERS")
SCALE=$(python3 - "$TRACE" "$N" "$CAP" "$LOAD" <<'PY'
import json, sys
ts = [json.loads(l)["timestamp"] for l in open(sys.argv[1]) if l.strip()][: int(sys.argv[2])]
rate = (len(ts) - 1) / ((max(ts) - min(ts)) / 1000.0)
print("%.3f" % (float(sys.argv[4]) * float(sys.argv[3]) / rate))
PY
)
echo "fleet: $WORKERS workers x $MAX_ACTIVE at once; capacity $CAP req/s (one worker closed loop x $WORKERS)"
echo "replay: $N requests of $TRACE at ${LOAD}x capacity (--time-scale $SCALE), $HIGH at priority -10, TTFT SLO $SLO_MS ms"

start_serve() {
  local pp hp args=()
  pp=$(free_port); hp=$(free_port)
  while read -r e; do [ -n "$e" ] && args+=(--engine "$e"); done <<<"$ENGINES"
  "$BIN/kvroute" serve --cores 1 --proxy-addr "127.0.0.1:$pp" --http-addr "127.0.0.1:$hp" \
    --events-addr 127.0.0.1:0 --api-addr 127.0.0.1:0 "${args[@]}" "$@" >"$OUT/serve.log" 2>&1 &
  KV_PID=$!; PIDS+=("$KV_PID")
  for _ in $(seq 400); do curl -sf "127.0.0.1:$pp/health" >/dev/null 2>&1 && break; sleep 0.05; done
  KV_URL="http://127.0.0.1:$pp"
}

flags() {
  case $1 in
    off) echo "--admission-queue false" ;;
    on) echo "" ;;
    on-flat) echo "--admission-max-priority 0" ;;
    on-slo) echo "--admission-max-wait-ms $SLO_MS" ;;
    on-slo-flat) echo "--admission-max-wait-ms $SLO_MS --admission-max-priority 0" ;;
  esac
}

for r in $(seq "$ROUNDS"); do
  for c in $CONFIGS; do
    # shellcheck disable=SC2046
    start_serve $(flags "$c")
    "$BIN/kvroute-sim" replay "${COMMON[@]}" --target "$KV_URL" --limit "$N" --time-scale "$SCALE" \
      --high-priority-share "$HIGH" --high-priority -10 --ttft-slo-ms "$SLO_MS" \
      --timeout-secs 120 --json "$OUT/$c.$r.json" >/dev/null
    stop_pid "$KV_PID"
    echo "round $r $c done" >&2
  done
done

python3 - "$OUT" "$ROUNDS" "$CONFIGS" "$SLO_MS" <<'PY'
import json, sys
out, rounds, configs, slo = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
print("| config | round | requests | goodput (TTFT <= %s ms) | errors | TTFT p50 ms | TTFT p99 ms | high-priority TTFT p99 ms | low TTFT p99 ms |" % slo)
print("|---|---|---|---|---|---|---|---|---|")
for c in configs:
    for r in range(1, rounds + 1):
        j = json.load(open("%s/%s.%d.json" % (out, c, r)))
        k = j["classes"]
        print("| %s | %d | %d | %d | %d | %.0f | %.0f | %.0f | %.0f |" % (
            c, r, j["requests"], k["goodput"], j["errors"], j["ttft_ms"]["p50"], j["ttft_ms"]["p99"],
            k["high"]["ttft_ms"]["p99"], k["low"]["ttft_ms"]["p99"]))
PY
echo "reports: $OUT"
