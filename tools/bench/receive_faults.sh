#!/usr/bin/env bash
# What-if study: the soft NIC's receive-fault policies (Lesokhin17 §4-5, Figs. 4 and 10)
# on the built-in launcher, 2 ranks, `pw-perftest send_bw` (ib_send_bw's shape: 64 KiB
# SENDs, 128 outstanding, 512 receives posted, ODP memory on both sides).
#   1. Fig. 10: one receive in N lands on memory the NIC has never mapped (a minor fault:
#      pages in memory; a major fault: pages of a file on disk that were dropped from the
#      page cache), N = 1024, 256, 64, 16; throughput relative to the same run's no-fault
#      optimum, per policy: rnr, backup (512 KiB ring), drop (retransmission timer 67 ms,
#      IB timeout 14 as ib_send_bw sets it) and drop with a 1 ms timer (timeout 8).
#   2. Fig. 4: the receive ring starts cold (never mapped, no prefetch), 64 and 512
#      receives: total time and the time until every buffer of the ring has been filled
#      once (the ring is warm), per policy (and backup with a 4 MiB ring, which holds 64 cold
#      messages), next to pinned receive buffers.
# Every configuration runs REPEATS times (default 3), taking turns; the median counts.
# Usage: tools/bench/receive_faults.sh [OUTDIR]   (default: target/bench/receive-faults)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/receive-faults}
repeats=${REPEATS:-3}
iters=${ITERS:-4096}
mkdir -p "$out/raw"
source tools/bench/run_record.sh
run_record_start "$out" "$0" "$@"
cargo build --release -q -p pagewire-tools --bin pw-perftest --bin pw-plot
echo "# $(date -u +%FT%TZ) $(uname -sr), $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/machine.txt"
# The file of major faults goes on the disk the results go to (not a tmpfs).
faultdir=$(mktemp -d "$out/raw/faultfile.XXXX")
trap 'rm -rf "$faultdir"' EXIT

# run NAME POLICY TIMEOUT CHECK [pw-perftest flags...]: a failed run leaves its error in
# NAME.err and counts as missing.
run() {
  local name=$1 policy=$2 timeout=$3 check=$4
  shift 4
  PAGEWIRE_MEMLOCK_LIMIT=unlimited PAGEWIRE_SOFT_RNPF=$policy PAGEWIRE_SOFT_ACK_TIMEOUT=$timeout \
    PAGEWIRE_SOFT_ODP_CHECK=$check \
    target/release/pw-perftest send_bw --mr odp -s 65536 -n "$iters" "$@" > "$out/raw/$name.txt" 2> "$out/raw/$name.err" ||
    echo "$name failed: $(grep -m1 Error "$out/raw/$name.err")" >&2
}
# The memory monitor cannot watch a file mapping, so the soft NIC forgets its pages at the
# owner's next post; a major fault's retransmission under `drop` would fault again. Major
# faults (and their optimum) run with the pagemap check, which keeps them.
check_of() { [ "$1" = major ] && echo pagemap || echo monitor; }
policies="rnr:14 backup:14 drop:14 drop:8"
label() { case $1 in rnr:*) echo rnr ;; backup:*) echo backup ;; drop:14) echo "drop (67 ms)" ;; drop:8) echo "drop (1 ms)" ;; esac; }
file() { echo "${1/:/-t}"; }
for r in $(seq 1 "$repeats"); do
  for p in $policies; do
    for kind in minor major; do
      run "optimum-$kind-$(file "$p")-$r" "${p%%:*}" "${p##*:}" "$(check_of $kind)"
      for every in 1024 256 64 16; do
        run "$kind-$every-$(file "$p")-$r" "${p%%:*}" "${p##*:}" "$(check_of $kind)" \
          --rnpf-every "$every" --rnpf-kind "$kind" --rnpf-dir "$faultdir"
      done
    done
  done
  for depth in 64 512; do
    for p in $policies; do
      run "cold-$depth-$(file "$p")-$r" "${p%%:*}" "${p##*:}" monitor --cold-ring --rx-depth "$depth"
    done
    # A backup ring that holds the whole cold burst (64 messages of 64 KiB).
    PAGEWIRE_SOFT_BACKUP_RING=4M run "cold-$depth-backup4m-$r" backup 14 monitor --cold-ring --rx-depth "$depth"
    PAGEWIRE_MEMLOCK_LIMIT=unlimited target/release/pw-perftest send_bw --mr pinned -s 65536 -n "$iters" \
      --rx-depth "$depth" > "$out/raw/cold-$depth-pinned-$r.txt" 2> "$out/raw/cold-$depth-pinned-$r.err"
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

