#!/usr/bin/env bash
# Router tiers side by side (docs/PERFORMANCE.md, "Router-tier cost"). Run by hand,
# not in CI: it installs NVIDIA Dynamo from PyPI and takes minutes.
#
# Everything runs on loopback inside a private network namespace that has only `lo`
# (the script re-executes itself under `unshare -n` once the Python packages are
# installed): Dynamo's ZMQ event plane binds 0.0.0.0, and nothing started here may be
# reachable from outside. Each stack is started, measured and stopped in turn, and
# the stacks alternate within every round (ROUNDS rounds).
#
# Stacks:
# - dynamo:  Dynamo 1.6.1's router tier, `python -m dynamo.frontend --router-mode kv`
#   in front of two `python -m dynamo.mocker` workers (file discovery, TCP request
#   plane, ZMQ event plane, block size 16, --speedup-ratio 1000), PyPI `ai-dynamo`
#   and `ai-dynamo-runtime` ==1.6.1 installed --no-deps into $DYN_VENV with the few
#   packages they import;
# - kvroute: `kvroute serve` (--cores $KV_CORES) with its proxy in front of
#   `kvroute-sim fleet` (two workers, block size 16, --time-scale 1000, ZMQ events),
#   the same tokenizer (`kvroute-sim tokenizer`, word tN = token N) on both sides;
# - gateway: SGLang Model Gateway 0.3.2 (`--policy cache_aware`), relay (`kvroute-sim
#   relay`, a byte relay: the floor of any hop), hrelay (`kvroute-sim relay --http`,
#   hyper's HTTP/1.1 relay on tokio: the floor of an HTTP proxy, the control for
#   kvroute's hyper stack), hroute (`kvroute-sim relay --http --route-tokenizer`: that
#   relay doing kvroute's routing work, as a library, on every request: the control
#   for kvroute's runtime), kvroute, and direct, each in front of the same stand-in
#   worker (a cheap `kvroute-sim fleet` worker).
#
# Parts (PARTS="ids text low tput"):
# - ids:  the conversation trace's first $N requests at x$SCALE, token-id prompts,
#         streamed, $OSL output tokens: dynamo and kvroute, once per index layout and
#         event format in $VARIANTS ("sharded/zmq replicated/zmq replicated/binary
#         control/binary": zmq is vLLM's events, token ids that kvroute hashes; binary
#         is kvroute's own, block hashes computed on the worker's side, the form in
#         which Dynamo's mockers send theirs; control is not kvroute but the control
#         for its decision latency, `kvroute-sim relay --http --route-tokenizer
#         --events-addr`: kvroute's routing work as a library on tokio, routing among
#         the same fleet by its binary events, its decisions' wall time timed as
#         kvroute's are);
# - text: the same as chat text (both sides render and tokenize);
# - low:  one streamed chat request at a time ($LOW_N at $LOW_RATE/s, 256-token
#         prompts), keep-alive and new connections: direct, relay, hrelay, hroute,
#         gateway, kvroute (with its phases: read, tokenize, decision, upstream head, TTFT);
#         LOW_CONNS="keep-alive" or "new" measures one kind of connection only;
# - tput: wrk, $TPUT_CONNS connections, non-streamed completions, $TPUT_SECS s each:
#         direct, hrelay, hroute, gateway, kvroute.
# In low and tput kvroute runs with index layout $HOP_LAYOUT (default replicated, as
# deploy/kubernetes configures it).
# Each row: TTFT p50/p99 (ms), the router's CPU per request (its process tree, µs),
# and for kvroute its decision latency (`kvroute_decision_latency_seconds`, from the
# histogram's buckets: p50/p99 as bucket bounds, the mean, and the share over ~1 ms)
# with its two controls over the same replay: the decision's own CPU time
# (`kvroute_decision_cpu_seconds`: the routing work, waits left out) and the lateness
# of the cores' periodic probe timer (`kvroute_core_schedule_lag_seconds`: how long
# any task on a core waits for its turn). Beside each ids and text row runs a control
# from outside the router, `kvroute-sim probe` (PROBE=0: none): short pieces of CPU
# work on threads pinned to every CPU, the share of them stretched past 1 ms.
#
# Needs: cargo build --release --bin kvroute --bin kvroute-sim; python3 -m pip install
# sglang-router==0.3.2 (else no gateway rows); wrk (tput); root (unshare -n).
# E.g.: ROUNDS=3 PARTS="ids" tools/router_tier.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DYN_VENV=${DYN_VENV:-$HOME/.cache/kvroute-dynamo-venv}
PARTS=${PARTS:-"ids text low tput"}
DYNAMO=${DYNAMO:-1}

