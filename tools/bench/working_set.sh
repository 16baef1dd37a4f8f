#!/usr/bin/env bash
# What-if study: a dynamic working set under one memory budget (Lesokhin17 §6.1, Fig. 7).
# Two jobs (each a server with an LRU item store of 20 KiB items and a client, 2 ranks
# under the built-in launcher) run at once in one cgroup v1 memory cgroup; at half time one
# working set grows 100 MiB -> 900 MiB and the other shrinks 900 MiB -> 100 MiB.
#   - pindown: each store holds half the 1 GiB budget, anonymous memory pinned whole;
#   - odp:     each store can hold 900 MiB, a shared mapping of a file on disk, unpinned,
#              the page cache reclaimed by the cgroup under its limit.
# First, short runs without memory pressure (6 MiB working sets) measure what the memory
# behind a store costs per GET on the soft NIC (the findings behind the design), and what
# an anonymous ODP store does under the limit (the cgroup's OOM killer). Then the study,
# 60 s per mode. Writes summary.md, the raw outputs and working-set.svg into OUTDIR.
# Needs root (cgroup v1 memory at /sys/fs/cgroup/memory); skips with a message otherwise.
# Usage: tools/bench/working_set.sh [OUTDIR]   (default: target/bench/working-set)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/working-set}
mkdir -p "$out"
source tools/bench/run_record.sh
run_record_start "$out" "$0" "$@"
cargo build --release -q -p pagewire-tools --bin pw-workset
bin=target/release/pw-workset
echo "# $(date -u +%FT%TZ) $(uname -sr), $(nproc) cores, $(free -g | awk '/Mem:/ { print $2 }') GiB, swap: $(awk 'NR > 1' /proc/swaps | wc -l) devices, load before: $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/machine.txt"

# Runs pw-workset; removes its cgroups if this script is interrupted (pw-workset removes
# them itself on every other path). Returns pw-workset's status (77: skipped).
pid=
cleanup() {
  if [ -n "$pid" ]; then
    kill "$pid" 2> /dev/null || true
    wait "$pid" 2> /dev/null || true
    for d in /sys/fs/cgroup/memory/pagewire-workset-"$pid"-*; do [ -d "$d" ] && rmdir "$d" 2> /dev/null || true; done
  fi
}
trap cleanup INT TERM
workset() { # OUTFILE ARGS...
  local file=$1; shift
  "$bin" "$@" > "$file" 2>&1 & pid=$!
  local rc=0; wait "$pid" || rc=$?
  pid=
  return "$rc"
}

# 1. Cost per GET of the store's memory, no memory pressure (budget 64 MiB, both working
#    sets 6 MiB), 4 s per configuration.
small=(--budget 64M --overhead 128M --small 6M --large 6M --duration 4 --window 0.5)
rc=0; workset "$out/cost-pindown-anon.txt" --modes pindown "${small[@]}" || rc=$?
if [ "$rc" = 77 ]; then
  cat "$out/cost-pindown-anon.txt"
  echo "skipped: no usable cgroup v1 memory controller" | tee "$out/summary.md"
  exit 0
fi
[ "$rc" = 0 ] || { cat "$out/cost-pindown-anon.txt"; exit "$rc"; }
workset "$out/cost-pindown-file.txt" --modes pindown --pindown-store file "${small[@]}"
workset "$out/cost-odp-anon.txt" --modes odp --odp-store anon "${small[@]}"
workset "$out/cost-odp-file-pagemap.txt" --modes odp --odp-store file "${small[@]}"
PAGEWIRE_SOFT_ODP_CHECK=monitor workset "$out/cost-odp-file-monitor.txt" --modes odp --odp-store file "${small[@]}"
# An anonymous ODP store under the limit: no swap, so the cgroup cannot reclaim it.
rc=0; workset "$out/oom-odp-anon.txt" --modes odp --odp-store anon --budget 64M --overhead 40M \
  --small 6M --large 48M --duration 4 --window 0.5 || rc=$?
echo "# exit status $rc" >> "$out/oom-odp-anon.txt"

# 2. The study.
echo "# load before the study: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
start=$(date +%s)
workset "$out/pw-workset.txt" --duration 60 --raw-dir "$out/raw" --plot "$out/working-set.svg"
echo "# load after the study: $(cut -d' ' -f1-3 /proc/loadavg); $(( $(date +%s) - start )) s" >> "$out/machine.txt"

