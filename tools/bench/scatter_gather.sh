#!/usr/bin/env bash
# A buffer with gaps (an MPI vector of bytes: runs of RUN bytes, 1 KiB apart)
# packed by the facade and sent contiguous, against moved in place by the message layer
# (scatter-gather rendezvous in pindown and odp; the slots gather and scatter in copy), and
# the same bytes without gaps, on the built-in launcher and the soft NIC, 2 ranks, memlock
# limit lifted. `pw-msgperf pingpong --msglog 16:22 --iters 300 --vector RUN:1K` with
# `PAGEWIRE_SG_MIN_RUN=off` (always pack) and `PAGEWIRE_SG_MIN_RUN=0 PAGEWIRE_SG_MIN_BYTES=0`
# (always in place), RUN 4K, 16K, 64K, 256K.
# Prints a Markdown table of time per message (µs) and in-place / packed ratios; keeps the
# raw outputs.
# Usage: tools/bench/scatter_gather.sh [OUTDIR]   (default: target/bench/scatter-gather)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/scatter-gather}
mkdir -p "$out"
source tools/bench/run_record.sh
run_record_start "$out" "$0" "$@"
cargo build --release -q -p pagewire-tools --bin pw-msgperf --bin pwrun
echo "# $(date -u +%FT%TZ) $(uname -sr), $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/machine.txt"
modes="pindown odp copy"
runs="4K 16K 64K 256K"
run() { # FILE MODE SG_MIN_RUN [--vector RUN:HOLE]
  local f=$1 mode=$2 sg=$3; shift 3
  PAGEWIRE_MEMLOCK_LIMIT=unlimited PAGEWIRE_MODE=$mode PAGEWIRE_SG_MIN_RUN=$sg PAGEWIRE_SG_MIN_BYTES=0 \
    target/release/pw-msgperf pingpong --msglog 16:22 --iters 300 "$@" > "$out/$f.txt" 2> /dev/null
}
for mode in $modes; do
  run "$mode-contiguous" "$mode" off
  for r in $runs; do
    run "$mode-$r-packed" "$mode" off --vector "$r:1K"
    run "$mode-$r-in-place" "$mode" 0 --vector "$r:1K"
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

t() { awk -v n="$2" '$1 == n && NF == 4 { print $3; exit }' "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
{
  for n in 65536 1048576 4194304; do
    echo "**$n message bytes** (µs per message; in place / packed)"
    echo
    echo "| mode | no gaps | $(for r in $runs; do printf '%s runs: packed | in place | ratio | ' "$r"; done)"
    echo "|---|---:|$(for r in $runs; do printf -- '---:|---:|---:|'; done)"
    for mode in $modes; do
      row="| $mode | $(t "$out/$mode-contiguous.txt" $n)"
      for r in $runs; do
        p=$(t "$out/$mode-$r-packed.txt" $n); i=$(t "$out/$mode-$r-in-place.txt" $n)
        row="$row | $p | $i | $(ratio "$i" "$p")"
      done
      echo "$row |"
    done
    echo
  done
} | tee "$out/summary.md"
cat "$out/machine.txt"
run_record_end "$out"