if [ -z "${KVR_TIER_NETNS:-}" ]; then
  if [ "$DYNAMO" = 1 ] && [[ " $PARTS " == *" ids "* || " $PARTS " == *" text "* ]] &&
    ! "$DYN_VENV/bin/python" -c "import dynamo.frontend.main, dynamo.mocker.main" 2>/dev/null; then
    echo "installing Dynamo 1.6.1 into $DYN_VENV" >&2
    python3 -m venv "$DYN_VENV"
    "$DYN_VENV/bin/pip" install -q --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1
    # What they import at run time (their declared dependencies pull in far more).
    "$DYN_VENV/bin/pip" install -q uvloop "pydantic<=2.13.5" typing_extensions msgspec pyzmq \
      prometheus-client packaging pyyaml
  fi
  exec unshare -n env KVR_TIER_NETNS=1 "$0" "$@"
fi
ip link set lo up

BIN=${BIN:-target/release}
TRACE=${TRACE:-/work/shared/traces/mooncake_conversation_trace.jsonl}
[ -f "$TRACE" ] || TRACE=tests/data/mooncake_slice.jsonl
ROUNDS=${ROUNDS:-3}
N=${N:-1500}
SCALE=${SCALE:-10}
OSL=${OSL:-16}
KV_CORES=${KV_CORES:-2}
KV_FLAGS=${KV_FLAGS:-}
# The ids and text parts run kvroute once per LAYOUT/EVENTS pair here.
VARIANTS=${VARIANTS:-"sharded/zmq replicated/zmq replicated/binary control/binary"}
# The low and tput parts: the layout deploy/kubernetes ships for a proxy tier.
HOP_LAYOUT=${HOP_LAYOUT:-replicated}
# Another build's bin directory: in the low and tput parts its kvroute runs beside
# BIN's, same flags, same stand-in worker, measured next to it in every round (rows
# "alt"; the two take turns going first), so that two builds compare within one run.
ALT=${ALT:-}
LOW_N=${LOW_N:-300}
LOW_RATE=${LOW_RATE:-20}
# Which connections the low part measures: "keep-alive new" or either one.
LOW_CONNS=${LOW_CONNS:-"keep-alive new"}
TPUT_CONNS=${TPUT_CONNS:-64}
TPUT_SECS=${TPUT_SECS:-10}
OUT=${OUT:-$(mktemp -d /tmp/router_tier.XXXXXX)}; mkdir -p "$OUT"
HAVE_GW=${GATEWAY:-1}
PROBE=${PROBE:-1}
PROBE_WORK_US=${PROBE_WORK_US:-150}
[ "$HAVE_GW" = 0 ] || python3 -c "import sglang_router" 2>/dev/null || { HAVE_GW=0; echo "note: no sglang_router, no gateway rows" >&2; }
# shellcheck source=tools/proxy_fleet.sh
source tools/proxy_fleet.sh
# Dynamo reads a model directory: the tokenizer plus a config.json.
cat >"$TOK/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32009,
 "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
 "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 1048576,
 "torch_dtype": "bfloat16", "bos_token_id": 32001, "eos_token_id": 32002}
EOF

