#!/usr/bin/env bash
# What-if study: a bounded NIC translation cache (Azimi03, "dynamic handle lookup").
# The soft NIC's `tpt-cache` profile (PAGEWIRE_SOFT_TPT_CACHE=N: N entries, 4-way LRU, one per
# key; a miss drops the request, the owner's driver thread fills the entry after a modelled
# 5-500 us processing time, the initiator retransmits) swept over the cache size against the
# cache off (the default: the NIC reads its table directly), on
#   - IMB PingPong and Allreduce, 2 ranks, 0 B .. 1 MiB, -off_cache -1 (every repetition on
#     another buffer of a 16 MiB span, so a zero-copy mode names many registrations);
#   - b_eff --short --test with 8 MB per process (messages up to 64 KiB), seed 1;
# in the pindown buffer mode (each user buffer its own registration, its own key), with the
# memlock limit lifted so that no transfer falls back to copying. The copy and odp modes,
# whose transfers name a handful of keys, are run once at the smallest size for comparison.
# Every configuration runs 5 times, the configurations taking turns (so that a change of the
# machine's load touches all alike), and the best of the 5 counts: per message size the least
# t_avg, and the highest b_eff. The cache-off configuration is run twice over: the second
# ("off-again") shows the noise left in the slowdown figures.
# Slowdown = time with the cache / time with it off in this run of the script: IMB's is the
# geometric mean over the message sizes of t_avg ratios (and the largest ratio); b_eff's is
# b_eff(off) / b_eff(cache). Miss rate = misses / lookups summed over both ranks' caches and
# the 5 runs (warm-up included).
# Prints a Markdown table (summary.md) beside the raw outputs (raw.tar.gz) and two plots
# (slowdown.svg, miss-rate.svg; their points in sweep.txt).
# Usage: tools/bench/tpt_cache.sh [OUTDIR]   (default: target/bench/tpt-cache)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/tpt-cache}
mkdir -p "$out"
source tools/bench/run_record.sh
run_record_start "$out" "$0" "$@"
cargo build --release -q -p imb-bench -p beff -p pagewire-tools --bin pw-plot
echo "# $(date -u +%FT%TZ) $(uname -sr), $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/machine.txt"
export PAGEWIRE_MEMLOCK_LIMIT=unlimited
sizes="4 16 64 256 1024 4096"

reps="1 2 3 4 5"
rm -rf "$out/raw" "$out/raw.tar.gz"
mkdir -p "$out/raw"

# run KIND NAME ENTRIES MODE REP: one benchmark run into $out/raw/KIND-NAME-rREP.txt (stdout
# and stderr: the NIC names its profile and prints its cache's counters there).
run() {
  local kind=$1 name=$2 entries=$3 mode=$4 f="$out/raw/$1-$2-r$5.txt"
  echo "# PAGEWIRE_SOFT_TPT_CACHE=$entries, buffer mode $mode ($([ "$entries" = 0 ] &&
    echo "profile real: the translation cache off" || echo "profile real + tpt-cache: $entries entries, modelled miss processing from Azimi03"))" > "$f"
  if [ "$kind" = imb ]; then
    PAGEWIRE_SOFT_TPT_CACHE=$entries target/release/imb-bench PingPong Allreduce --mode "$mode" \
      -off_cache -1 -msglog 0:20 --iter 200 --time 1 --no-progress >> "$f" 2>&1
  else
    PAGEWIRE_SOFT_TPT_CACHE=$entries target/release/beff --short --test --memory-per-process 8 \
      --mode "$mode" --seed 1 >> "$f" 2>&1
  fi
}
for r in $reps; do
  for kind in imb beff; do
    run "$kind" off 0 pindown "$r"
    for n in $sizes; do run "$kind" "$n" "$n" pindown "$r"; done
    run "$kind" off-again 0 pindown "$r"
  done
  for mode in copy odp; do
    run imb "$mode-off" 0 "$mode" "$r"
    run imb "$mode-4" 4 "$mode" "$r"
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

# times KIND-NAME: "BENCHMARK BYTES T_AVG" for every row of IMB's tables, the least of the runs.
times() {
  awk '/^# Benchmarking/ { b = $3 } /^ +[0-9]+ +[0-9]+ +[0-9.]+/ && b != "" {
    t = (NF == 4 ? $3 : $5); k = b " " $1; if (!(k in best) || t < best[k]) best[k] = t }
    END { for (k in best) print k, best[k] }' "$out"/raw/"$1"-r*.txt
}
# slowdown OFF OTHER BENCHMARK: "GEOMEAN MAX" of the per-size time ratios OTHER / OFF.
slowdown() {
  awk -v want="$3" 'NR == FNR { if ($1 == want) off[$2] = $3; next }
    $1 == want && off[$2] > 0 && $3 > 0 { r = $3 / off[$2]; s += log(r); n++; if (r > m) m = r }
    END { if (n) printf "%.3f %.2f\n", exp(s / n), m; else print "- -" }' \
    <(times "$1") <(times "$2")
}
# cache KIND-NAME: "LOOKUPS MISSES MISS% STALL_MS PENALTY_US WAIT_US MODEL_US", both ranks and
# the runs summed (penalty: stall per miss; wait and processing: per fill).
cache() {
  awk '/tpt-cache [0-9]+ entries:/ { h += $7; m += $9; f += $11; w += $14; p += $18; s += $22 }
    END { if (h + m == 0) { print "- - - - - - -"; exit }
      printf "%d %d %.2f %.1f %.0f %.1f %.1f\n", h + m, m, 100 * m / (h + m), s / 1e6,
        (m ? s / m / 1e3 : 0), (f ? w / f / 1e3 : 0), (f ? p / f / 1e3 : 0) }' "$out"/raw/"$1"-r*.txt
}
# beff NAME: b_eff in MB/s, the highest of the runs.
beff() {
  awk '/^b_eff[A-Z&]* = / && !seen[FILENAME]++ && $3 > m { m = $3 } END { print m }' \
    "$out"/raw/beff-"$1"-r*.txt
}

