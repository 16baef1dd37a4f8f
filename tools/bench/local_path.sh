#!/usr/bin/env bash
# Pagewire's local path next to MPICH (and Open MPI) on one host: the same binaries,
# imb-bench and beff built with the `mpi` feature, on 2 ranks in three or four
# configurations:
#   mpich  mpirun -np 2 -bind-to core BIN --transport mpi   (every call to the host MPICH)
#   ompi   mpirun.openmpi -np 2 --bind-to core BIN --transport mpi, the binaries built
#          against Open MPI (MPICC=mpicc.openmpi, target/ompi): where Debian's openmpi-bin
#          and libopenmpi-dev are installed beside MPICH (OMPI=0 leaves it out)
#   local  pwrun -n 2 --bind-to core BIN, PAGEWIRE_LOCAL=shm (shared memory + CMA, default)
#   nic    the same with PAGEWIRE_LOCAL=nic PAGEWIRE_MODE=copy (local traffic on the soft NIC)
# Benchmarks: imb-bench's IMB_BENCHMARKS -msglog 0:22, warm and with -off_cache -1;
# examples/rsmpi_api (one program written against rsmpi's API: ping-pong, send_receive_into,
# all_reduce_into), on rsmpi itself over MPICH (`--api rsmpi` under mpirun: no pagewire code at
# all) and on pagewire (`--api pagewire` under pwrun); beff --short --test
# --memory-per-process 128 (the reference run's settings).
# The three configurations alternate, benchmark by benchmark, for ROUNDS rounds (the order
# rotates each round). Every raw output is kept in OUTDIR as CONFIG-BENCH-rROUND.txt (stderr
# in .err when not empty), with machine.txt; tools/bench/local_path_table.py then prints a
# Markdown table (also OUTDIR/summary.md): MPICH's time, median over the rounds, and for
# local and nic the ratio pagewire/MPICH as median (min-max) of the rounds' ratios (time:
# below 1 = pagewire faster; b_eff MB/s: above 1 = pagewire better), and, over every size
# measured, how many medians are above MPICH's and which rows are above it in every round.
# rows.tsv has every figure.
# About 1 minute per round on 2 cores after the build.
#
# Usage: tools/bench/local_path.sh [OUTDIR]   (default: target/bench/local_path)
# Environment (defaults in brackets):
#   ROUNDS [3]            rounds of the three configurations
#   MSGLOG [0:22]         imb-bench -msglog (e.g. 0:16 for a quick check)
#   IMB_BENCHMARKS [PingPong Sendrecv Exchange Allreduce Bcast Alltoall]
#   NP [2]                ranks (4 on this 2-core machine: oversubscribed; IMB's -npmin NP)
#   IMB_ARGS []           more imb-bench flags, e.g. "-iter 200" or "-time 2"
#   BEFF_ARGS [--short --test --memory-per-process 128]
#   SIZES [0,8,1K,64K,1M,4M]  sizes in the table (K/M suffixes), or `all`
#   API [1]               0: leave out the rsmpi-API program
#   OMPI [auto]           1: Open MPI too (fails without mpirun.openmpi), 0: not, auto: if
#                         mpirun.openmpi is installed
#   TIMEOUT [300]         seconds per run before it is stopped (counted as failed)
#   BUILD [1]             0: use the binaries already built (target/mpi, target/release)
# Needs what .ci/mpi.sh installs (mpich, libmpich-dev, libclang-dev, pkg-config) and python3.
# Exit status 1 when a run failed (its row then lacks that configuration; see failures.txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/local_path}
rounds=${ROUNDS:-3}
msglog=${MSGLOG:-0:22}
read -r -a imb_benchmarks <<< "${IMB_BENCHMARKS:-PingPong Sendrecv Exchange Allreduce Bcast Alltoall}"
np=${NP:-2}
read -r -a imb_extra <<< "${IMB_ARGS:-}"
read -r -a beff_args <<< "${BEFF_ARGS:---short --test --memory-per-process 128}"
sizes=${SIZES:-0,8,1K,64K,1M,4M}
limit=${TIMEOUT:-300}
mkdir -p "$out"
source tools/bench/run_record.sh
run_record_start "$out" "$0" "$@"
# Raw outputs of an earlier run in this directory must not mix with this one's.
rm -f "$out"/{mpich,ompi,local,nic}-*-r*.txt "$out"/{mpich,ompi,local,nic}-*-r*.err \
  "$out"/failures.txt "$out"/summary.md "$out"/rows.tsv
