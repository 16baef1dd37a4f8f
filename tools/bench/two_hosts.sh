#!/usr/bin/env bash
# Pagewire across two hosts next to MPICH over UCX's tcp transport, in the same
# run: two hosts made of namespaces on this machine (tools/hosts/ns-hosts: each its own
# network, on a veth pair, and its own /dev/shm, PID and mount namespaces). One rank per
# host for PingPong, Sendrecv and b_eff (its short test, 64 MB per process), two per host
# for Allreduce, all under mpiexec started on the first host's network through a stand-in
# for ssh. MPICH runs imb-bench and beff built with the `mpi` feature and `--transport mpi`
# (every call to MPICH, UCX_TLS=tcp,sm,self). Pagewire runs them built without it, `--mode
# M`: hydra starts them and they bootstrap through its PMI-1 server (no MPI in the ranks),
# then move data with the soft NIC, over its TCP wire between the hosts. Every
# configuration runs ROUNDS times, in turn; the median counts.
#
# veth between two namespaces of one 2-CPU machine is not a network: no wire, no NIC, the
# kernel's TCP on both ends sharing two CPUs. The ratios compare two software stacks over
# the same kernel path; they say nothing of a real link.
#
# Usage: tools/bench/two_hosts.sh [OUTDIR] [ROUNDS]  (default: target/bench/two_hosts, 3)
# Needs root (namespaces) and what .ci/mpi.sh installs.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/two_hosts}
rounds=${2:-3}
mkdir -p "$out"
source tools/bench/run_record.sh
run_record_start "$out" "$0" "$@"
rm -f "$out"/*.txt "$out"/*.rows

tools/hosts/ns-hosts check
cargo build --release -q -p imb-bench -p beff --features mpi --target-dir target/mpi
cargo build --release -q -p imb-bench -p beff
id="bh$(( $$ % 100000 ))"
hosts=$(tools/hosts/ns-hosts up "$id")
trap 'tools/hosts/ns-hosts down "$id"' EXIT
configs=(mpi copy pindown odp)

# CONFIG PER_HOST PROGRAM ARGS... : one job, its output on stdout.
job() {
  local config=$1 per_host=$2
  shift 2
  local sel=(--mode "$config") bin=target/release
  [ "$config" = mpi ] && sel=(--transport mpi) && bin=target/mpi/release
  local program=$bin/$1
  shift
  timeout 120 "$hosts/frontend" mpiexec -launcher ssh -launcher-exec "$hosts/rsh" \
    -iface "pw${id}a" -hosts "pw$id-0:$per_host,pw$id-1:$per_host" -n $((2 * per_host)) \
    -genv UCX_TLS tcp,sm,self -genv PAGEWIRE_MEMLOCK_LIMIT unlimited \
    "$program" "$@" "${sel[@]}"
}

{
  echo "# $(date -u +%FT%TZ) $(uname -sr), $(nproc) CPUs, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# two namespaced hosts over veth; $rounds rounds; git $(git rev-parse --short HEAD)"
  mpiexec --version | sed -n 2p
} > "$out/machine.txt"
# MPICH over UCX's tcp transport sometimes hangs in MPI_Finalize after the benchmark has
# printed everything (one rank flushing an endpoint whose peer already waits in the PMI
# barrier; UCX issue 8738): such a job is killed after 120 s, counted, and its output kept.
hung=0
for round in $(seq 1 "$rounds"); do
  for config in "${configs[@]}"; do
    job "$config" 1 imb-bench PingPong Sendrecv -msglog 0:22 -time 1 --no-progress \
      > "$out/imb-$config-r$round.txt" || hung=$((hung + 1))
    job "$config" 2 imb-bench Allreduce -msglog 0:22 -time 1 --no-progress \
      > "$out/allreduce-$config-r$round.txt" || hung=$((hung + 1))
    job "$config" 1 beff --short --test --memory-per-process 64 --seed 1 \
      > "$out/beff-$config-r$round.txt" 2>/dev/null || hung=$((hung + 1))
  done
done
echo "# jobs that did not end by themselves (killed after 120 s): $hung" >> "$out/machine.txt"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

# "BENCHMARK BYTES T_AVG MBPS" rows of an IMB output.
imb_rows() {
  awk '/^# Benchmarking/ { b = $3 }
       /^#----/ { next }
       /^ *[0-9]/ && b != "" {
         if (b == "PingPong") print b, $1, $3, $4
         else if (b == "Sendrecv") print b, $1, $5, $6
         else print b, $1, $5, 0 }' "$1"
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# VALUE of one (config, benchmark, bytes, column: 3 time, 4 MB/s) over the rounds.
value() {
  local config=$1 bench=$2 bytes=$3 col=$4 f
  for f in "$out"/imb-"$config"-r*.txt "$out"/allreduce-"$config"-r*.txt; do
    imb_rows "$f"
  done | awk -v b="$bench" -v n="$bytes" -v c="$col" '$1 == b && $2 == n { print $c }' | median
}
beff_value() {
  local f
  for f in "$out"/beff-"$1"-r*.txt; do
    awk '/^b_eff[A-Z&]* *=/ { print $3; exit }' "$f"
  done | median
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }

{
  cat "$out/machine.txt"
  echo
  echo "| benchmark | size | measure | MPICH (UCX tcp) | copy | pindown | odp | copy/MPICH | pindown/MPICH | odp/MPICH |"
  echo "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"
  row() { # BENCH BYTES COL LABEL SIZE
    local m c p o
    m=$(value mpi "$1" "$2" "$3"); c=$(value copy "$1" "$2" "$3")
    p=$(value pindown "$1" "$2" "$3"); o=$(value odp "$1" "$2" "$3")
    echo "| $1 | $5 | $4 | $m | $c | $p | $o | $(ratio "$c" "$m") | $(ratio "$p" "$m") | $(ratio "$o" "$m") |"
  }
  row PingPong 8 3 "t µs" "8 B"
  row PingPong 65536 3 "t µs" "64 KiB"
  row PingPong 1048576 4 "MB/s" "1 MiB"
  row PingPong 4194304 4 "MB/s" "4 MiB"
  row Sendrecv 8 3 "t µs" "8 B"
  row Sendrecv 1048576 4 "MB/s" "1 MiB"
  row Sendrecv 4194304 4 "MB/s" "4 MiB"
  row Allreduce 8 3 "t µs" "8 B"
  row Allreduce 65536 3 "t µs" "64 KiB"
  row Allreduce 1048576 3 "t µs" "1 MiB"
  m=$(beff_value mpi); c=$(beff_value copy); p=$(beff_value pindown); o=$(beff_value odp)
  echo "| b_eff | - | MB/s | $m | $c | $p | $o | $(ratio "$c" "$m") | $(ratio "$p" "$m") | $(ratio "$o" "$m") |"
} > "$out/summary.md"
cat "$out/summary.md"
run_record_end "$out"
