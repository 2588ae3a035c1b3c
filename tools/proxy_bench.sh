#!/usr/bin/env bash
# Proxy overhead benchmark (docs/PERFORMANCE.md, "Proxy").
#
# Starts a simulated vLLM fleet (kvroute-sim fleet), kvroute serve (release build,
# its OpenAI proxy in front of the fleet, fed the fleet's ZMQ KV events) and SGLang
# Model Gateway (python -m sglang_router.launch_router --policy cache_aware) on free
# loopback ports, replays the same trace through each and directly to the worker,
# stops everything, and prints one table.
#
# Part 1, overhead: ONE simulated worker behind each router, so "through the router"
# minus "direct" is the hop alone: TTFT and E2E p50/p99, streaming, at each rate of
# $RATES, keep-alive and new-connection clients timed separately; then the most
# requests/s the machine carries (replay at $MAX_RATE, keep-alive).
# Part 2, hit rate: $WORKERS workers (fresh caches per router) on the shared
# conversation trace, hit rate measured at the workers; after each replay, the CPU
# seconds (and minor page faults) the router's process and the fleet's have used.
# The gateway reads no KV events, so its fleet publishes none unless GW_EVENTS=zmq
# (the same fleet as kvroute's, event publishing included).
#
# Needs: cargo build --release --bin kvroute --bin kvroute-sim;
#        python3 -m pip install sglang-router==0.3.2 (the gateway column is skipped
#        without it). Env knobs below; e.g. N=2000 RATES="1000" tools/proxy_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
TRACE=${TRACE:-/work/shared/traces/mooncake_conversation_trace.jsonl}
[ -f "$TRACE" ] || TRACE=tests/data/mooncake_slice.jsonl
N=${N:-3000}                 # requests per overhead run
RATES=${RATES:-"1000 5000"}
MAX_RATE=${MAX_RATE:-20000}
MAX_N=${MAX_N:-20000}
WORKERS=${WORKERS:-4}
HIT_N=${HIT_N:-2000}         # requests of the hit-rate run
HIT_SCALE=${HIT_SCALE:-20}   # trace time runs this much faster in the hit-rate run
KV_CORES=${KV_CORES:-2}
KV_FLAGS=${KV_FLAGS:-}       # extra `kvroute serve` flags, e.g. "--pin-cores false"
GW_EVENTS=${GW_EVENTS:-none} # the gateway's fleet: `none` (it reads no events) or `zmq` (as kvroute's)
OUT=${OUT:-$(mktemp -d /tmp/proxy_bench.XXXXXX)}; mkdir -p "$OUT"
HAVE_GW=${GATEWAY:-1}          # GATEWAY=0: kvroute and direct rows only
[ "$HAVE_GW" = 0 ] || python3 -c "import sglang_router" 2>/dev/null || { HAVE_GW=0; echo "note: sglang_router not installed, no gateway column" >&2; }
# shellcheck source=tools/proxy_fleet.sh
source tools/proxy_fleet.sh

# start_kvroute: kvroute serve with the proxy, fed the fleet's ZMQ events; sets KV_URL.
start_kvroute() {
  local pp hp ep ap args=()
  pp=$(free_port); hp=$(free_port); ep=$(free_port); ap=$(free_port)
  while read -r e; do [ -n "$e" ] && args+=(--engine "$e"); done <<<"$ENGINES"
  # shellcheck disable=SC2086
  "$BIN/kvroute" serve --cores "$KV_CORES" $KV_FLAGS --tokenizer "sim-model=$TOK" --proxy-addr "127.0.0.1:$pp" --http-addr "127.0.0.1:$hp" \
    --events-addr "127.0.0.1:$ep" --api-addr "127.0.0.1:$ap" "${args[@]}" >"$OUT/kvroute.log" 2>&1 &
  KV_PID=$!; PIDS+=("$KV_PID")
  for _ in $(seq 200); do curl -sf "127.0.0.1:$pp/health" >/dev/null 2>&1 && break; sleep 0.05; done
  KV_URL="http://127.0.0.1:$pp"; KV_HTTP="127.0.0.1:$hp"
  sleep 0.5 # ZMQ subscriptions
}


