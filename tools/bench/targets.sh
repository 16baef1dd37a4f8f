#!/usr/bin/env bash
# The soft NIC's fast-path targets in one run: pagewire next to MPICH with the same
# binaries (imb-bench and beff built with the `mpi` feature, run under mpirun; pagewire's
# ranks bootstrapped by MPI with the data on the soft NIC, MPICH with --transport mpi), each
# configuration right after the other, 2 ranks. Prints a Markdown table of every target with
# the figures, the ratio and whether it is met, and keeps the raw outputs.
#   - IMB PingPong 8 B (t), Allreduce 8 B and 1 MiB (t_avg), warm;
#   - IMB PingPong and Sendrecv 1 MiB and 4 MiB with -off_cache -1 (MB/s), best zero-copy mode,
#     and odp over copy (PingPong);
#   - b_eff --short --test (MB/s), best mode, and odp over copy;
#   - system calls per 8-byte message (the NIC's own count, pw-msgperf, 10,000 ping-pongs);
#   - Jacobi on 4 ranks on the built-in launcher (seconds; more ranks than cores here).
# Usage: tools/bench/targets.sh [OUTDIR]   (default: target/bench/targets)
# Needs what .ci/mpi.sh installs (mpich, libmpich-dev, libclang-dev, pkg-config).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/targets}
mkdir -p "$out"
source tools/bench/run_record.sh
run_record_start "$out" "$0" "$@"
# Every configuration with one rank bound to each core, as pwrun binds them.
mpirun=(mpirun -bind-to core)
command -v ssh >/dev/null 2>&1 || mpirun+=(-launcher fork)

cargo build --release -q --features mpi -p imb-bench -p beff --target-dir target/mpi
cargo build --release -q --bin pw-msgperf --bin pwrun --example jacobi
imb=target/mpi/release/imb-bench
beff=target/mpi/release/beff
configs=(copy pindown odp mpi)
env_of() { # CONFIG -> the environment selecting it
  if [ "$1" = mpi ]; then echo PAGEWIRE_TRANSPORT=mpi; else echo "PAGEWIRE_MODE=$1"; fi
}

{
  echo "# $(date -u +%FT%TZ) $(uname -sr), $(nproc) cores, memlock $(ulimit -l) KiB, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  mpirun --version | sed -n 1,2p | tr '\n' ' '
  echo
} > "$out/machine.txt"

for c in "${configs[@]}"; do
  env "$(env_of "$c")" timeout 900 "${mpirun[@]}" -np 2 "$imb" PingPong Allreduce \
    -msglog 0:20 --no-progress > "$out/imb-warm-$c.txt"
  env "$(env_of "$c")" timeout 900 "${mpirun[@]}" -np 2 "$imb" PingPong Sendrecv \
    -msglog 20:22 -off_cache -1 --no-progress > "$out/imb-offcache-$c.txt"
  env "$(env_of "$c")" timeout 900 "${mpirun[@]}" -np 2 "$beff" --short --test --seed 1 \
    > "$out/beff-$c.txt" 2> /dev/null
done
for mode in copy pindown odp; do
  PAGEWIRE_MODE=$mode target/release/pw-msgperf pingpong --msglog 3:3 --iters 10000 \
    > "$out/syscalls-$mode.txt"
done
for i in 1 2 3; do
  target/release/pwrun -n 4 target/release/examples/jacobi
done > "$out/jacobi.txt"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

# imb FILE BENCHMARK BYTES COLUMN: a value of an IMB table (COLUMN counted from the right:
# 1 = the last; PingPong's t is 2, Allreduce's t_avg is 1, Mbytes/sec is 1).
imb_value() {
  awk -v b="$2" -v n="$3" -v col="$4" '
    /^# Benchmarking/ { on = ($3 == b) }
    on && $1 == n && NF >= 3 { print $(NF - col + 1); exit }' "$1"
}
beff_value() { awk '/^b_eff/ { print $3; exit }' "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
check() { # VALUE OP LIMIT -> yes/no
  awk -v v="$1" -v l="$3" -v op="$2" 'BEGIN {
    ok = (op == "<=") ? v <= l : v >= l
    print ok ? "yes" : "no" }'
}

