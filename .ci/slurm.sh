#!/usr/bin/env bash
# Where clusters start jobs: a real Slurm (tools/hosts/slurm: munge, slurmctld, a slurmd on
# each of the two namespaced hosts of tools/hosts/ns-hosts) and Open MPI's mpirun across the
# same two hosts. Programs are built without the `mpi` feature: under `srun --mpi=pmi2` they
# bootstrap through pagewire's PMI client (PMI-2's wire protocol), under `srun --mpi=pmix`
# and Open MPI's mpirun through its PMIx client (libpmix loaded at start-up). Checks:
#   - srun -N 2 -n 4 --mpi=pmi2 and --mpi=pmix: Jacobi's result as under `pwrun -n 4`, ring,
#     imb-bench PingPong and Allreduce and beff with the message sizes `pwrun --hosts` gives,
#     and the starter named by PAGEWIRE_VERBOSE=1;
#   - rsmpi 0.8.2's examples on 2 and 3 tasks under both, and under Open MPI's mpirun;
#   - srun without --mpi: every task says, in one line, that it cannot find the others;
#   - sbatch of a job script with two job steps: its output file holds both results;
#   - a task killed with SIGKILL: the step ends with a non-zero status within 10 s;
#   - scancel of a running job: every process of it gone within 10 s;
#   - Open MPI's `mpirun -np 4 --host h0:2,h1:2` (its remote shell the hosts' ssh stand-in):
#     Jacobi's result and imb-bench;
#   - after each failure and at the end, nothing of pagewire's left on either host (no
#     process, nothing in /dev/shm).
# Installs slurm-wlm, munge, libpmix-dev and openmpi-bin where they are missing (as root,
# with apt-get). Skips with one line where they or the namespaces cannot be had, and fails
# instead when PAGEWIRE_REQUIRE names `slurm` (or `openmpi` for the Open MPI part). By hand:
# bash .ci/slurm.sh
set -euo pipefail
cd "$(dirname "$0")/.."

required() {
  [[ ",${PAGEWIRE_REQUIRE:-}," == *",$1,"* || ",${PAGEWIRE_REQUIRE:-}," == *",all,"* ]]
}
# PREREQUISITE WHY: fail if required, else say it is skipped.
unavailable() {
  if required "$1"; then
    echo "slurm: $2 (PAGEWIRE_REQUIRE names $1)" >&2
    exit 1
  fi
  echo "skipped: $2" >&2
}

