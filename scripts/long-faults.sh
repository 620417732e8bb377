#!/usr/bin/env bash
# The long fault runs: the fault suite of crates/kvgate/tests/faults.rs
# with KVGATE_FAULT_SCALE times the traffic, ROUNDS times over, in release mode.
# Prints each test's measured line and a pass/fail count per test; the log
# goes to .cache/long-faults.log. Record the results in docs/reliability.md.
#
#   bash scripts/long-faults.sh            # 5 rounds at 10x traffic
#   ROUNDS=2 KVGATE_FAULT_SCALE=4 bash scripts/long-faults.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${ROUNDS:-5}"
export KVGATE_FAULT_SCALE="${KVGATE_FAULT_SCALE:-10}"
mkdir -p .cache
log=.cache/long-faults.log
: > "$log"
cargo build --release -p kvgate --tests >/dev/null 2>&1 || cargo build --release -p kvgate --tests
declare -A pass fail
names=$(cargo test --release -q -p kvgate --test faults -- --list 2>/dev/null | sed -n 's/: test$//p')
for round in $(seq 1 "$ROUNDS"); do
  echo "=== round $round of $ROUNDS (traffic x$KVGATE_FAULT_SCALE)" | tee -a "$log"
  out=$(cargo test --release -p kvgate --test faults -- --test-threads 1 --nocapture 2>&1 || true)
  echo "$out" >> "$log"
  echo "$out" | grep -E "^(r[0-9]|killed|flood|peer)|panicked|^(left|r0 still)" || true
  # Failed tests are listed, indented, after the last "failures:" header.
  failed=$(echo "$out" | awk '/^failures:$/ {list=1; n++; next} list && /^    [a-z_]+$/ {print $1} /^test result/ {list=0}' | sort -u)
  for name in $names; do
    if echo "$failed" | grep -qx "$name"; then fail[$name]=$(( ${fail[$name]:-0} + 1 )); else pass[$name]=$(( ${pass[$name]:-0} + 1 )); fi
  done
done
echo
echo "| test | passed | failed |"
echo "|---|---|---|"
status=0
for name in $names; do
  echo "| $name | ${pass[$name]:-0} | ${fail[$name]:-0} |"
  [ "${fail[$name]:-0}" -eq 0 ] || status=1
done
exit $status
