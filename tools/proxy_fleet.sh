# shellcheck shell=bash
# Shared set-up of the proxy benchmarks (`tools/proxy_bench.sh`, `tools/proxy_cpu.sh`),
# sourced after they set BIN and OUT: the cheap worker timing, one tokenizer for the
# router and the workers, free loopback ports, a simulated fleet and SGLang Model
# Gateway in front of it. Every process started here is killed on exit.

# Overhead timing: a cheap worker (E2E ~ 8 decode steps of 2 ms) that is not the
# bottleneck at 5k requests/s.
FAST="prefill_base_us=50,prefill_us_per_token=0.2,prefill_attention_us=0,decode_step_base_us=2000,decode_us_per_seq=0"
SHORT="--max-input-tokens 256 --max-output-tokens 8"

# One tokenizer (word tN = token N, ChatML template) for the router and the workers,
# so both compute the same block hashes from the same text.
TOK="$OUT/tok"
"$BIN/kvroute-sim" tokenizer --out "$TOK" >/dev/null

# completion_lua FILE: the wrk script of the throughput measures (tools/router_tier.sh's
# tput part, tools/proxy_instructions.sh): a non-streamed completion of 256 tokens.
completion_lua() {
  cat >"$1" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"sim-model","prompt":"$(seq 1 256 | sed 's/^/t/' | paste -sd' ')","max_tokens":8}'
EOF
}

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_fleet NAME ARGS...: starts a fleet, waits for "ready", sets URLS / ENGINES.
start_fleet() {
  local name=$1; shift
  "$BIN/kvroute-sim" fleet --tokenizer "$TOK" "$@" >"$OUT/$name.fleet" 2>&1 &
  FLEET_PID=$!; PIDS+=("$FLEET_PID")
  for _ in $(seq 200); do grep -q '^ready' "$OUT/$name.fleet" && break; sleep 0.05; done
  URLS=$(sed -n 's/^worker .* url=\([^ ]*\).*/\1/p' "$OUT/$name.fleet" | paste -sd' ')
  ENGINES=$(grep -o 'engine=[^ ]*' "$OUT/$name.fleet" | cut -d= -f2- || true)
}
# cpu_ns PID: CPU time of PID and its descendants, "schedstat_ns stat_ns".
cpu_ns() {
  python3 - "$1" <<'EOF'
import os, sys
tck = os.sysconf("SC_CLK_TCK")
def kids(p):
    out = []
    for t in os.listdir(f"/proc/{p}/task"):
        try:
            out += [int(c) for c in open(f"/proc/{p}/task/{t}/children").read().split()]
        except OSError:
            pass
    return out
todo, seen, sched, stat = [int(sys.argv[1])], set(), 0, 0
while todo:
    p = todo.pop()
    if p in seen:
        continue
    seen.add(p)
    try:
        f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        stat += (int(f[11]) + int(f[12])) * 10**9 // tck
        for t in os.listdir(f"/proc/{p}/task"):
            sched += int(open(f"/proc/{p}/task/{t}/schedstat").read().split()[0])
        todo += kids(p)
    except OSError:
        pass
print(sched, stat)
EOF
}
stop_pid() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# start_gateway: SGLang Model Gateway (cache_aware) over $URLS; sets GW_URL, GW_PID.
start_gateway() {
  local gp mp
  gp=$(free_port); mp=$(free_port)
  # shellcheck disable=SC2086
  python3 -m sglang_router.launch_router --host 127.0.0.1 --port "$gp" --prometheus-port "$mp" \
    --worker-urls $URLS --policy cache_aware --log-level warn >"$OUT/gateway.log" 2>&1 &
  GW_PID=$!; PIDS+=("$GW_PID")
  for _ in $(seq 600); do
    curl -sf "127.0.0.1:$gp/v1/models" >/dev/null 2>&1 && break; sleep 0.05
  done
  GW_URL="http://127.0.0.1:$gp"
}
