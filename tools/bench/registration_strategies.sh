#!/usr/bin/env bash
# What-if study: NFS-RDMA's registration strategies side by side, as pindown variants
# (`PAGEWIRE_PINDOWN_STRATEGY`), on the built-in launcher and the soft NIC, 2 ranks, with
# the memlock limit lifted (so no strategy falls back to copying):
#   - per-op:   register before and deregister after every transfer;
#   - key-pool: FMR-style, deregistrations deferred and flushed in batches of 32;
#   - cache:    the pin-down cache; its buffer is reused, so every transfer is a hit, which
#               is also the per-transfer cost of NFS-RDMA's all-physical registration
#               (translation only, no registration);
#   - copy:     the copy mode, for reference.
# `pw-msgperf pingpong --msglog 12:22 --iters 500` each. Prints a Markdown table of time per
# message and bandwidth by size and strategy, and one of registration cost per transfer
# (mean µs per registration and per deregistration, from the NIC's counters), and keeps the
# raw outputs and a plot (strategies.svg).
# Usage: tools/bench/registration_strategies.sh [OUTDIR]
#        (default: target/bench/registration-strategies)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/registration-strategies}
mkdir -p "$out"
source tools/bench/run_record.sh
run_record_start "$out" "$0" "$@"
cargo build --release -q -p pagewire-tools --bin pw-msgperf --bin pwrun --bin pw-plot
echo "# $(date -u +%FT%TZ) $(uname -sr), $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/machine.txt"
run() { # NAME MODE [STRATEGY]
  PAGEWIRE_MEMLOCK_LIMIT=unlimited PAGEWIRE_MODE=$2 PAGEWIRE_PINDOWN_STRATEGY=${3:-cache} \
    target/release/pw-msgperf pingpong --msglog 12:22 --iters 500 > "$out/$1.txt" 2> /dev/null
}
run per-op pindown per-op
run key-pool pindown key-pool
run cache pindown cache
run copy copy
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

names="per-op key-pool cache copy"
# t FILE BYTES: "t[usec] MB/s" of the timing table; reg FILE BYTES: "reg dereg" µs means.
t() { awk -v n="$2" '$1 == n && NF == 4 { print $3, $4; exit }' "$1"; }
reg() { awk -v n="$2" '/^# counters/ { on = 1 } on && $2 == n { print $12, $13; exit }' "$1"; }
{
  echo "| size | per-op µs (MB/s) | key-pool µs (MB/s) | cache µs (MB/s) | copy µs (MB/s) | cache / per-op | key-pool / per-op |"
  echo "|---:|---:|---:|---:|---:|---:|---:|"
  for e in $(seq 12 22); do
    n=$((1 << e)); row="| $n"
    for s in $names; do read -r us mbs < <(t "$out/$s.txt" "$n"); row="$row | $us ($mbs)"; declare "t_${s//-/_}=$us"; done
    r1=$(awk -v a="$t_cache" -v b="$t_per_op" 'BEGIN { printf "%.2f", a / b }')
    r2=$(awk -v a="$t_key_pool" -v b="$t_per_op" 'BEGIN { printf "%.2f", a / b }')
    echo "$row | $r1 | $r2 |"
  done
  echo
  echo "| size | per-op: register µs | per-op: deregister µs | key-pool: register µs | key-pool: deregister µs (in batches) |"
  echo "|---:|---:|---:|---:|---:|"
  for e in $(seq 15 22); do
    n=$((1 << e))
    read -r pr pd < <(reg "$out/per-op.txt" "$n"); read -r kr kd < <(reg "$out/key-pool.txt" "$n")
    echo "| $n | $pr | $pd | $kr | $kd |"
  done
} | tee "$out/summary.md"
plot_args=()
for s in $names; do plot_args+=("$s=$out/$s.txt:1:3"); done
target/release/pw-plot --title "PingPong, 2 ranks: pindown registration strategies (memlock lifted)" \
  --y-label "time per message [usec]" --out "$out/strategies.svg" "${plot_args[@]}"
cat "$out/machine.txt"
run_record_end "$out"