# The stream line of a run: "#bytes #messages #faults seconds MB/sec ring-filled-ms".
stream() { awk '/#messages/ { on = 1; next } on && $1 == 65536 && NF == 6 { print; exit }' "$1"; }
# median of the numbers on stdin
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
mbs() { for r in $(seq 1 "$repeats"); do stream "$out/raw/$1-$r.txt" | awk '{ print $5 }'; done | median; }
# ratio A B: "A/B (A)", or "failed" when a run is missing
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan") print "failed"; else printf "%.3f (%.0f)", a / b, a }'; }
col() { for r in $(seq 1 "$repeats"); do stream "$out/raw/$1-$r.txt" | awk -v c="$2" '{ print $c }'; done | median; }
{
  echo "Receive-side network page faults, \`pw-perftest send_bw\` (64 KiB SENDs, $iters per run, ODP), median of $repeats runs."
  echo "Machine: $(cat "$out/machine.txt" | tr '\n' ' ')"
  echo
  echo "## Throughput relative to the no-fault optimum (Lesokhin17 Fig. 10)"
  echo
  echo "| fault | policy | optimum MB/s | 1 in 1024 | 1 in 256 | 1 in 64 | 1 in 16 |"
  echo "|---|---|---:|---:|---:|---:|---:|"
  for kind in minor major; do
    for p in $policies; do
      opt=$(mbs "optimum-$kind-$(file "$p")")
      row="| $kind | $(label "$p") | $opt |"
      for every in 1024 256 64 16; do
        row="$row $(ratio "$(mbs "$kind-$every-$(file "$p")")" "$opt") |"
      done
      echo "$row"
    done
  done
  echo
  echo "Each cell: throughput over the same policy's optimum without faults (MB/s in brackets)."
  echo "Minor faults with the memory monitor (the default), major faults and their optimum with"
  echo "PAGEWIRE_SOFT_ODP_CHECK=pagemap (the monitor cannot watch a file mapping)."
  echo
  echo "## A cold receive ring (Lesokhin17 Fig. 4)"
  echo
  echo "| receives posted | policy | total ms for $iters messages | ring filled once after ms |"
  echo "|---:|---|---:|---:|"
  for depth in 64 512; do
    for p in $policies backup4m pinned; do
      case $p in
        pinned) name="cold-$depth-pinned" what="pinned (warm, no faults)" ;;
        backup4m) name="cold-$depth-backup4m" what="backup, 4 MiB ring" ;;
        *) name="cold-$depth-$(file "$p")" what=$(label "$p") ;;
      esac
      echo "| $depth | $what | $(col "$name" 4 | awk '{ printf "%.1f", $1 * 1000 }') | $(col "$name" 6) |"
    done
  done
} > "$out/summary.md"

# Plots: relative throughput against the fault interval; the cold ring's timeline (run 1).
series=()
for p in $policies; do
  for kind in minor major; do
    pts=""
    opt=$(mbs "optimum-$kind-$(file "$p")")
    for every in 1024 256 64 16; do
      v=$(mbs "$kind-$every-$(file "$p")")
      [ "$v" = nan ] || pts="$pts${pts:+,}$every:$(awk -v a="$v" -v b="$opt" 'BEGIN { printf "%.4f", a / b }')"
    done
    [ -n "$pts" ] || continue
    series+=("$(label "$p"), $kind=$pts")
  done
done
target/release/pw-plot --title "Receive faults (Lesokhin17 Fig. 10): send_bw 64 KiB, throughput / optimum" \
  --x-label "one fault every N receives" --y-label "throughput relative to no faults" \
  -o "$out/relative.svg" "${series[@]}" > /dev/null
cold=()
for p in $policies; do cold+=("$(label "$p")=$out/raw/cold-512-$(file "$p")-1.txt:2:3:1=#t"); done
cold+=("backup, 4 MiB ring=$out/raw/cold-512-backup4m-1.txt:2:3:1=#t")
target/release/pw-plot --title "A cold receive ring of 512 (Lesokhin17 Fig. 4): receiver throughput over time" \
  --x-label "time since the start [ms]" --y-label "MB/s" -o "$out/cold-ring.svg" "${cold[@]}" > /dev/null
cat "$out/summary.md"
run_record_end "$out"