need=()
command -v slurmd >/dev/null 2>&1 || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
command -v mpirun.openmpi >/dev/null 2>&1 || need+=(openmpi-bin)
# Slurm's mpi/pmix plugin loads libpmix by its unversioned name, which the -dev package gives.
dpkg -s libpmix-dev >/dev/null 2>&1 || need+=(libpmix-dev)
if [ "${#need[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
  # openmpi-bin takes over `mpirun` (its priority is higher); the other scripts mean MPICH's.
  if [ -x /usr/bin/mpirun.mpich ]; then
    update-alternatives --set mpirun /usr/bin/mpirun.mpich > /dev/null
  fi
fi
if ! tools/hosts/ns-hosts check 2>/dev/null; then
  unavailable slurm "Slurm on two namespaced hosts: $(tools/hosts/ns-hosts check 2>&1 || true)"
  exit 0
fi
if ! tools/hosts/slurm check 2>/dev/null; then
  unavailable slurm "$(tools/hosts/slurm check 2>&1 || true)"
  exit 0
fi
ompi=1
if ! command -v mpirun.openmpi >/dev/null 2>&1; then
  unavailable openmpi "Open MPI's mpirun across two hosts: mpirun.openmpi is not installed"
  ompi=0
fi

cargo build --release -q --bin pwrun --examples
cargo build --release -q -p imb-bench -p beff
bin=$PWD/target/release
work=$PWD/target/slurm-ci
rm -rf "$work"
mkdir -p "$work"

id="sl$(( $$ % 100000 ))"
hosts_dir=$(tools/hosts/ns-hosts up "$id")
cleanup() {
  tools/hosts/slurm down "$id" || true
  tools/hosts/ns-hosts down "$id"
}
trap cleanup EXIT
slurm_dir=$(tools/hosts/slurm up "$id")
run=$slurm_dir/run
h0=pw$id-0
h1=pw$id-1
start_all=$SECONDS

# Nothing of pagewire's on either host: no process but the host's init and Slurm's daemons
# (a step's slurmstepd may take a moment to go), nothing in /dev/shm.
assert_clean() {
  local h left procs tries=0
  while :; do
    left=""
    procs=""
    for h in "$h0" "$h1"; do
      left+=$("$hosts_dir/enter" "$h" ls -A /dev/shm)
      procs+=$("$hosts_dir/enter" "$h" ps -e -o pid=,args= |
        awk -v h="$h" '$1 != 1 && $2 !~ /(^|\/)slurm(d|ctld)$/ && !/slurmscriptd|ps -e -o/ {print h ": " $0}')
    done
    [ -z "$left$procs" ] && return 0
    tries=$((tries + 1))
    if [ $tries -ge 25 ]; then
      echo "slurm: $1: left behind: ${left:+/dev/shm: $left; }$procs" >&2
      exit 1
    fi
    sleep 0.2
  done
}

# Message sizes of an IMB output's tables, "BENCHMARK BYTES" per row.
imb_sizes() {
  awk '/^# Benchmarking/ { b = $3 } /^ *[0-9]/ && b != "" { print b, $1 }' "$1"
}

jacobi_line() { tail -n 1 | sed 's/ ([0-9.]* s)$//'; }
local_line=$(timeout 300 "$bin/pwrun" -n 4 "$bin/examples/jacobi" | jacobi_line)
PAGEWIRE_RSH=$hosts_dir/rsh timeout 300 "$bin/pwrun" --hosts "$h0:2,$h1:2" \
  "$bin/imb-bench" PingPong Allreduce -msglog 0:16 --no-progress > "$work/imb-pwrun.txt"
imb_sizes "$work/imb-pwrun.txt" > "$work/imb-pwrun.sizes"
[ -s "$work/imb-pwrun.sizes" ] || { echo "slurm: no IMB table under pwrun --hosts" >&2; exit 1; }

for mpi in pmi2 pmix; do
  start=$SECONDS
  srun=("$run" srun -N 2 -n 4 --mpi="$mpi")
  line=$(timeout 300 "${srun[@]}" "$bin/examples/jacobi" | jacobi_line)
  [ "$line" = "$local_line" ] ||
    { echo "slurm: Jacobi under srun --mpi=$mpi: $line; under pwrun -n 4: $local_line" >&2; exit 1; }
  timeout 120 "${srun[@]}" --export=ALL,PAGEWIRE_VERBOSE=1 "$bin/examples/ring" \
    > "$work/ring-$mpi.txt" 2>&1
  grep -q "ring: ranks=4 token=6 expected=6 ok" "$work/ring-$mpi.txt"
  grep -q "started by Slurm's srun --mpi=$mpi" "$work/ring-$mpi.txt" ||
    { echo "slurm: the starter is not named under --mpi=$mpi:" >&2; cat "$work/ring-$mpi.txt" >&2; exit 1; }
  timeout 300 "${srun[@]}" "$bin/imb-bench" PingPong Allreduce -msglog 0:16 --no-progress \
    > "$work/imb-$mpi.txt"
  imb_sizes "$work/imb-$mpi.txt" | cmp -s - "$work/imb-pwrun.sizes" ||
    { echo "slurm: imb-bench under srun --mpi=$mpi printed other rows than under pwrun --hosts" >&2; exit 1; }
  timeout 300 "$run" srun -N 2 -n 2 --mpi="$mpi" "$bin/beff" --short --test \
    --memory-per-process 8 --seed 1 > "$work/beff-$mpi.txt"
  grep -q "b_eff" "$work/beff-$mpi.txt"
  assert_clean "srun --mpi=$mpi"
  echo "slurm: Jacobi, ring, imb-bench and beff passed under srun -N 2 --mpi=$mpi ($((SECONDS - start)) s)"
done

# rsmpi's examples under both plugins, and under Open MPI's mpirun across the hosts.
ompirun="$hosts_dir/frontend mpirun.openmpi --allow-run-as-root --mca plm_rsh_agent $hosts_dir/rsh --host $h0:2,$h1:2"
runs=(srun:pmi2 srun:pmix)
[ "$ompi" = 1 ] && runs+=(ompi:local)
RSMPI_SRUN=$run RSMPI_OMPIRUN=$ompirun bash .ci/rsmpi_examples.sh --check "${runs[@]}"
assert_clean "rsmpi's examples"

# srun without a PMI plug-in: each task fails with the line that says so.
if timeout 60 "$run" srun -N 2 -n 2 --mpi=none "$bin/examples/ring" > "$work/none.txt" 2>&1; then
  echo "slurm: ring ran under srun --mpi=none" >&2
  exit 1
fi
[ "$(grep -c "one of 2 tasks started by srun without a PMI server" "$work/none.txt")" = 2 ] ||
  { echo "slurm: srun --mpi=none did not get the line on both tasks:" >&2; cat "$work/none.txt" >&2; exit 1; }
assert_clean "srun --mpi=none"
echo "slurm: srun --mpi=none: every task said it cannot find the others"

# sbatch: a job script of two steps, its output file.
cat > "$work/job.sh" <<EOF
#!/bin/sh
#SBATCH -N 2
#SBATCH -n 4
#SBATCH -o $work/job.out
srun --mpi=pmi2 $bin/examples/jacobi
srun --mpi=pmix $bin/examples/ring
EOF
timeout 300 "$run" sbatch --wait "$work/job.sh" > /dev/null
grep -q "^$local_line" "$work/job.out" && grep -q "ring: ranks=4 token=6 expected=6 ok" "$work/job.out" ||
  { echo "slurm: the batch job's output lacks a step's result:" >&2; cat "$work/job.out" >&2; exit 1; }
assert_clean "sbatch"
echo "slurm: sbatch ran a job script of two steps"

# The processes of a long Allreduce run on host $1, once they exist (at most 30 s).
wait_for_ranks() {
  local tries=0 pids=""
  while [ $tries -lt 150 ]; do
    pids=$("$hosts_dir/enter" "$1" pgrep -f "imb-bench Allreduce" || true)
    [ -n "$pids" ] && { echo "$pids"; return 0; }
    sleep 0.2
    tries=$((tries + 1))
  done
  echo "slurm: no rank started on $1" >&2
  return 1
}
# Every rank in every repetition (-npmin 4): a rank that dies is noticed by the others,
# which fail and have the process manager end the step. (Ranks that never wait for a dead
# one run on unless srun's -K or KillOnBadExit ends the step, as with any MPI.)
long_run=("$bin/imb-bench" Allreduce -npmin 4 -msglog 0:22 -iter 100000 -time 60 --no-progress)

# A task killed with SIGKILL: the step ends, non-zero, within 10 s.
for mpi in pmi2 pmix; do
  rc=0
  (
    set +e
    timeout 120 "$run" srun -N 2 -n 4 --mpi="$mpi" "${long_run[@]}" > "$work/kill-$mpi.txt" 2>&1
    echo "$?" > "$work/kill-$mpi.rc"
  ) &
  waiter=$!
  # The first pid (not `| head -n 1`: bash writes the list line by line, and a writer that
  # finds head gone dies of SIGPIPE, which pipefail turns into this script's exit status).
  victim=$(wait_for_ranks "$h1")
  victim=${victim%%$'\n'*}
  sleep 1
  killed_at=$(date +%s%N)
  "$hosts_dir/enter" "$h1" kill -KILL "$victim"
  wait "$waiter"
  took=$(( ($(date +%s%N) - killed_at) / 1000000 ))
  rc=$(cat "$work/kill-$mpi.rc")
  [ "$rc" != 0 ] || { echo "slurm: a step with a killed task ended with status 0" >&2; exit 1; }
  [ "$took" -le 10000 ] ||
    { echo "slurm: the step with a killed task ended $took ms after the kill" >&2; exit 1; }
  assert_clean "a killed task under --mpi=$mpi"
  echo "slurm: a task killed with SIGKILL under --mpi=$mpi: srun ended with $rc after $took ms"
done

# scancel of a running batch job.
cat > "$work/long.sh" <<EOF
#!/bin/sh
#SBATCH -N 2
#SBATCH -n 4
#SBATCH -o $work/long.out
srun --mpi=pmi2 ${long_run[*]}
EOF
job=$("$run" sbatch --parsable "$work/long.sh")
wait_for_ranks "$h1" > /dev/null
sleep 1
cancelled_at=$(date +%s%N)
"$run" scancel "$job"
tries=0
while [ $tries -lt 100 ]; do
  left=""
  for h in "$h0" "$h1"; do
    left+=$("$hosts_dir/enter" "$h" pgrep -f "imb-bench Allreduce" || true)
  done
  [ -z "$left" ] && [ -z "$("$run" squeue -h -j "$job" 2>/dev/null)" ] && break
  sleep 0.2
  tries=$((tries + 1))
done
took=$(( ($(date +%s%N) - cancelled_at) / 1000000 ))
[ "$took" -le 10000 ] || { echo "slurm: job $job still there $took ms after scancel" >&2; exit 1; }
assert_clean "scancel"
echo "slurm: scancel ended job $job in $took ms"

if [ "$ompi" = 1 ]; then
  ompi_cmd=("$hosts_dir/frontend" mpirun.openmpi --allow-run-as-root --mca plm_rsh_agent
    "$hosts_dir/rsh" --host "$h0:2,$h1:2" -np 4)
  line=$(timeout 300 "${ompi_cmd[@]}" "$bin/examples/jacobi" | jacobi_line)
  [ "$line" = "$local_line" ] ||
    { echo "slurm: Jacobi under Open MPI's mpirun: $line; under pwrun -n 4: $local_line" >&2; exit 1; }
  timeout 300 "${ompi_cmd[@]}" "$bin/imb-bench" PingPong Allreduce -msglog 0:16 --no-progress \
    > "$work/imb-ompi.txt"
  imb_sizes "$work/imb-ompi.txt" | cmp -s - "$work/imb-pwrun.sizes" ||
    { echo "slurm: imb-bench under Open MPI's mpirun printed other rows than under pwrun" >&2; exit 1; }
  assert_clean "Open MPI's mpirun"
  echo "slurm: Jacobi and imb-bench passed under Open MPI's mpirun across the two hosts"
fi
echo "slurm: all checks passed ($((SECONDS - start_all)) s)"
