#!/usr/bin/env bash
# CPU per proxied request (docs/PERFORMANCE.md, "Proxy overhead" / "CPU per proxied
# request").
#
# tools/proxy_bench.sh's part-1 setup (ONE cheap simulated worker, kvroute
# `--cores 2 --proxy-addr`, `kvroute-sim replay --stream`, 256 input / 8 output tokens)
# at fixed rates; for each router the CPU time its process tree used during the replay
# (sum of every thread's `/proc/PID/task/TID/schedstat` run time, ns resolution, plus
# the utime+stime of `/proc/PID/stat` as a cross-check), divided by the requests
# answered: CPU µs per proxied request. The client and the worker are not counted.
#
# KV_BINS="a b": several kvroute binaries, measured alternately in the same session
# (before/after); an entry "bin,--flag,value" adds flags to that one (commas are spaces),
# e.g. KV_BINS="target/release/kvroute target/release/kvroute,--spin-before-park-us,0". Needs a release build (cargo build --release --bin kvroute --bin
# kvroute-sim) and, for the gateway rows, python3 -m pip install sglang-router==0.3.2.
# Env knobs: N RATES CONNS ROUNDS KV_BINS KV_CORES GATEWAY=0|1 PERF=1 (perf record -g
# of the first kvroute at the first rate, into $OUT/perf.data) SYSCALLS=1 (perf stat
# of the syscalls each router makes, per request: these counts do not depend on how
# loaded the machine is, as CPU time does).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
KV_BINS=${KV_BINS:-$BIN/kvroute}
TRACE=${TRACE:-/work/shared/traces/mooncake_conversation_trace.jsonl}
[ -f "$TRACE" ] || TRACE=tests/data/mooncake_slice.jsonl
N=${N:-5000}
RATES=${RATES:-"1000 3000"}
CONNS=${CONNS:-"keep-alive new"}
ROUNDS=${ROUNDS:-1}
KV_CORES=${KV_CORES:-2}
GATEWAY=${GATEWAY:-1}
PERF=${PERF:-0}
SYSCALLS=${SYSCALLS:-0}
SYS_EVENTS=syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_write,syscalls:sys_enter_socket,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_writev
OUT=${OUT:-$(mktemp -d /tmp/proxy_cpu.XXXXXX)}; mkdir -p "$OUT"
python3 -c "import sglang_router" 2>/dev/null || GATEWAY=0

# shellcheck source=tools/proxy_fleet.sh
source tools/proxy_fleet.sh

start_fleet one --workers 1 --timing "$FAST" --max-active 4096

# start_kvroute BIN[,FLAGS]: sets KV_URL, KV_PID.
start_kvroute() {
  local pp hp ep ap args=() bin extra
  IFS=, read -r -a extra <<<"$1"; bin=${extra[0]}; extra=("${extra[@]:1}")
  [[ " ${extra[*]} " == *" --cores "* ]] || extra+=(--cores "$KV_CORES")
  pp=$(free_port); hp=$(free_port); ep=$(free_port); ap=$(free_port)
  while read -r e; do [ -n "$e" ] && args+=(--engine "$e"); done <<<"$ENGINES"
  "$bin" serve --tokenizer "sim-model=$TOK" --proxy-addr "127.0.0.1:$pp" --http-addr "127.0.0.1:$hp" \
    --events-addr "127.0.0.1:$ep" --api-addr "127.0.0.1:$ap" "${args[@]}" "${extra[@]}" >>"$OUT/kvroute.log" 2>&1 &
  KV_PID=$!; PIDS+=("$KV_PID")
  for _ in $(seq 200); do curl -sf "127.0.0.1:$pp/health" >/dev/null 2>&1 && break; sleep 0.05; done
  KV_URL="http://127.0.0.1:$pp"
  sleep 0.5
}