# The summary.
steady() { awk '/^# mode +store_items/ { on = 1; next } on && NF == 8 { print; next } on { exit }' "$1"; }
ratios() { awk '/^# hit ratio/ { on = 1; next } on && /^# mode/ { next } on && NF == 5 { print; next } on { exit }' "$1"; }
cost() { # FILE: combined hits/s before, and GETs, registrations, NPFs per GET of both servers
  local c; c=$(steady "$1" | awk '{ print $7 }')
  awk -v c="$c" '/^#   server/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] += kv[2] } }
    END { printf "%s | %.2f | %.2f | %.2f", c, v["registrations"] / v["gets"], (v["npf_requester"] + v["npf_responder"]) / v["gets"], v["invalidated_pages"] / v["gets"] }' "$1"
}
{
  echo "# Study 5: dynamic working set (Lesokhin17 §6.1, Fig. 7)"
  echo
  echo "Command: \`tools/bench/working_set.sh $out\`. $(head -1 "$out/machine.txt" | sed 's/^# //')."
  sed -n 's/^# load before the study: /Load before the study: /p; s/^# load after the study: /Load after: /p' "$out/machine.txt"
  echo
  echo "## The study: hits/s in the steady phases"
  echo
  sed -n '1,2p' "$out/pw-workset.txt" | sed 's/^# /- /'
  echo
  echo "Mean hits/s over the second half of each phase (the first halves hold the start and the transition):"
  echo
  echo "| mode | store items | growing: before | growing: after | shrinking: before | shrinking: after | combined: before | combined: after |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
  steady "$out/pw-workset.txt" | awk '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
  echo
  grep '^# combined hits/s, odp / pindown' "$out/pw-workset.txt" | sed 's/^# /- /'
  echo
  echo "Hit ratio (hits / GETs), same phases:"
  echo
  echo "| mode | growing: before | growing: after | shrinking: before | shrinking: after |"
  echo "|---|---:|---:|---:|---:|"
  ratios "$out/pw-workset.txt" | awk '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }'
  echo
  grep -E '^# (pindown|odp): cgroup limit' "$out/pw-workset.txt" | sed 's/^# /- /'
  echo
  echo "Lesokhin17 §6.1 (Fig. 7; its plotted values are not in the text we have): two memcached"
  echo "instances, 20 KB items, 1 GB for both (cgroups), 100 MB <-> 900 MB at 50 s; pinned,"
  echo "500 MB each, \"one of the two instances always suffer\"; with NPFs \"both instances enjoy"
  echo "the same performance\" after \"a short transition period\". Table 5, everything resident:"
  echo "NPF 186 / 311 and pinning 185 / 310 kilo-transactions/s for 1 / 2 instances."
  echo
  echo "## What the store's memory costs per GET, no memory pressure"
  echo
  echo "6 MiB working sets, 64 MiB budget, 4 s per configuration; combined hits/s of both jobs"
  echo "in the steady half before the switch (every GET hits), and per GET on the servers:"
  echo
  echo "| configuration | combined hits/s | registrations per GET | network page faults per GET | present pages invalidated per GET |"
  echo "|---|---:|---:|---:|---:|"
  echo "| pindown, anonymous store (the study's) | $(cost "$out/cost-pindown-anon.txt") |"
  echo "| pindown, file store (long-term pin refused: mlock; not cached) | $(cost "$out/cost-pindown-file.txt") |"
  echo "| odp, anonymous store, memory monitor | $(cost "$out/cost-odp-anon.txt") |"
  echo "| odp, file store, \`PAGEWIRE_SOFT_ODP_CHECK=pagemap\` (the study's) | $(cost "$out/cost-odp-file-pagemap.txt") |"
  echo "| odp, file store, memory monitor (unwatchable: present until the next post) | $(cost "$out/cost-odp-file-monitor.txt") |"
  echo
  echo "An anonymous ODP store under the limit (oom-odp-anon.txt):"
  grep -E '^# odp: cgroup limit|job failed' "$out/oom-odp-anon.txt" | sed 's/^#  */- /' | sort -u
  echo
  echo "Raw outputs: pw-workset.txt (the study, with every window), raw/ (each job's output),"
  echo "cost-*.txt, oom-odp-anon.txt, machine.txt; the plot: working-set.svg."
} > "$out/summary.md"
cat "$out/summary.md"
run_record_end "$out"