# start_kv FLEET_ARGS...: a fleet and kvroute serve in front of it; sets KV_PID, KV_URL,
# KV_HTTP. KV_EVENTS=zmq (default): the workers publish vLLM's ZMQ events (token ids;
# kvroute hashes them); binary: they send kvroute's binary events with the block hashes
# computed on the worker's side, as Dynamo's mockers send theirs.
start_kv() {
  local n
  # In ZMQ mode the fleet binds its event ports first: a port picked here and not yet
  # bound could otherwise be handed to the fleet too.
  [ "${KV_EVENTS:-zmq}" = zmq ] && start_fleet "kv" "$@"
  serve_kv "$BIN"
  if [ "${KV_EVENTS:-zmq}" = binary ]; then
    start_fleet "kv" "$@" --events binary --router-events "$KV_EVENTS_ADDR"
    # Registered by their binary handshake.
    n=$(grep -c '^worker ' "$OUT/kv.fleet")
    for _ in $(seq 200); do
      [ "$(curl -sf "$KV_HTTP/v1/workers" | grep -o '"url"' | wc -l)" -ge "$n" ] && break; sleep 0.05
    done
  fi
  sleep 0.5 # ZMQ subscriptions
}

# serve_kv DIR: DIR/kvroute serve, subscribed to the ZMQ fleet started last (ENGINES);
# sets KV_PID, KV_URL, KV_HTTP, KV_EVENTS_ADDR.
serve_kv() {
  local pp hp ep ap args=()
  if [ "${KV_EVENTS:-zmq}" = zmq ]; then
    while read -r e; do [ -n "$e" ] && args+=(--engine "$e"); done <<<"$ENGINES"
  fi
  pp=$(free_port); hp=$(free_port); ep=$(free_port); ap=$(free_port)
  # shellcheck disable=SC2086
  "$1/kvroute" serve --cores "$KV_CORES" --block-size 16 --index-layout "${KV_LAYOUT:-sharded}" $KV_FLAGS --tokenizer "sim-model=$TOK" \
    --proxy-addr "127.0.0.1:$pp" --http-addr "127.0.0.1:$hp" --events-addr "127.0.0.1:$ep" \
    --api-addr "127.0.0.1:$ap" "${args[@]}" >>"$OUT/kvroute.log" 2>&1 &
  KV_PID=$!; PIDS+=("$KV_PID")
  for _ in $(seq 200); do curl -sf "127.0.0.1:$pp/health" >/dev/null 2>&1 && break; sleep 0.05; done
  KV_URL="http://127.0.0.1:$pp"; KV_HTTP="127.0.0.1:$hp"; KV_EVENTS_ADDR="127.0.0.1:$ep"
}

# start_control FLEET_ARGS...: the routing control (`kvroute-sim relay --http
# --route-tokenizer --events-addr`) and a fleet that registers with it and sends it
# binary events; sets CTL_PID, CTL_URL.
start_control() {
  local n ea
  "$BIN/kvroute-sim" relay --http --route-tokenizer "sim-model=$TOK" --block-size 16 \
    --events-addr 127.0.0.1:0 >"$OUT/control.log" 2>&1 &
  CTL_PID=$!; PIDS+=("$CTL_PID")
  for _ in $(seq 100); do grep -q listening "$OUT/control.log" && break; sleep 0.05; done
  CTL_URL="http://$(sed -n 's/^relay listening on \([^ ]*\).*/\1/p' "$OUT/control.log")"
  ea=$(sed -n 's/^relay events on \([^ ]*\).*/\1/p' "$OUT/control.log")
  start_fleet "ctl" "$@" --events binary --router-events "$ea"
  n=$(grep -c '^worker ' "$OUT/ctl.fleet")
  for _ in $(seq 200); do
    [ "$(grep -c ' registered$' "$OUT/control.log")" -ge "$n" ] && break; sleep 0.05
  done
}

# start_relay NAME FLAGS...: `kvroute-sim relay` to the stand-in worker ($STAND);
# sets REL_PID, REL_URL.
start_relay() {
  local name=$1; shift
  "$BIN/kvroute-sim" relay "$@" --upstream "${STAND#http://}" >"$OUT/$name.log" 2>&1 &
  REL_PID=$!; PIDS+=("$REL_PID")
  for _ in $(seq 100); do grep -q listening "$OUT/$name.log" && break; sleep 0.05; done
  REL_URL="http://$(sed -n 's/^relay listening on \([^ ]*\).*/\1/p' "$OUT/$name.log")"
}

