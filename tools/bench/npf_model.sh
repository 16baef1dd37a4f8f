#!/usr/bin/env bash
# What-if study: network page fault cost, the soft NIC's real figures next to the
# `npf-model` profile (real OS work + the NIC firmware's part, modelled from Lesokhin17
# Table 4) and next to Lesokhin17's own (Table 4, Fig. 3(a)) and ODP13's.
#
# `pw-perftest read_lat --mr odp --cold`, 4 KiB and 4 MiB, 1000 iterations, 2 ranks:
#   - resident, profile real:      pages in memory, unknown to the NIC (Lesokhin17's minor NPF);
#   - resident, profile npf-model: the same plus the modelled firmware time;
#   - first touch, profile real:   fresh pages the fault must also allocate and zero.
# The client (initiator) takes a requester fault per iteration writing its fresh landing
# buffer; the server a responder fault reading a fresh source slice (the first 256 at 4 MiB:
# the target span is capped at 1 GiB and then reused).
# Prints a Markdown table and keeps the raw outputs and a plot (faults.svg: the requester
# faults' median and 99th percentile by size, Lesokhin17 Table 4's beside them).
# Usage: tools/bench/npf_model.sh [OUTDIR]   (default: target/bench/npf-model)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/npf-model}
mkdir -p "$out"
source tools/bench/run_record.sh
run_record_start "$out" "$0" "$@"
cargo build --release -q -p pagewire-tools --bin pw-perftest --bin pwrun --bin pw-plot
echo "# $(date -u +%FT%TZ) $(uname -sr), $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/machine.txt"
run() { # NAME PROFILE [--resident]
  local name=$1 profile=$2
  shift 2
  PAGEWIRE_SOFT_PROFILE=$profile target/release/pw-perftest read_lat --mr odp --cold "$@" \
    -s 4096,4194304 -n 1000 > "$out/$name.txt" 2> /dev/null
}
run resident-real real --resident
run resident-npf-model npf-model --resident
run first-touch-real real
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

# row FILE BYTES SIDE: "faults OS model mean p50 p95 p99 max" of the fault table.
row() {
  awk -v n="$2" -v s="$3" '/^ Network page faults per size/ { on = 1 }
    on && $1 == n && $2 == s { print $3, $6, $7, $8, $9, $10, $11, $12; exit }' "$1"
}
{
  echo "| run | size | side | faults | OS µs | modelled µs | mean µs | 50 % | 95 % | 99 % | max |"
  echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for name in resident-real resident-npf-model first-touch-real; do
    for n in 4096 4194304; do
      for side in client server; do
        read -r f os mo me p50 p95 p99 mx < <(row "$out/$name.txt" "$n" "$side")
        echo "| $name | $n | $side | $f | $os | $mo | $me | $p50 | $p95 | $p99 | $mx |"
      done
    done
  done
  echo "| Lesokhin17 Table 4 (Connect-IB, minor) | 4 KB | | | | | 220 (90 % firmware) | 215 | 250 | 261 | 464 |"
  echo "| Lesokhin17 Table 4 (Connect-IB, minor) | 4 MB | | | | | 350 | 352 | 431 | 440 | 687 |"
  echo "| ODP13 (Mellanox slides, 2013: "page-in performance") | 4 KiB / 4 MiB | | | | | ~135 / ~1,000 | | | | |"
} | tee "$out/summary.md"
# Columns of the fault table: 1 #bytes, 2 side, 9 50 %, 11 99 %.
plot_args=()
for name in resident-real resident-npf-model first-touch-real; do
  plot_args+=("$name 50%=$out/$name.txt:1:9:2=client" "$name 99%=$out/$name.txt:1:11:2=client")
done
target/release/pw-plot --title "Network page faults on the soft NIC (requester side) and Lesokhin17 Table 4" \
  --y-label "fault resolution [usec]" --out "$out/faults.svg" "${plot_args[@]}" \
  "Lesokhin17 Table 4 50%=4096:215,4194304:352" "Lesokhin17 Table 4 99%=4096:261,4194304:440"
cat "$out/machine.txt"
run_record_end "$out"
