#!/usr/bin/env bash
# Pagewire next to MPICH: one binary, pw-collbench built with the `mpi` feature, run under
# mpirun on pagewire's transport on its default local path (shared memory between ranks of
# one host) and in each buffer mode with local traffic through the soft NIC (copy, pindown,
# odp; ranks bootstrapped by MPI) and on the mpi transport (every call forwarded
# to the host MPI library, here Debian's MPICH). Prints a Markdown table of times (t_avg,
# microseconds) and of pagewire's time over MPICH's.
#   Allreduce (f32 sum) and Bcast on 2 and 4 ranks at 8 B, 64 KiB, 1 MiB, 4 MiB;
#   PingPong (half a round trip) on 2 ranks at 8 B and 1 MiB.
# Usage: tools/bench/side_by_side.sh [OUTDIR]   (default: target/bench/side_by_side)
# Needs what .ci/mpi.sh installs (mpich, libmpich-dev, libclang-dev, pkg-config).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/side_by_side}
mkdir -p "$out"
source tools/bench/run_record.sh
run_record_start "$out" "$0" "$@"
mpirun=(mpirun)
command -v ssh >/dev/null 2>&1 || mpirun+=(-launcher fork)

cargo build --release -q --features pagewire/mpi -p pagewire-collectives --example pw-collbench \
  --target-dir target/mpi
bench=target/mpi/release/examples/pw-collbench
configs=(local copy pindown odp mpi)

run() { # CONFIG NP ARGS... -> the benchmark's output in $out/CONFIG-npNP-KERNELS.txt
  local config=$1 np=$2
  shift 2
  # The buffer modes govern the NIC path: their runs send local traffic through it; `local`
  # is the default path between ranks of one host (shared memory and CMA).
  local env=(PAGEWIRE_MODE="$config" PAGEWIRE_LOCAL=nic)
  [ "$config" = local ] && env=(PAGEWIRE_MODE=copy PAGEWIRE_LOCAL=shm)
  [ "$config" = mpi ] && env=(PAGEWIRE_TRANSPORT=mpi)
  env "${env[@]}" timeout 600 "${mpirun[@]}" -np "$np" "$bench" "$@" \
    > "$out/$config-np$np-${*: -1}.txt"
}

{
  echo "# $(date -u +%FT%TZ) $(uname -sr), $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  mpirun --version | sed -n 1,2p | tr '\n' ' '
  echo
} > "$out/machine.txt"
for np in 2 4; do
  for config in "${configs[@]}"; do
    run "$config" "$np" --sizes 8,64K,1M,4M allreduce bcast
  done
done
for config in "${configs[@]}"; do
  run "$config" 2 --sizes 8,1M pingpong
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

# "KERNEL NP BYTES T_AVG" from one output file.
rows() {
  awk -v np="$2" '/^# Benchmarking/ { k = $3 } /^ *[0-9]/ { print k, np, $1, $5 }' "$1"
}
for config in "${configs[@]}"; do
  for np in 2 4; do
    for f in "$out/$config-np$np-"*.txt; do
      [ -e "$f" ] && rows "$f" "$np"
    done
  done | sort > "$out/$config.rows"
done

{
  echo "| kernel | ranks | size | local µs | copy µs | pindown µs | odp µs | MPICH µs | local/MPICH | copy/MPICH | pindown/MPICH | odp/MPICH |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  join -j1 <(awk '{print $1"/"$2"/"$3, $4}' "$out/local.rows" | sort) \
           <(awk '{print $1"/"$2"/"$3, $4}' "$out/copy.rows" | sort) |
    join -j1 - <(awk '{print $1"/"$2"/"$3, $4}' "$out/pindown.rows" | sort) |
    join -j1 - <(awk '{print $1"/"$2"/"$3, $4}' "$out/odp.rows" | sort) |
    join -j1 - <(awk '{print $1"/"$2"/"$3, $4}' "$out/mpi.rows" | sort) |
    tr '/' ' ' |
    awk '{
      order = ($1 == "allreduce") ? 1 : ($1 == "bcast") ? 2 : 3
      printf "%d %d %012d %s\n", order, $2, $3, $0
    }' | sort -k1,1n -k2,2n -k3,3n | cut -d' ' -f4- |
    while read -r kernel np bytes local copy pindown odp mpi; do
      case $bytes in
        8) size="8 B" ;; 65536) size="64 KiB" ;; 1048576) size="1 MiB" ;; 4194304) size="4 MiB" ;;
        *) size="$bytes B" ;;
      esac
      ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
      name=$kernel
      [ "$kernel" = pingpong ] && name="PingPong"
      [ "$kernel" = allreduce ] && name="Allreduce"
      [ "$kernel" = bcast ] && name="Bcast"
      echo "| $name | $np | $size | $local | $copy | $pindown | $odp | $mpi | $(ratio "$local" "$mpi") | $(ratio "$copy" "$mpi") | $(ratio "$pindown" "$mpi") | $(ratio "$odp" "$mpi") |"
    done
} | tee "$out/table.md"
cat "$out/machine.txt"
run_record_end "$out"