# MPICH by its own names where Debian gives them (installing Open MPI beside it makes
# Open MPI the default `mpirun` and `mpicc`).
mpirun=(mpirun)
command -v mpirun.mpich >/dev/null 2>&1 && mpirun=(mpirun.mpich)
command -v ssh >/dev/null 2>&1 || mpirun+=(-launcher fork)
mpicc_mpich=mpicc
command -v mpicc.mpich >/dev/null 2>&1 && mpicc_mpich=mpicc.mpich
case ${OMPI:-auto} in
  0) ompi=0 ;;
  1) ompi=1 ;;
  *) ompi=$(command -v mpirun.openmpi >/dev/null 2>&1 && echo 1 || echo 0) ;;
esac
# Open MPI's launcher: as root it must be told so; more ranks than cores need
# --oversubscribe, and cannot be bound one to a core.
ompirun=(mpirun.openmpi -np "$np")
[ "$(id -u)" = 0 ] && ompirun+=(--allow-run-as-root)
if [ "$np" -gt "$(nproc)" ]; then
  ompirun+=(--oversubscribe --bind-to none)
else
  ompirun+=(--bind-to core)
fi

if [ "${BUILD:-1}" != 0 ]; then
  MPICC=$mpicc_mpich cargo build --release -q --features mpi -p imb-bench -p beff \
    --target-dir target/mpi
  MPICC=$mpicc_mpich cargo build --release -q --features mpi --example rsmpi_api \
    --target-dir target/mpi
  cargo build --release -q -p pagewire-tools --bin pwrun
  if [ "$ompi" = 1 ]; then
    MPICC=mpicc.openmpi cargo build --release -q --features mpi -p imb-bench -p beff \
      --target-dir target/ompi
    MPICC=mpicc.openmpi cargo build --release -q --features mpi --example rsmpi_api \
      --target-dir target/ompi
  fi
fi
imb=target/mpi/release/imb-bench
beff=target/mpi/release/beff
api=target/mpi/release/examples/rsmpi_api
pwrun=target/release/pwrun
for bin in "$imb" "$beff" "$api" "$pwrun"; do
  [ -x "$bin" ] || { echo "local_path.sh: $bin is missing (run without BUILD=0)" >&2; exit 2; }
done
if [ "$ompi" = 1 ]; then
  for bin in "$imb" "$beff" "$api"; do
    b=${bin/target\/mpi\//target/ompi/}
    [ -x "$b" ] || { echo "local_path.sh: $b is missing (run without BUILD=0)" >&2; exit 2; }
  done
fi

load() { cut -d' ' -f1-3 /proc/loadavg; }
{
  echo "# $(date -u +%FT%TZ)"
  echo "uname: $(uname -a)"
  echo "nproc: $(nproc)"
  echo "load before: $(load)"
  "${mpirun[0]}" --version 2>&1 | sed -n 1,3p | sed 's/^/mpirun: /'
  [ "$ompi" = 1 ] && mpirun.openmpi --version 2>&1 | sed -n 1p | sed 's/^/mpirun.openmpi: /'
  echo "pagewire: $(git rev-parse --short HEAD 2>/dev/null || echo '?')," \
    "$(git status --porcelain 2>/dev/null | wc -l) files changed or new in the work tree"
  echo "rounds: $rounds; imb-bench ${imb_benchmarks[*]} -msglog $msglog${imb_extra[*]:+ ${imb_extra[*]}}" \
    "(warm, and -off_cache -1); rsmpi_api -msglog $msglog; beff ${beff_args[*]}"
} > "$out/machine.txt"
busy=$(awk -v n="$(nproc)" '{ print ($1 > n / 2) ? 1 : 0 }' /proc/loadavg)
[ "$busy" = 1 ] && echo "local_path.sh: warning: load $(load) on $(nproc) cores; the figures will be noisy" >&2

failed=0
# CONFIG BENCH ROUND PROGRAM ARGS... -> $out/CONFIG-BENCH-rROUND.txt (and .err)
run() {
  local config=$1 bench=$2 round=$3
  shift 3
  local base="$out/$config-$bench-r$round" rc=0
  # What carries the calls: imb-bench and beff name a transport; the rsmpi-API program a
  # library (rsmpi itself under mpirun).
  local on_mpi=(--transport mpi) on_pagewire=(--transport soft)
  if [ "$bench" = api ]; then on_mpi=(--api rsmpi) on_pagewire=(--api pagewire); fi
  case $config in
    mpich) timeout "$limit" "${mpirun[@]}" -np "$np" -bind-to core "$@" "${on_mpi[@]}" ;;
    ompi) timeout "$limit" "${ompirun[@]}" "${1/target\/mpi\//target/ompi/}" "${@:2}" \
            "${on_mpi[@]}" ;;
    local) env PAGEWIRE_LOCAL=shm PAGEWIRE_MODE=copy \
             "$pwrun" -n "$np" --bind-to core --timeout "$limit" -- "$@" "${on_pagewire[@]}" ;;
    nic) env PAGEWIRE_LOCAL=nic PAGEWIRE_MODE=copy \
           "$pwrun" -n "$np" --bind-to core --timeout "$limit" -- "$@" "${on_pagewire[@]}" ;;
  esac > "$base.txt" 2> "$base.err" || rc=$?
  [ -s "$base.err" ] || rm -f "$base.err"
  if [ "$rc" != 0 ]; then
    echo "$config $bench round $round: exit status $rc (see $base.txt$([ -e "$base.err" ] && echo ", $base.err"))" |
      tee -a "$out/failures.txt" >&2
    failed=1
  fi
}