# replay LABEL TARGET STATS_URLS ARGS...
replay() {
  local label=$1 target=$2 stats=$3; shift 3
  local f; f="$OUT/$(echo "$label" | tr -s ' /()' '____')"
  "$BIN/kvroute-sim" replay --trace "$TRACE" --target "$target" --workers-stats "$stats" \
    --json "$f.json" "$@" >"$f.line" 2>&1 || echo "replay $label failed: $(tail -1 "$f.line")" >&2
  printf '%-34s %s\n' "$label" "$(python3 - "$f.json" <<'EOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("no report:", e); sys.exit()
h = r["hit_rate"]
print("%6d req %4d err %4d stale %7.0f rps | TTFT p50 %7.2f p99 %7.2f | E2E p50 %7.2f p99 %7.2f | ITL p99 %5.2f stall %6.1f | hit %s" % (
    r["requests"], r["errors"], r.get("stale_connection_retries", 0), r["achieved_rps"], r["ttft_ms"]["p50"], r["ttft_ms"]["p99"],
    r["e2e_ms"]["p50"], r["e2e_ms"]["p99"], r["itl_ms"]["p99"], r["max_stall_ms"], "-" if h is None else "%.3f" % h) + ("" if len(r.get("worker_requests", [])) < 2 else " | per worker %s" % r["worker_requests"]))
EOF
)"
}

# cpu_s PID: CPU seconds (user + system, all threads) the process has used so far.
cpu_s() { awk -v t="$(getconf CLK_TCK)" '{ printf "%.1f (%d page faults)", ($14 + $15) / t, $10 }' "/proc/$1/stat" 2>/dev/null || echo "?"; }

PARTS=${PARTS:-"1 2"}
if [[ " $PARTS " == *" 1 "* ]]; then
echo "== part 1: proxy overhead, one simulated worker (ms; $N requests per row; $OUT)"
start_fleet one --workers 1 --timing "$FAST" --max-active 4096
start_kvroute
[ "$HAVE_GW" = 1 ] && start_gateway
for rate in $RATES; do
  for conn in keep-alive new; do
    flag=(); [ "$conn" = new ] && flag=(--new-connections)
    common=(--limit "$N" --rate "$rate" --stream $SHORT "${flag[@]}")
    replay "direct   ${rate}/s $conn" "$URLS" "$URLS" "${common[@]}"
    replay "kvroute  ${rate}/s $conn" "$KV_URL" "$URLS" "${common[@]}"
    [ "$HAVE_GW" = 1 ] && replay "gateway  ${rate}/s $conn" "$GW_URL" "$URLS" "${common[@]}"
  done
done
echo "== most requests/s (offered $MAX_RATE/s, keep-alive, $MAX_N requests)"
common=(--limit "$MAX_N" --rate "$MAX_RATE" --stream $SHORT)
replay "direct   max" "$URLS" "$URLS" "${common[@]}"
replay "kvroute  max" "$KV_URL" "$URLS" "${common[@]}"
[ "$HAVE_GW" = 1 ] && replay "gateway  max" "$GW_URL" "$URLS" "${common[@]}"
stop_pid "$KV_PID"; [ "$HAVE_GW" = 1 ] && stop_pid "$GW_PID"; stop_pid "$FLEET_PID"
fi
if [[ " $PARTS " == *" 2 "* ]]; then

echo "== part 2: hit rate at the workers, $WORKERS workers, $HIT_N requests of $(basename "$TRACE") at ${HIT_SCALE}x"
hit=(--limit "$HIT_N" --time-scale "$HIT_SCALE" --stream --max-output-tokens 16)
start_fleet hit-kv --workers "$WORKERS" --time-scale "$HIT_SCALE"
start_kvroute
replay "kvroute  hit" "$KV_URL" "$(echo "$URLS" | tr ' ' ',')" "${hit[@]}"
echo "   CPU s: kvroute $(cpu_s "$KV_PID"), fleet $(cpu_s "$FLEET_PID")"
curl -s "$KV_HTTP/metrics" | grep -E '^kvroute_(engine_stream_total|proxy)' >"$OUT/kvroute.metrics" || true
stop_pid "$KV_PID"; stop_pid "$FLEET_PID"
if [ "$HAVE_GW" = 1 ]; then
  start_fleet hit-gw --workers "$WORKERS" --time-scale "$HIT_SCALE" --events "$GW_EVENTS"
  start_gateway
  replay "gateway  hit" "$GW_URL" "$(echo "$URLS" | tr ' ' ',')" "${hit[@]}"
  echo "   CPU s: gateway $(cpu_s "$GW_PID"), fleet $(cpu_s "$FLEET_PID")"
  stop_pid "$GW_PID"; stop_pid "$FLEET_PID"
fi
fi
echo "reports: $OUT"
