#!/usr/bin/env bash
# Instruction counts of the proxy's steps per request body (docs/PERFORMANCE.md,
# "Router-tier cost"): each step of `examples/request_steps.rs`, once under callgrind,
# the previous path (a `serde_json::Value` of the whole body) and the body read in
# place, at 1k/4k/16k/64k prompt tokens. Instruction counts are repeatable on a loaded
# machine, unlike wall-clock. Needs valgrind. Run by hand, not in CI.
# E.g.: SIZES="1024 65536" STEPS="all ids" tools/request_steps.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${SIZES:-"1024 4096 16384 65536"}
STEPS=${STEPS:-"parse ids hash all text all-text"}
nice cargo build -q --release --example request_steps
bin=target/release/examples/request_steps
out=$(mktemp -d /tmp/request_steps.XXXXXX)
count() { # STEP WAY N -> instructions of the measured part
  local f="$out/$1.$2.$3"
  valgrind --tool=callgrind --callgrind-out-file="$f" \
    --toggle-collect='request_steps::measured*' "$bin" "$1" "$2" "$3" >/dev/null 2>&1
  awk '/^summary:|^totals:/ { print $2; exit }' "$f"
}
bytes() { "$bin" "$1" "$2" "$3" | sed -n 's/.* \([0-9]*\) bytes allocated/\1/p'; }
printf '%-9s %7s %12s %12s %6s %12s %12s\n' step tokens instr-tree instr-place ratio \
  alloc-tree alloc-place
for step in $STEPS; do
  for n in $SIZES; do
    t=$(count "$step" tree "$n"); p=$(count "$step" place "$n")
    printf '%-9s %7s %12s %12s %6s %12s %12s\n' "$step" "$n" "$t" "$p" \
      "$(python3 -c "print('%.2f' % ($t / max(1, $p)))")" \
      "$(bytes "$step" tree "$n")" "$(bytes "$step" place "$n")"
  done
done
