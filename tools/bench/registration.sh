#!/usr/bin/env bash
# The registration targets (odp against pindown-hpc, pindown against copy) in one run, on the built-in launcher and the soft NIC, 2 ranks:
#   - IMB PingPong and Sendrecv 1 MiB and 4 MiB with -off_cache -1, `imb-bench --mode all`:
#     odp / pindown with the memlock limit lifted (HPC), and each over copy;
#   - b_eff --short --test, `beff --mode all`, three runs (the median of each mode): the same
#     ratios;
#   - the bound on the zero-copy gain: the raw NIC's 1 MiB RDMA READ next to a memcpy;
#   - the tight world (the machine's `ulimit -l`): pindown's miss cost per 64 KiB and 1 MiB
#     registration with long-term pins (PAGEWIRE_PIN=longterm) next to mlock's
#     (PAGEWIRE_PIN=mlock), from pw-msgperf's counters, off-cache over 32 MiB;
#   - warm PingPong 1 MiB (one buffer reused): odp / pindown(HPC).
# Prints a Markdown table of every target with the figures, the ratio and whether it is met,
# and keeps the raw outputs.
# Usage: tools/bench/registration.sh [OUTDIR]   (default: target/bench/registration)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/registration}
mkdir -p "$out"
source tools/bench/run_record.sh
run_record_start "$out" "$0" "$@"
cargo build --release -q -p imb-bench -p beff -p pagewire-tools --bin imb-bench --bin beff --bin pw-msgperf --bin pwrun
{
  echo "# $(date -u +%FT%TZ) $(uname -sr), $(nproc) cores, memlock $(ulimit -l) KiB, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/machine.txt"

# IMB's default volume (40 MiB per size) gives a 4 MiB message 10 repetitions, too few on a
# shared 2-core machine; 1 GiB per size gives it 256 (IMB's own `-iter` flag).
target/release/imb-bench --mode all PingPong Sendrecv -msglog 16:22 -off_cache -1 \
  -iter 1000,1024 --no-progress > "$out/imb-offcache.txt"
# b_eff --short --test measures for under a second: three runs, the median of each mode.
for i in 1 2 3; do
  target/release/beff --mode all --short --test --seed 1 > "$out/beff-$i.txt" 2> /dev/null
done
# What bounds the zero-copy gain on this NIC: the raw NIC's RDMA READ of 1 MiB (one kernel
# copy between the two ranks' address spaces) next to a same-run memcpy of 1 MiB.
target/release/pw-perftest read_lat -s 1048576 > "$out/read-lat.txt" 2> /dev/null
for pin in longterm mlock; do
  PAGEWIRE_PIN=$pin PAGEWIRE_MODE=pindown target/release/pw-msgperf pingpong --msglog 16:20 \
    --off-cache 32M > "$out/tight-$pin.txt"
done
for mode in pindown odp; do
  PAGEWIRE_MEMLOCK_LIMIT=unlimited PAGEWIRE_MODE=$mode target/release/pw-msgperf pingpong \
    --msglog 20:20 --iters 2000 > "$out/warm-$mode.txt"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

# side BENCHMARK BYTES COLUMN: a value of imb-bench's side-by-side (COLUMN 1 = #bytes).
side() {
  awk -v b="$1" -v n="$2" -v col="$3" '
    /^# [A-Za-z]+ #processes/ { on = ($2 == b) }
    on && $1 == "#" && $2 == n { print $(col + 1); exit }' "$out/imb-offcache.txt"
}
# beff_col COLUMN: the median over the three runs of a b_eff side-by-side column.
beff_col() {
  for i in 1 2 3; do
    awk -v col="$1" '$1 == "#" && $2 == "b_eff" { print $(col + 2); exit }' "$out/beff-$i.txt"
  done | sort -g | sed -n 2p
}
# msgperf FILE BYTES FIELD: t[usec] (3) or Mbytes/sec (4) of a pw-msgperf table row;
# counters FILE BYTES FIELD: a counters column (#bytes is 1, reg[usec] 11).
msgperf() { awk -v n="$2" -v f="$3" '$1 == n && NF == 4 { print $f; exit }' "$1"; }
counters() { awk -v n="$2" -v f="$3" '/^# counters/ { on = 1 } on && $2 == n { print $(f + 1); exit }' "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
within() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { print (v >= lo && v <= hi) ? "yes" : "no" }'; }
atleast() { awk -v v="$1" -v l="$2" 'BEGIN { print (v >= l) ? "yes" : "no" }'; }

{
  echo "| target | figures | ratio | wanted | met |"
  echo "|---|---|---:|---|---|"
  # Columns of the side-by-side: copy, pindown-hpc, pindown-<tight>, odp.
  for b in PingPong Sendrecv; do
    for n in 1048576 4194304; do
      c=$(side "$b" "$n" 2); h=$(side "$b" "$n" 3); o=$(side "$b" "$n" 5)
      r=$(ratio "$o" "$h")
      echo "| $b $n B off_cache, odp / pindown-hpc (MB/s) | $o / $h | $r | 0.9–1.1 | $(within "$r" 0.9 1.1) |"
      r=$(ratio "$h" "$c")
      echo "| $b $n B off_cache, pindown-hpc / copy | $h / $c | $r | ≥ 1.3 | $(atleast "$r" 1.3) |"
      r=$(ratio "$o" "$c")
      echo "| $b $n B off_cache, odp / copy | $o / $c | $r | ≥ 1.3 | $(atleast "$r" 1.3) |"
    done
  done
  c=$(beff_col 1); h=$(beff_col 2); o=$(beff_col 4)
  r=$(ratio "$o" "$h")
  echo "| b_eff --short --test, odp / pindown-hpc (MB/s) | $o / $h | $r | 0.9–1.1 | $(within "$r" 0.9 1.1) |"
  r=$(ratio "$h" "$c")
  echo "| b_eff, pindown-hpc / copy | $h / $c | $r | ≥ 1.5 | $(atleast "$r" 1.5) |"
  r=$(ratio "$o" "$c")
  echo "| b_eff, odp / copy | $o / $c | $r | ≥ 1.5 | $(atleast "$r" 1.5) |"
  # pw-perftest's row: #bytes, iterations, t_min, t_max, t_typical (5), ..., memcpy (10).
  read -r cma cpy < <(awk '$1 == 1048576 { print $5, $10; exit }' "$out/read-lat.txt")
  bound=$(awk -v c="$cma" -v m="$cpy" 'BEGIN { printf "%.2f", (2 * m + c) / c }')
  echo "| bound: copy mode's serial cost over zero-copy at 1 MiB, (2 memcpy + CMA) / CMA, µs | $cpy / $cma | $bound | reported | - |"
  for n in 65536 1048576; do
    l=$(counters "$out/tight-longterm.txt" "$n" 11); m=$(counters "$out/tight-mlock.txt" "$n" 11)
    echo "| tight world: pindown registration (miss) at $n B, µs, long-term pin / mlock | $l / $m | $(ratio "$l" "$m") | reported | - |"
    l=$(msgperf "$out/tight-longterm.txt" "$n" 4); m=$(msgperf "$out/tight-mlock.txt" "$n" 4)
    echo "| tight world: pindown PingPong $n B off-cache 32M, MB/s, long-term / mlock | $l / $m | $(ratio "$l" "$m") | reported | - |"
  done
  o=$(msgperf "$out/warm-odp.txt" 1048576 4); p=$(msgperf "$out/warm-pindown.txt" 1048576 4)
  r=$(ratio "$o" "$p")
  echo "| warm PingPong 1 MiB, odp / pindown-hpc (MB/s) | $o / $p | $r | ≥ 0.95 | $(atleast "$r" 0.95) |"
} | tee "$out/targets.md"
cat "$out/machine.txt"
run_record_end "$out"