row() { # TARGET VALUES RATIO OP LIMIT
  echo "| $1 | $2 | $3 | $4 $5 | $(check "$3" "$4" "$5") |"
}

{
  echo "| target | pagewire / MPICH | ratio | wanted | met |"
  echo "|---|---|---:|---|---|"
  mpi_pp=$(imb_value "$out/imb-warm-mpi.txt" PingPong 8 2)
  read -r v m <<< "$(for x in copy pindown odp; do echo "$(imb_value "$out/imb-warm-$x.txt" PingPong 8 2) $x"; done | sort -g | head -1)"
  row "PingPong 8 B, t (µs), best mode ($m)" "$v / $mpi_pp" "$(ratio "$v" "$mpi_pp")" "<=" 1.5
  for n in 8 1048576; do
    mpi_ar=$(imb_value "$out/imb-warm-mpi.txt" Allreduce "$n" 1)
    read -r v m <<< "$(for x in copy pindown odp; do echo "$(imb_value "$out/imb-warm-$x.txt" Allreduce "$n" 1) $x"; done | sort -g | head -1)"
    limit=1.5; [ "$n" = 8 ] || limit=1.0
    row "Allreduce $n B, t_avg (µs), best mode ($m)" "$v / $mpi_ar" "$(ratio "$v" "$mpi_ar")" "<=" "$limit"
  done
  for b in PingPong Sendrecv; do
    for n in 1048576 4194304; do
      mpi_bw=$(imb_value "$out/imb-offcache-mpi.txt" "$b" "$n" 1)
      read -r v m <<< "$(for x in pindown odp; do echo "$(imb_value "$out/imb-offcache-$x.txt" "$b" "$n" 1) $x"; done | sort -gr | head -1)"
      row "$b $n B off_cache, MB/s, best zero-copy ($m)" "$v / $mpi_bw" "$(ratio "$v" "$mpi_bw")" ">=" 1.0
    done
  done
  for n in 1048576 4194304; do
    o=$(imb_value "$out/imb-offcache-odp.txt" PingPong "$n" 1)
    c=$(imb_value "$out/imb-offcache-copy.txt" PingPong "$n" 1)
    row "PingPong $n B off_cache, odp / copy" "$o / $c" "$(ratio "$o" "$c")" ">=" 1.3
  done
  mpi_b=$(beff_value "$out/beff-mpi.txt")
  read -r v m <<< "$(for x in copy pindown odp; do echo "$(beff_value "$out/beff-$x.txt") $x"; done | sort -gr | head -1)"
  row "b_eff --short --test, MB/s, best mode ($m)" "$v / $mpi_b" "$(ratio "$v" "$mpi_b")" ">=" 0.8
  o=$(beff_value "$out/beff-odp.txt")
  c=$(beff_value "$out/beff-copy.txt")
  row "b_eff --short --test, odp / copy" "$o / $c" "$(ratio "$o" "$c")" ">=" 1.5
  for mode in copy pindown odp; do
    s=$(awk '/^# +8 / { print $NF; exit }' "$out/syscalls-$mode.txt")
    row "system calls per 8 B message ($mode, NIC count)" "$s" "$s" "<=" 0.05
  done
  j=$(awk '/converged/ { t = $(NF - 1); gsub(/[(]/, "", t); if (m == "" || t + 0 > m + 0) m = t } END { print m }' "$out/jacobi.txt")
  row "Jacobi, 4 ranks on $(nproc) cores, slowest of 3 (s)" "$j" "$j" "<=" 0.3
} | tee "$out/targets.md"
cat "$out/machine.txt"
run_record_end "$out"
