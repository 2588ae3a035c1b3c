#!/usr/bin/env bash
# Approximate mode side by side (docs/APPROXIMATE.md): the same simulated fleet that
# publishes no KV events (`kvroute-sim fleet --events none`), the conversation trace
# replayed as text through each router, hit rate measured at the workers.
#
# Rows, in turn within each round (the machine is shared: alternating rounds spread
# its noise over the rows):
#   kvroute approximate  `kvroute serve` (defaults), the workers registered over HTTP
#                        with their url (`fleet --register`): approximate mode;
#   gateway              SGLang Model Gateway 0.3.2, `--policy cache_aware`, over the
#                        same workers' urls;
#   kvroute load-only    `kvroute serve --approximate false --speculative-ttl-ms 0
#                        --affinity-max-entries 0`: the same registration and `kv`
#                        cost with no cache signal at all (load only).
# Every row gets a fresh fleet (empty caches) and a fresh router, on free loopback
# ports; everything started here is stopped on exit. Prints each run and a table of
# medians over the rounds.
#
# Needs: cargo build --release --bin kvroute --bin kvroute-sim;
#        python3 -m pip install sglang-router==0.3.2 (GATEWAY=0 skips its row).
# Env: ROUNDS (3), N (2000 requests), SCALE (20: trace time runs that much faster),
#      WORKERS (4), CAPACITY (4096 blocks per worker), KV_CORES (2), KV_FLAGS (extra
#      flags of both kvroute rows), TRACE, BIN, OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
TRACE=${TRACE:-/work/shared/traces/mooncake_conversation_trace.jsonl}
[ -f "$TRACE" ] || TRACE=tests/data/mooncake_slice.jsonl
ROUNDS=${ROUNDS:-3}
N=${N:-2000}
SCALE=${SCALE:-20}
WORKERS=${WORKERS:-4}
CAPACITY=${CAPACITY:-4096}
KV_CORES=${KV_CORES:-2}
KV_FLAGS=${KV_FLAGS:-}
OUT=${OUT:-$(mktemp -d /tmp/approx_bench.XXXXXX)}; mkdir -p "$OUT"
HAVE_GW=${GATEWAY:-1}
[ "$HAVE_GW" = 0 ] || python3 -c "import sglang_router" 2>/dev/null || { HAVE_GW=0; echo "note: sglang_router not installed, no gateway row" >&2; }
# shellcheck source=tools/proxy_fleet.sh
source tools/proxy_fleet.sh

FLEET=(--workers "$WORKERS" --capacity-blocks "$CAPACITY" --time-scale "$SCALE" --events none)
REPLAY=(--limit "$N" --time-scale "$SCALE" --stream --max-output-tokens 16)

# kvroute_row LABEL FLAGS...: kvroute serve, then a fleet registering with it, a replay.
kvroute_row() {
  local label=$1; shift
  local pp hp ep ap
  pp=$(free_port); hp=$(free_port); ep=$(free_port); ap=$(free_port)
  # shellcheck disable=SC2086
  "$BIN/kvroute" serve --cores "$KV_CORES" $KV_FLAGS "$@" --tokenizer "sim-model=$TOK" \
    --proxy-addr "127.0.0.1:$pp" --http-addr "127.0.0.1:$hp" --events-addr "127.0.0.1:$ep" \
    --api-addr "127.0.0.1:$ap" >"$OUT/$label.kvroute.log" 2>&1 &
  local kv=$!; PIDS+=("$kv")
  for _ in $(seq 200); do curl -sf "127.0.0.1:$pp/health" >/dev/null 2>&1 && break; sleep 0.05; done
  start_fleet "$label" "${FLEET[@]}" --register "127.0.0.1:$hp"
  run_replay "$label" "http://127.0.0.1:$pp"
  curl -s "127.0.0.1:$hp/metrics" | grep -E '^kvroute_(worker_approximate|approximate|request_blocks|overlap_blocks)' >"$OUT/$label.metrics" || true
  stop_pid "$kv"; stop_pid "$FLEET_PID"
}

gateway_row() {
  local label=$1
  start_fleet "$label" "${FLEET[@]}"
  start_gateway
  run_replay "$label" "$GW_URL"
  stop_pid "$GW_PID"; stop_pid "$FLEET_PID"
}

# run_replay LABEL TARGET: the replay against TARGET, hit rate from the fleet's workers.
run_replay() {
  local label=$1 target=$2
  "$BIN/kvroute-sim" replay --trace "$TRACE" --target "$target" \
    --workers-stats "$(echo "$URLS" | tr ' ' ',')" --json "$OUT/$label.json" "${REPLAY[@]}" \
    >"$OUT/$label.line" 2>&1 || echo "replay $label failed: $(tail -1 "$OUT/$label.line")" >&2
  python3 - "$OUT/$label.json" "$label" <<'EOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(sys.argv[2], "no report:", e); sys.exit()
print("%-28s %5d req %3d err | hit %.4f | TTFT p50 %7.1f p99 %7.1f ms | E2E p99 %7.1f ms | per worker %s" % (
    sys.argv[2], r["requests"], r["errors"], r["hit_rate"] or 0, r["ttft_ms"]["p50"], r["ttft_ms"]["p99"],
    r["e2e_ms"]["p99"], r["worker_requests"]))
EOF
}

echo "== $WORKERS workers x $CAPACITY blocks, no KV events; $N requests of $(basename "$TRACE") at ${SCALE}x; $ROUNDS rounds ($OUT)"
for r in $(seq "$ROUNDS"); do
  kvroute_row "r$r-kvroute-approximate"
  [ "$HAVE_GW" = 1 ] && gateway_row "r$r-gateway"
  kvroute_row "r$r-kvroute-load-only" --approximate false --speculative-ttl-ms 0 --affinity-max-entries 0
done
python3 - "$OUT" <<'EOF'
import glob, json, os, statistics, sys
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "r*.json"))):
    label = os.path.basename(f)[:-5].split("-", 1)[1]
    try:
        r = json.load(open(f))
    except Exception:
        continue
    rows.setdefault(label, []).append((r["hit_rate"] or 0, r["ttft_ms"]["p50"], r["ttft_ms"]["p99"], r["errors"]))
print()
print("| row | runs | hit rate at the workers (median; each run) | TTFT p50 ms | TTFT p99 ms (median; each run) | errors |")
print("|---|---|---|---|---|---|")
for label in ["kvroute-approximate", "gateway", "kvroute-load-only"]:
    v = rows.get(label)
    if not v:
        continue
    med = lambda i: statistics.median(x[i] for x in v)
    print("| %s | %d | %.3f (%s) | %.0f | %.0f (%s) | %d |" % (
        label, len(v), med(0), ", ".join("%.3f" % x[0] for x in v), med(1), med(2),
        ", ".join("%.0f" % x[2] for x in v), sum(x[3] for x in v)))
EOF
echo "reports: $OUT"