# measure LABEL PID TARGET ARGS...: one replay, the PID tree's CPU per request.
measure() {
  local label=$1 pid=$2 target=$3; shift 3
  local f; f="$OUT/$(echo "$label" | tr -s ' /()' '____')"
  local before after perf_pid="" stat_pid=""
  if [ "$PERF" = 1 ] && [ "$pid" != 0 ] && [ ! -f "$OUT/perf.data" ]; then
    perf record -g -p "$pid" -o "$OUT/perf.data" >/dev/null 2>&1 & perf_pid=$!
    sleep 0.5
  fi
  if [ "$SYSCALLS" = 1 ] && [ "$pid" != 0 ]; then
    perf stat -x, -e "$SYS_EVENTS" -p "$pid" -o "$f.sys" >/dev/null 2>&1 & stat_pid=$!
    sleep 0.3
  fi
  before=$([ "$pid" = 0 ] && echo "0 0" || cpu_ns "$pid")
  "$BIN/kvroute-sim" replay --trace "$TRACE" --target "$target" --json "$f.json" "$@" >"$f.line" 2>&1 \
    || echo "replay $label failed: $(tail -1 "$f.line")" >&2
  after=$([ "$pid" = 0 ] && echo "0 0" || cpu_ns "$pid")
  [ -n "$perf_pid" ] && { kill -INT "$perf_pid"; wait "$perf_pid" 2>/dev/null || true; }
  [ -n "$stat_pid" ] && { kill -INT "$stat_pid"; wait "$stat_pid" 2>/dev/null || true; }
  python3 - "$f.json" "$label" $before $after <<'EOF'
import json, sys
label = sys.argv[2]
b_s, b_t, a_s, a_t = map(int, sys.argv[3:7])
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("%-30s no report: %s" % (label, e)); sys.exit()
ok = max(1, r["requests"] - r["errors"])
print("%-30s %6d req %4d err %6.0f rps | CPU %7.1f us/req (stat %7.1f) | TTFT p50 %7.2f p99 %7.2f | E2E p50 %7.2f p99 %7.2f" % (
    label, r["requests"], r["errors"], r["achieved_rps"], (a_s - b_s) / 1e3 / ok, (a_t - b_t) / 1e3 / ok,
    r["ttft_ms"]["p50"], r["ttft_ms"]["p99"], r["e2e_ms"]["p50"], r["e2e_ms"]["p99"]))
try:
    sys_counts = {}
    for line in open(sys.argv[1][:-len(".json")] + ".sys"):
        parts = line.strip().split(",")
        if len(parts) > 2 and parts[2].startswith("syscalls:sys_enter_") and parts[0].isdigit():
            sys_counts[parts[2][len("syscalls:sys_enter_"):]] = int(parts[0])
    print("%-30s syscalls per request: %s" % ("", " ".join("%s %.2f" % (k, v / ok) for k, v in sys_counts.items() if v)))
except OSError:
    pass
EOF
}

echo "== CPU per proxied request ($N requests per row, streaming, one simulated worker; $OUT)"
KVP=(); KVU=()
for b in $KV_BINS; do start_kvroute "$b"; KVP+=("$KV_PID"); KVU+=("$KV_URL"); done
[ "$GATEWAY" = 1 ] && { start_gateway; sleep 1; }
for rate in $RATES; do
  for conn in $CONNS; do
    flag=(); [ "$conn" = new ] && flag=(--new-connections)
    common=(--limit "$N" --rate "$rate" --stream $SHORT "${flag[@]}")
    for round in $(seq "$ROUNDS"); do
      measure "direct  $rate/s $conn" 0 "$URLS" "${common[@]}"
      i=0
      for b in $KV_BINS; do
        measure "kv$i    $rate/s $conn" "${KVP[$i]}" "${KVU[$i]}" "${common[@]}"
        i=$((i + 1))
      done
      [ "$GATEWAY" = 1 ] && measure "gateway $rate/s $conn" "$GW_PID" "$GW_URL" "${common[@]}"
    done
  done
done
i=0; for b in $KV_BINS; do echo "kv$i = $b"; i=$((i + 1)); done
echo "reports: $OUT"
