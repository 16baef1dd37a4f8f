#!/usr/bin/env bash
# What the starter costs: the same pagewire jobs across the two namespaced hosts of
# tools/hosts/ns-hosts started by Slurm's `srun --mpi=pmi2` (tools/hosts/slurm) and by
# `pwrun --hosts`, alternating, ROUNDS rounds; and the start-up of a 4-task job under the
# same srun, pagewire's hello (examples/hello.rs) next to MPICH's C hello world (MPI_Init,
# MPI_Comm_rank, printf, MPI_Finalize; built with mpicc.mpich), STARTS times each, in turn.
#
#   - IMB PingPong (one rank per host), Allreduce (two per host) and b_eff's short test (one
#     per host, 64 MB per process), default configuration (ranks of one host through shared
#     memory, the soft NIC's TCP wire between hosts). Neither starter binds ranks here
#     (`pwrun --bind-to none`; Slurm's task/none): the hosts share this machine's two CPUs,
#     and one rank per host bound to "core 0" of each would be the same core;
#   - the ratio srun/pwrun of each median (time; b_eff: pwrun over srun, so above 1 is
#     slower under srun either way); the start-up ratio pagewire/MPICH of the medians.
#
# veth between two namespaces of one 2-CPU machine is not a network; both starters run the
# same binaries over it, so the ratios compare the starters, nothing else.
#
# Usage: tools/bench/starters.sh [OUTDIR]  (default target/bench/starters)
# Settings: ROUNDS (default 3), STARTS (default 10; 0 leaves the start-ups out), BENCHES
# (default "pingpong allreduce beff": which jobs). Needs root, Slurm and MPICH (what
# .ci/slurm.sh and .ci/mpi.sh install).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/starters}
rounds=${ROUNDS:-3}
starts=${STARTS:-10}
benches=${BENCHES:-pingpong allreduce beff}
runs() { [[ " $benches " == *" $1 "* ]]; }
mkdir -p "$out"
source tools/bench/run_record.sh
run_record_start "$out" "$0" "$@"
rm -f "$out"/*.txt

tools/hosts/ns-hosts check
tools/hosts/slurm check
command -v mpicc.mpich >/dev/null || { echo "starters: needs MPICH's mpicc (.ci/mpi.sh)" >&2; exit 1; }
cargo build --release -q --bin pwrun --example hello
cargo build --release -q -p imb-bench -p beff
bin=$PWD/target/release
hello=target/bench/hello_mpich
mkdir -p target/bench
cat > "$hello.c" <<'C'
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
  int rank, size, len;
  char name[MPI_MAX_PROCESSOR_NAME];
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Get_processor_name(name, &len);
  printf("hello from rank %d of %d on %s\n", rank, size, name);
  MPI_Finalize();
  return 0;
}
C
mpicc.mpich -O2 "$hello.c" -o "$hello"

id="st$(( $$ % 100000 ))"
hosts_dir=$(tools/hosts/ns-hosts up "$id")
trap 'tools/hosts/slurm down "$id" || true; tools/hosts/ns-hosts down "$id"' EXIT
slurm_dir=$(tools/hosts/slurm up "$id")
h0=pw$id-0
h1=pw$id-1

# STARTER PER_HOST PROGRAM ARGS...: one job across both hosts, its output on stdout.
job() {
  local starter=$1 per_host=$2
  shift 2
  if [ "$starter" = srun ]; then
    timeout 300 "$slurm_dir/run" srun -N 2 -n $((2 * per_host)) --mpi=pmi2 "$@"
  else
    PAGEWIRE_RSH=$hosts_dir/rsh timeout 300 "$bin/pwrun" --bind-to none \
      --hosts "$h0:$per_host,$h1:$per_host" "$@"
  fi
}

{
  echo "# $(date -u +%FT%TZ) $(uname -sr), $(nproc) CPUs; two namespaced hosts over veth"
  echo "# $rounds rounds, $starts start-ups each; git $(git rev-parse --short HEAD)"
  echo "# $(slurmd -V), $(mpichversion | sed -n 1p | tr -s '[:space:]' ' ')"
} > "$out/machine.txt"
for round in $(seq 1 "$rounds"); do
  for starter in srun pwrun; do
    if runs pingpong; then
      job "$starter" 1 "$bin/imb-bench" PingPong -msglog 0:22 -time 1 --no-progress \
        > "$out/pingpong-$starter-r$round.txt"
    fi
    if runs allreduce; then
      job "$starter" 2 "$bin/imb-bench" Allreduce -npmin 4 -msglog 0:22 -time 1 --no-progress \
        > "$out/allreduce-$starter-r$round.txt"
    fi
    if runs beff; then
      job "$starter" 1 "$bin/beff" --short --test --memory-per-process 64 --seed 1 \
        > "$out/beff-$starter-r$round.txt" 2>/dev/null
    fi
  done
done

# Start-up: wall time of the whole srun, in ms.
for i in $(seq 1 "$starts"); do
  for prog in pagewire mpich; do
    p=$bin/examples/hello
    [ "$prog" = mpich ] && p=$PWD/$hello
    t0=$(date +%s%N)
    timeout 120 "$slurm_dir/run" srun -N 2 -n 4 --mpi=pmi2 "$p" > "$out/hello-$prog-$i.out"
    echo $(( ($(date +%s%N) - t0) / 1000000 )) >> "$out/startup-$prog.txt"
    [ "$(grep -c '^hello from rank' "$out/hello-$prog-$i.out")" = 4 ] ||
      { echo "starters: $prog's hello did not print 4 lines" >&2; exit 1; }
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
range() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { print lo "-" hi }'; }
# t_avg (PingPong: column 3; Allreduce: column 5) of BYTES in FILES...
imb_time() {
  local bytes=$1
  shift
  awk -v n="$bytes" '/^# Benchmarking/ { b = $3 } /^ *[0-9]/ && $1 == n {
    print (b == "PingPong") ? $3 : $5 }' "$@"
}
beff_of() { awk '/^b_eff[A-Z&]* *=/ { print $3; exit }' "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }

{
  cat "$out/machine.txt"
  echo
  echo "| benchmark | size | pwrun --hosts (µs, median) | srun --mpi=pmi2 (µs, median) | srun/pwrun |"
  echo "|---|---:|---:|---:|---:|"
  for bench in pingpong allreduce; do
    runs "$bench" || continue
    for bytes in 0 8 1024 65536 1048576 4194304; do
      p=$(for f in "$out"/$bench-pwrun-r*.txt; do imb_time "$bytes" "$f"; done | median)
      s=$(for f in "$out"/$bench-srun-r*.txt; do imb_time "$bytes" "$f"; done | median)
      echo "| $bench | $bytes | $p | $s | $(ratio "$s" "$p") |"
    done
  done
  if runs beff; then
    p=$(for f in "$out"/beff-pwrun-r*.txt; do beff_of "$f"; done | median)
    s=$(for f in "$out"/beff-srun-r*.txt; do beff_of "$f"; done | median)
    echo "| b_eff (MB/s) | - | $p | $s | $(ratio "$p" "$s") |"
    echo "| b_eff each round, pwrun | | $(for f in "$out"/beff-pwrun-r*.txt; do beff_of "$f"; done | tr '\n' ' ') | | |"
    echo "| b_eff each round, srun | | | $(for f in "$out"/beff-srun-r*.txt; do beff_of "$f"; done | tr '\n' ' ') | |"
  fi
  if [ "$starts" -gt 0 ]; then
    echo
    echo "| start-up of 4 tasks on 2 nodes under srun --mpi=pmi2 | median ms | range ms |"
    echo "|---|---:|---:|"
    pw=$(median < "$out/startup-pagewire.txt")
    mp=$(median < "$out/startup-mpich.txt")
    echo "| pagewire (examples/hello) | $pw | $(range < "$out/startup-pagewire.txt") |"
    echo "| MPICH 4.0.2 (C hello world) | $mp | $(range < "$out/startup-mpich.txt") |"
    echo "| pagewire/MPICH | $(ratio "$pw" "$mp") | |"
  fi
} > "$out/summary.md"
cat "$out/summary.md"
run_record_end "$out"