# start_dynamo: the frontend and two mockers; sets DYN_PID (the frontend), DYN_URL.
start_dynamo() {
  local fp
  export DYN_FILE_KV="$OUT/dyn_kv" DYN_DISCOVERY_BACKEND=file DYN_REQUEST_PLANE=tcp DYN_EVENT_PLANE=zmq
  rm -rf "$DYN_FILE_KV"; mkdir -p "$DYN_FILE_KV"
  DYN_MOCKS=()
  for i in 0 1; do
    "$DYN_VENV/bin/python" -m dynamo.mocker --model-path "$TOK" --model-name sim-model \
      --block-size 16 --speedup-ratio 1000 --discovery-backend file >"$OUT/mocker$i.log" 2>&1 &
    DYN_MOCKS+=($!); PIDS+=($!)
  done
  start_frontend() {
    fp=$(free_port)
    "$DYN_VENV/bin/python" -m dynamo.frontend --router-mode kv --http-host 127.0.0.1 --http-port "$fp" \
      --discovery-backend file --kv-cache-block-size 16 >"$OUT/frontend.log" 2>&1 &
    DYN_PID=$!; PIDS+=("$DYN_PID")
    DYN_URL="http://127.0.0.1:$fp"
  }
  start_frontend
  # Ready when both workers are known and a request is answered.
  for _ in $(seq 600); do
    # A port picked free may be taken by a mocker's own listener meanwhile: again.
    kill -0 "$DYN_PID" 2>/dev/null || start_frontend
    [ "$(grep -c 'Adding worker' "$OUT/frontend.log" 2>/dev/null)" -ge 2 ] &&
      curl -sf "$DYN_URL/v1/completions" -H 'content-type: application/json' \
        -d '{"model":"sim-model","prompt":[1,2,3],"max_tokens":1}' >/dev/null 2>&1 && break
    sleep 0.1
  done
}
stop_dynamo() { stop_pid "$DYN_PID"; for p in "${DYN_MOCKS[@]}"; do stop_pid "$p"; done; }

# hist PAGE NAME: the histogram kvroute_NAME_seconds from a /metrics page's text,
# "le:count ... sum count".
hist() {
  local n=kvroute_$2_seconds
  awk -v n="$n" '$0 ~ "^" n "_bucket" { match($0, /le="[^"]*"/); printf "%s:%s ", substr($0, RSTART + 4, RLENGTH - 5), $NF }
    $0 ~ "^" n "_(sum|count)" { printf "%s ", $NF }' <<<"$1"
}

# phases PAGE: "name:sum:count" of the histograms that split kvroute's TTFT.
phases() {
  awk '/^kvroute_(proxy_read|proxy_tokenize|decision_latency|proxy_upstream_head|proxy_ttft)_seconds_(sum|count) / {
    n = $1; sub(/^kvroute_(proxy_)?/, "", n); sub(/_seconds_(sum|count)$/, "", n)
    if ($1 ~ /_sum$/) s[n] = $2; else c[n] = $2 }
    END { for (n in s) printf "%s:%s:%s ", n, s[n], c[n] }' <<<"$1"
}