configs=(mpich local nic)
[ "$ompi" = 1 ] && configs=(mpich ompi local nic)
start=$SECONDS
for ((r = 1; r <= rounds; r++)); do
  # Rotate the order so that no configuration always runs first (or right after another).
  k=$(((r - 1) % ${#configs[@]}))
  order=("${configs[@]:k}" "${configs[@]:0:k}")
  echo "round $r/$rounds (${order[*]}), $((SECONDS - start)) s so far, load $(load)" >&2
  for c in "${order[@]}"; do
    run "$c" imb-warm "$r" "$imb" "${imb_benchmarks[@]}" -msglog "$msglog" -npmin "$np" --no-progress \
      ${imb_extra[@]+"${imb_extra[@]}"}
  done
  for c in "${order[@]}"; do
    run "$c" imb-offcache "$r" "$imb" "${imb_benchmarks[@]}" -msglog "$msglog" -npmin "$np" \
      -off_cache -1 --no-progress ${imb_extra[@]+"${imb_extra[@]}"}
  done
  if [ "${API:-1}" != 0 ]; then
    for c in "${order[@]}"; do
      run "$c" api "$r" "$api" --msglog "$msglog"
    done
  fi
  for c in "${order[@]}"; do
    run "$c" beff "$r" "$beff" "${beff_args[@]}"
  done
done
{
  echo "load after: $(load)"
  echo "run time: $((SECONDS - start)) s"
} >> "$out/machine.txt"

{
  echo "# Pagewire's local path vs MPICH, $np ranks on one host"
  echo
  sed 's/^/    /' "$out/machine.txt"
  echo
  echo "Times in µs (PingPong t[usec], the others' t_avg[usec]); ratios are pagewire"
  echo "over MPICH per round, median (min–max) over $rounds round(s): below 1 = pagewire faster."
  echo "Run \"rsmpi API\": examples/rsmpi_api, the same source on rsmpi over MPICH and on pagewire."
  echo "b_eff: ratio of MB/s, above 1 = pagewire better. local = PAGEWIRE_LOCAL=shm;"
  echo "nic = PAGEWIRE_LOCAL=nic, PAGEWIRE_MODE=copy. local/OMPI: over Open MPI's time (or MB/s)."
  echo "Where MPICH's time is below 1 µs, a ratio says little (its state changes between runs)."
  echo
  python3 tools/bench/local_path_table.py "$out" "$rounds" "$sizes"
  if [ -s "$out/failures.txt" ]; then
    echo
    echo "Failed runs (their rows come from partial outputs or are missing):"
    sed 's/^/- /' "$out/failures.txt"
  fi
} > "$out/summary.md"
cat "$out/summary.md"
echo "(summary: $out/summary.md; raw outputs and rows.tsv in $out)" >&2
run_record_end "$out"
exit "$failed"