{
  echo "Profile: real + tpt-cache (PAGEWIRE_SOFT_TPT_CACHE = entries; a miss's processing time is modelled from Azimi03, its delay and the retransmission are real); buffer mode pindown unless said; 2 ranks; $(head -1 "$out/machine.txt" | cut -c3-)."
  echo
  echo "| entries | IMB lookups | IMB misses | IMB miss rate | PingPong slowdown (geo. mean / max) | Allreduce slowdown (geo. mean / max) | b_eff miss rate | b_eff [MB/s] | b_eff slowdown | stall per miss µs | fill: wait µs (real) + processing µs (modelled) |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  b_off=$(beff off)
  for name in off off-again $sizes; do
    read -r lookups misses rate stall penalty wait model < <(cache "imb-$name")
    read -r _ _ brate _ _ _ _ < <(cache "beff-$name")
    read -r pg pm < <(slowdown imb-off "imb-$name" PingPong)
    read -r ag am < <(slowdown imb-off "imb-$name" Allreduce)
    b=$(beff "$name")
    bs=$(awk -v a="$b_off" -v b="$b" 'BEGIN { printf "%.3f", a / b }')
    pct() { [ "$1" = - ] && echo - || echo "$1 %"; }
    fill=$([ "$wait" = - ] && echo - || echo "$wait + $model")
    echo "| $name | $lookups | $misses | $(pct "$rate") | $pg / $pm | $ag / $am | $(pct "$brate") | $b | $bs | $penalty | $fill |"
  done
  for mode in copy odp; do
    read -r lookups misses rate _ penalty wait model < <(cache "imb-$mode-4")
    read -r pg pm < <(slowdown "imb-$mode-off" "imb-$mode-4" PingPong)
    read -r ag am < <(slowdown "imb-$mode-off" "imb-$mode-4" Allreduce)
    echo "| 4, mode $mode | $lookups | $misses | $rate % | $pg / $pm | $ag / $am | | | | $penalty | $wait + $model |"
  done
  echo
  echo "Azimi03 (miNI on VMMC, Myrinet LANai9, 4 nodes, SPLASH-2 on the GeNIMA SVM protocol), VMH lookup cache of C = 8K-32K entries, lines of 8-128 entries, 2-8 ways:"
  echo
  echo "| Azimi03 | figure |"
  echo "|---|---|"
  echo "| miss rate, WaterNsquared, WaterSpatial, Ocean, Raytrace, Volrend (Fig. 5) | 0-2 % |"
  echo "| miss rate, FFT, LUContiguous, Radix (Fig. 5) | up to ~40 %, halved by doubling C at L128 |"
  echo "| execution time, best cache (C16K L64 A4, ~75 KB of NIC memory) vs static tables (Fig. 7) | at most +3 % for all but Radix |"
  echo "| miss delay (interrupt to handler) / miss processing (section V C) | 0-50 µs / 5-500 µs |"
  echo "| micro-benchmark (ping-pong, Fig. 4) | latency grows linearly and bandwidth falls fast with the miss ratio, more for larger messages |"
} | tee "$out/summary.md"

# Plots: slowdown and miss rate against the cache size.
{
  for name in $sizes; do
    read -r _ _ rate _ _ _ _ < <(cache "imb-$name")
    read -r _ _ brate _ _ _ _ < <(cache "beff-$name")
    read -r pg _ < <(slowdown imb-off "imb-$name" PingPong)
    read -r ag _ < <(slowdown imb-off "imb-$name" Allreduce)
    bs=$(awk -v a="$(beff off)" -v b="$(beff "$name")" 'BEGIN { printf "%.3f", a / b }')
    echo "$name $rate $brate $pg $ag $bs"
  done
} > "$out/sweep.txt"
target/release/pw-plot --title "Translation cache (Azimi03): slowdown against the cache off, pindown mode" \
  --x-label "cache entries" --y-label "time / time with the cache off" --out "$out/slowdown.svg" \
  "IMB PingPong=$out/sweep.txt:1:4" "IMB Allreduce=$out/sweep.txt:1:5" "b_eff=$out/sweep.txt:1:6" \
  "Azimi03: +3 % (tuned)=4:1.03,4096:1.03"
target/release/pw-plot --title "Translation cache (Azimi03): miss rate, pindown mode" \
  --x-label "cache entries" --y-label "misses per lookup [%]" --out "$out/miss-rate.svg" \
  "IMB PingPong+Allreduce=$out/sweep.txt:1:2" "b_eff=$out/sweep.txt:1:3" \
  "Azimi03 Fig. 5: 2 % (most applications)=4:2,4096:2"
# The raw outputs (100 files, 1 MB) go into one archive: tar xzf raw.tar.gz to read them.
tar czf "$out/raw.tar.gz" -C "$out" raw && rm -r "$out/raw"
cat "$out/machine.txt"
run_record_end "$out"