# measure LABEL PID TARGET METRICS ARGS...: one replay; TTFT, CPU per request of the
# PID's tree (0: none), decision latency (METRICS: kvroute's http address, or "-").
measure() {
  local label=$1 pid=$2 target=$3 metrics=$4; shift 4
  local f before after h0="" h1="" l0="" l1="" p0="" p1="" c0="" c1=""; f="$OUT/$(echo "$label" | tr -s ' /()' '____')"
  local page
  if [ "$metrics" != - ]; then
    page=$(curl -s "$metrics/metrics")
    h0=$(hist "$page" decision_latency) l0=$(hist "$page" core_schedule_lag) p0=$(phases "$page") c0=$(hist "$page" decision_cpu)
  fi
  before=$([ "$pid" = 0 ] && echo "0 0" || cpu_ns "$pid")
  "$BIN/kvroute-sim" replay --trace "$TRACE" --target "$target" --json "$f.json" "$@" >"$f.line" 2>&1 \
    || echo "replay $label failed: $(tail -1 "$f.line")" >&2
  after=$([ "$pid" = 0 ] && echo "0 0" || cpu_ns "$pid")
  if [ "$metrics" != - ]; then
    page=$(curl -s "$metrics/metrics")
    h1=$(hist "$page" decision_latency) l1=$(hist "$page" core_schedule_lag) p1=$(phases "$page") c1=$(hist "$page" decision_cpu)
  fi
  python3 - "$f.json" "$label" "$before $after" "$h0" "$h1" "$l0" "$l1" "$p0" "$p1" "$c0" "$c1" <<'EOF' | tee -a "$OUT/table.txt"
import json, sys
label = sys.argv[2]
b_s, b_t, a_s, a_t = map(int, sys.argv[3].split())
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("%-28s no report: %s" % (label, e)); sys.exit()
ok = max(1, r["requests"] - r["errors"])
line = "%-28s %5d req %3d err | TTFT p50 %7.2f p99 %7.2f | CPU %7.0f us/req" % (
    label, r["requests"], r["errors"], r["ttft_ms"]["p50"], r["ttft_ms"]["p99"], (a_s - b_s) / 1e3 / ok)
def parse(h):
    # Buckets "le:count", then the sum and the count (in the order scraped).
    f = h.split()
    b = [(float(x.split(":")[0]), float(x.split(":")[1])) for x in f if ":" in x]
    rest = [float(x) for x in f if ":" not in x]
    if not b or len(rest) < 2:
        return None
    return b, rest[0], rest[1]
def summary(name, h0, h1):
    if not (h0 and h1):
        return ""
    b = [(le, c1 - c0) for (le, c0), (_, c1) in zip(h0[0], h1[0])]
    n = h1[2] - h0[2]
    def q(p):
        for le, c in b:
            if c >= p * n:
                return le * 1e3
        return float("inf")
    if n <= 0:
        return ""
    # The share over the bucket bound nearest 1 ms: compared between the decision and
    # its control, it says whether the decision's tail is the core's scheduling.
    le1, c1 = min(b, key=lambda x: abs(x[0] - 1e-3))
    return " | %s p50 <= %.2f p99 <= %.2f mean %.2f ms, %.1f%% > %.2f ms" % (
        name, q(0.5), q(0.99), (h1[1] - h0[1]) / n * 1e3, 100 * (n - c1) / n, le1 * 1e3)
line += summary("decision", parse(sys.argv[4]), parse(sys.argv[5]))
# Its own CPU time (the waits for other cores left out): the routing work itself.
line += summary("own CPU", parse(sys.argv[10]), parse(sys.argv[11]))
# The control: how late the cores' periodic probe timer ran over the same replay.
line += summary("timer lag", parse(sys.argv[6]), parse(sys.argv[7]))
# Mean of each phase of kvroute's TTFT over the replay, µs.
def sums(t):
    return {n: (float(a), float(b)) for n, a, b in (x.split(":") for x in t.split())}
p0, p1 = sums(sys.argv[8]), sums(sys.argv[9])
parts = []
for n in ("read", "tokenize", "decision_latency", "upstream_head", "ttft"):
    if n in p0 and n in p1 and p1[n][1] > p0[n][1]:
        parts.append("%s %.0f" % (n.split("_")[0], (p1[n][0] - p0[n][0]) / (p1[n][1] - p0[n][1]) * 1e6))
if parts:
    line += " | phases us: " + " ".join(parts)
print(line)
EOF
}

# tput LABEL PID URL: wrk, non-streamed completions; req/s and CPU per request.
tput() {
  local label=$1 pid=$2 url=$3 before after
  before=$([ "$pid" = 0 ] && echo "0 0" || cpu_ns "$pid")
  wrk -t 2 -c "$TPUT_CONNS" -d "${TPUT_SECS}s" -s "$OUT/post.lua" "$url/v1/completions" >"$OUT/wrk.txt" 2>&1 || true
  after=$([ "$pid" = 0 ] && echo "0 0" || cpu_ns "$pid")
  python3 - "$OUT/wrk.txt" "$label" "$before $after" <<'EOF' | tee -a "$OUT/table.txt"
import re, sys
t = open(sys.argv[1]).read()
b_s, _, a_s, _ = map(int, sys.argv[3].split())
n = int(re.search(r"(\d+) requests in", t).group(1)) if "requests in" in t else 0
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1)) if "Requests/sec" in t else 0
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
print("%-28s %8.0f req/s %6s non-2xx | CPU %6.0f us/req" % (sys.argv[2], rps, bad.group(1) if bad else "0", (a_s - b_s) / 1e3 / max(1, n)))
EOF
}

# probe_start / probe_stop LABEL: beside a row of the ids and text parts, `kvroute-sim
# probe` pinned to every CPU it may use ($PROBE_WORK_US µs of CPU work, 50 times a
# second per CPU): its share of pieces over 1 ms of wall time is the machine's floor
# for the decisions' share in the same row (PROBE=0: no probe).
probe_start() {
  [ "$PROBE" = 1 ] || return 0
  PROBE_OUT="$OUT/probe_$(echo "$1" | tr -s ' /()' '____').json"
  "$BIN/kvroute-sim" probe --work-us "$PROBE_WORK_US" --rate 50 --out "$PROBE_OUT" \
    >"$OUT/probe.log" 2>&1 &
  PROBE_PID=$!; PIDS+=("$PROBE_PID")
}
probe_stop() {
  [ "$PROBE" = 1 ] || return 0
  stop_pid "$PROBE_PID"
  python3 - "$PROBE_OUT" "$1" <<'EOF' | tee -a "$OUT/table.txt"
import json, sys
try:
    p = json.load(open(sys.argv[1]))
except Exception as e:
    print("%-28s probe: no summary (%s)" % (sys.argv[2], e)); sys.exit()
print("%-28s probe: %d x %d us of CPU, wall p50 %d p99 %d us, %.1f%% > 1 ms" % (
    sys.argv[2], p["samples"], p["work_us"], p["p50_us"], p["p99_us"], 100 * p["over_1ms"]))
EOF
}

echo "== router tiers side by side: $OUT (rounds $ROUNDS, load average $(cut -d' ' -f1-3 /proc/loadavg))" | tee "$OUT/table.txt"
trace_parts=()
for p in ids text; do [[ " $PARTS " == *" $p "* ]] && trace_parts+=("$p"); done
for part in "${trace_parts[@]}"; do
  args=(--limit "$N" --time-scale "$SCALE" --stream --max-output-tokens "$OSL")
  [ "$part" = ids ] && args+=(--token-ids) || args+=(--chat)
  echo "-- $part: first $N requests at x$SCALE, streamed" | tee -a "$OUT/table.txt"
  for round in $(seq "$ROUNDS"); do
    if [ "$DYNAMO" = 1 ]; then
      start_dynamo
      probe_start "dynamo  $part r$round"
      measure "dynamo  $part r$round" "$DYN_PID" "$DYN_URL" - "${args[@]}"
      probe_stop "dynamo  $part r$round"
      stop_dynamo
    fi
    for variant in $VARIANTS; do
      layout=${variant%/*} events=${variant#*/}
      if [ "$layout" = control ]; then
        [ "$events" = binary ] || { echo "the control takes binary events only: $variant" >&2; continue; }
        start_control --workers 2 --block-size 16 --capacity-blocks 16384 --time-scale 1000
        probe_start "control $part r$round"
        measure "control $part r$round" "$CTL_PID" "$CTL_URL" "${CTL_URL#http://}" "${args[@]}"
        probe_stop "control $part r$round"
        stop_pid "$CTL_PID"; stop_pid "$FLEET_PID"
        continue
      fi
      KV_LAYOUT=$layout KV_EVENTS=$events start_kv --workers 2 --block-size 16 --capacity-blocks 16384 --time-scale 1000
      probe_start "kvroute $part ${layout:0:4} ${events:0:3} r$round"
      measure "kvroute $part ${layout:0:4} ${events:0:3} r$round" "$KV_PID" "$KV_URL" "$KV_HTTP" "${args[@]}"
      probe_stop "kvroute $part ${layout:0:4} ${events:0:3} r$round"
      stop_pid "$KV_PID"; stop_pid "$FLEET_PID"
    done
  done
done

if [[ " $PARTS " == *" low "* || " $PARTS " == *" tput "* ]]; then
  KV_LAYOUT=$HOP_LAYOUT start_kv --workers 1 --timing "$FAST" --max-active 4096 --time-scale 10
  STAND=$URLS; STAND_FLEET=$FLEET_PID
  if [ -n "$ALT" ]; then
    main_kv=("$KV_PID" "$KV_URL" "$KV_HTTP")
    KV_LAYOUT=$HOP_LAYOUT serve_kv "$ALT"; ALT_PID=$KV_PID ALT_URL=$KV_URL ALT_HTTP=$KV_HTTP
    KV_PID=${main_kv[0]} KV_URL=${main_kv[1]} KV_HTTP=${main_kv[2]}
    sleep 0.5 # ZMQ subscriptions
  fi
  start_relay relay; RELAY_PID=$REL_PID RELAY_URL=$REL_URL
  start_relay hrelay --http; HRELAY_PID=$REL_PID HRELAY_URL=$REL_URL
  start_relay hroute --http --route-tokenizer "sim-model=$TOK" --block-size 16; HROUTE_PID=$REL_PID HROUTE_URL=$REL_URL
  [ "$HAVE_GW" = 1 ] && { start_gateway; sleep 1; }
  if [[ " $PARTS " == *" low "* ]]; then
    for conn in $LOW_CONNS; do
      flag=(); [ "$conn" = new ] && flag=(--new-connections)
      low=(--limit "$LOW_N" --rate "$LOW_RATE" --max-inflight 1 --chat --stream $SHORT "${flag[@]}")
      echo "-- low: one request at a time, $conn" | tee -a "$OUT/table.txt"
      for round in $(seq "$ROUNDS"); do
        measure "direct  low $conn r$round" 0 "$STAND" - "${low[@]}"
        measure "relay   low $conn r$round" "$RELAY_PID" "$RELAY_URL" - "${low[@]}"
        measure "hrelay  low $conn r$round" "$HRELAY_PID" "$HRELAY_URL" - "${low[@]}"
        measure "hroute  low $conn r$round" "$HROUTE_PID" "$HROUTE_URL" - "${low[@]}"
        [ "$HAVE_GW" = 1 ] && measure "gateway low $conn r$round" "$GW_PID" "$GW_URL" - "${low[@]}"
        # With ALT, the two builds take turns going first.
        [ -n "$ALT" ] && [ $((round % 2)) = 0 ] && measure "alt     low $conn r$round" "$ALT_PID" "$ALT_URL" "$ALT_HTTP" "${low[@]}"
        measure "kvroute low $conn r$round" "$KV_PID" "$KV_URL" "$KV_HTTP" "${low[@]}"
        [ -n "$ALT" ] && [ $((round % 2)) = 1 ] && measure "alt     low $conn r$round" "$ALT_PID" "$ALT_URL" "$ALT_HTTP" "${low[@]}"
      done
    done
  fi
  if [[ " $PARTS " == *" tput "* ]]; then
    echo "-- tput: wrk -c $TPUT_CONNS, ${TPUT_SECS}s, non-streamed" | tee -a "$OUT/table.txt"
    completion_lua "$OUT/post.lua"
    for round in $(seq "$ROUNDS"); do
      tput "direct  tput r$round" 0 "$STAND"
      tput "hrelay  tput r$round" "$HRELAY_PID" "$HRELAY_URL"
      tput "hroute  tput r$round" "$HROUTE_PID" "$HROUTE_URL"
      [ "$HAVE_GW" = 1 ] && tput "gateway tput r$round" "$GW_PID" "$GW_URL"
      [ -n "$ALT" ] && [ $((round % 2)) = 0 ] && tput "alt     tput r$round" "$ALT_PID" "$ALT_URL"
      tput "kvroute tput r$round" "$KV_PID" "$KV_URL"
      [ -n "$ALT" ] && [ $((round % 2)) = 1 ] && tput "alt     tput r$round" "$ALT_PID" "$ALT_URL"
    done
  fi
  stop_pid "$KV_PID"; [ -n "$ALT" ] && stop_pid "$ALT_PID"; stop_pid "$RELAY_PID"; stop_pid "$HRELAY_PID"; stop_pid "$HROUTE_PID"; [ "$HAVE_GW" = 1 ] && stop_pid "$GW_PID"; stop_pid "$STAND_FLEET"
fi
echo "table: $OUT/table.txt"
