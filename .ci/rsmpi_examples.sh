#!/usr/bin/env bash
# rsmpi's own examples against pagewire: builds every example of rsmpi 0.8.2
# unchanged in a scratch crate whose only change is the dependency line
#   mpi = { package = "pagewire", path = ... }
# (rsmpi's features `user-operations`, `derive` and `complex` mirrored), runs each on 2 and 3
# processes (as rsmpi's CI does) in each RUN given, and prints, per run,
#   RUN: N of 58 passed
# where "passed" means it exited 0 on both 2 and 3 ranks.
#
# Usage: .ci/rsmpi_examples.sh [--check] [RUN ...]      (default RUN: pwrun:copy)
#   pwrun:MODE     under pagewire's launcher, buffer mode MODE (copy, pindown or odp), local
#                  traffic through the NIC (PAGEWIRE_LOCAL=nic, where the modes apply); MODE
#                  `local`: the default path (shared memory between ranks of one host)
#   hosts:MODE     under `pwrun --hosts $RSMPI_HOSTS` (through PAGEWIRE_RSH), mode MODE: ranks
#                  on several hosts, e.g. the two namespaced hosts of tools/hosts/ns-hosts
#   srun:PMI       under Slurm's `srun -N 2 --mpi=PMI` (pmi2 or pmix), started through the
#                  command prefix $RSMPI_SRUN (e.g. tools/hosts/slurm's `run`), default path
#   ompi:local     under Open MPI's mpirun, the command $RSMPI_OMPIRUN (which takes -np N),
#                  default path; pagewire bootstraps through its PMIx client
#   mpirun:mpi     under mpirun, PAGEWIRE_TRANSPORT=mpi (every call to MPICH); needs MPICH
#   mpirun:MODE    under mpirun, pagewire's own transport bootstrapped by MPI, mode MODE (or
#                  `local`, as for pwrun)
# The mpirun runs build pagewire with `--features mpi` into a scratch crate of their own.
#
# --check: exit 1 unless every example passes in every run, except `spawn` and
# `spawn_multiple` where no launcher can add processes: under `pwrun --hosts`, srun, Open
# MPI's mpirun and under mpirun on pagewire's own transport they must fail with the one line that says the job cannot
# grow there (docs/coming-from-rsmpi.md), and under mpirun:mpi where the MPI library itself
# cannot spawn (a C program tells), with the MPI library's error. Under `pwrun -n` they pass.
# Without --check, the script only reports.
#
# Settings: RSMPI_RUN_TIMEOUT (seconds per program run, default 30), RSMPI_BUDGET (seconds
# per RUN, default 360; later programs are skipped and count as not passed). Logs:
# target/rsmpi-examples{,-mpi}/logs/RUN/EXAMPLE.nRANKS.log and build.log.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
run_timeout=${RSMPI_RUN_TIMEOUT:-30}
budget=${RSMPI_BUDGET:-360}
check=0
if [ "${1:-}" = --check ]; then
  check=1
  shift
fi
runs=("$@")
[ "${#runs[@]}" -gt 0 ] || runs=(pwrun:copy)
spawn_refusal="cannot add processes to a running job"

# rsmpi's sources come with the `mpi` feature's dependency; fetch them if they are missing.
cargo_home=${CARGO_HOME:-$HOME/.cargo}
examples=$(ls -d "$cargo_home"/registry/src/*/mpi-0.8.2/examples 2>/dev/null | head -n 1 || true)
if [ -z "$examples" ]; then
  cargo fetch --quiet
  examples=$(ls -d "$cargo_home"/registry/src/*/mpi-0.8.2/examples | head -n 1)
fi
total=$(ls "$examples"/*.rs | wc -l)

# The scratch crate in $1, pagewire with the extra features $2 ("" or "\"mpi\", "): rsmpi's
# examples and features, pagewire as `mpi`. Builds every example, keeping going past the
# ones that do not compile.
build() {
  local scratch=$1 extra=$2
  rm -rf "$scratch/examples"
  mkdir -p "$scratch/examples" "$scratch/src"
  cp "$examples"/*.rs "$scratch/examples/"
  : > "$scratch/src/lib.rs"
  cat > "$scratch/Cargo.toml" <<TOML
[package]
name = "rsmpi-examples"
version = "0.0.0"
edition = "2021"
publish = false

# Not part of pagewire's workspace.
[workspace]

[dependencies]
mpi = { package = "pagewire", path = "$repo", features = [$extra] }
# rsmpi's own dependency for complex numbers, which its examples use directly.
num-complex = "0.4"

[features]
default = ["user-operations", "derive", "complex"]
user-operations = ["mpi/user-operations"]
derive = ["mpi/derive"]
complex = ["mpi/complex"]

# rsmpi's build script declares cfg(msmpi) (Microsoft MPI); the examples test it.
[lints.rust]
unexpected_cfgs = { level = "warn", check-cfg = ["cfg(msmpi)"] }
TOML
  rm -rf "$scratch/target/release/examples"
  (cd "$scratch" && CARGO_TARGET_DIR=$scratch/target \
    cargo build --release --examples --keep-going --message-format short) \
    > "$scratch/build.log" 2>&1 || true
}

# Builds, once each, what the runs need.
need_pwrun=0
need_mpi=0
for run in "${runs[@]}"; do
  case $run in
    pwrun:copy | pwrun:pindown | pwrun:odp | pwrun:local) need_pwrun=1 ;;
    hosts:copy | hosts:pindown | hosts:odp | hosts:local)
      need_pwrun=1
      [ -n "${RSMPI_HOSTS:-}" ] ||
        { echo "rsmpi_examples: $run needs RSMPI_HOSTS (a pwrun --hosts list)" >&2; exit 2; }
      ;;
    srun:pmi2 | srun:pmix)
      need_pwrun=1
      [ -n "${RSMPI_SRUN:-}" ] ||
        { echo "rsmpi_examples: $run needs RSMPI_SRUN (the command that runs srun)" >&2; exit 2; }
      ;;
    ompi:local)
      need_pwrun=1
      [ -n "${RSMPI_OMPIRUN:-}" ] ||
        { echo "rsmpi_examples: $run needs RSMPI_OMPIRUN (Open MPI's mpirun command)" >&2; exit 2; }
      ;;
    mpirun:mpi | mpirun:copy | mpirun:pindown | mpirun:odp | mpirun:local) need_mpi=1 ;;
    *) echo "rsmpi_examples: unknown run '$run' (pwrun:MODE, hosts:MODE, srun:PMI, ompi:local, mpirun:mpi or mpirun:MODE)" >&2; exit 2 ;;
  esac
done
if [ "$need_pwrun" = 1 ]; then
  cargo build --release --quiet --bin pwrun
  build "$target/rsmpi-examples" ""
fi
mpirun=(mpirun)
mpi_spawns=0
if [ "$need_mpi" = 1 ]; then
  command -v ssh >/dev/null 2>&1 || mpirun+=(-launcher fork)
  build "$target/rsmpi-examples-mpi" '"mpi"'
  # Whether the host MPI library can spawn at all: a C program that spawns one copy of
  # itself. Debian's MPICH 4.0.2 (ch4:ucx) cannot here: MPI_Comm_spawn fails with
  # "MPID_Comm_spawn_multiple(86): Error in spawn call" before asking hydra for processes.
  probe=$target/rsmpi-examples-mpi/spawn_probe
  cat > "$probe.c" <<'C'
#include <mpi.h>
int main(int argc, char **argv) {
  MPI_Comm parent, children;
  MPI_Init(&argc, &argv);
  MPI_Comm_get_parent(&parent);
  if (parent == MPI_COMM_NULL)
    MPI_Comm_spawn(argv[0], MPI_ARGV_NULL, 1, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &children,
                   MPI_ERRCODES_IGNORE);
  MPI_Finalize();
  return 0;
}
C
  mpicc "$probe.c" -o "$probe"
  if timeout 60 "${mpirun[@]}" -np 1 "$probe" > "$probe.log" 2>&1; then
    mpi_spawns=1
    echo "the host MPI library spawns processes: spawn and spawn_multiple must pass under mpirun:mpi"
  else
    echo "the host MPI library cannot spawn processes here: a C program's MPI_Comm_spawn fails with"
    echo "  $(grep -m1 'Error in spawn call' "$probe.log" || tail -n 1 "$probe.log")"
    echo "so spawn and spawn_multiple must fail with that error under mpirun:mpi"
  fi
fi

failed_runs=()
summary=()
for run in "${runs[@]}"; do
  launcher=${run%%:*}
  what=${run#*:}
  if [ "$launcher" != mpirun ]; then
    scratch=$target/rsmpi-examples
  else
    scratch=$target/rsmpi-examples-mpi
  fi
  logs=$scratch/logs/$launcher-$what
  rm -rf "$logs"
  mkdir -p "$logs"
  # What the ranks see: the mode, or the mpi transport.
  if [ "$what" = mpi ]; then
    envs=(PAGEWIRE_TRANSPORT=mpi)
  elif [ "$launcher" = srun ] || [ "$launcher" = ompi ]; then
    envs=(PAGEWIRE_LOCAL=shm)
  else
    envs=(PAGEWIRE_MODE="$what" PAGEWIRE_LOCAL=nic)
    [ "$what" = local ] && envs=(PAGEWIRE_LOCAL=shm)
  fi
  start=$SECONDS
  compiled=0
  passed=0
  bad=()
  echo "== $run"
  printf '%-32s %-8s %-6s %-6s\n' example build n=2 n=3
  for src in "$examples"/*.rs; do
    name=$(basename "$src" .rs)
    bin=$scratch/target/release/examples/$name
    # spawn and spawn_multiple pass under pwrun -n; they are refused (one clear line) under
    # pwrun --hosts and under mpirun on pagewire's own transport, and on the mpi transport
    # where the MPI library cannot spawn (its own error).
    refused=0
    refusal=$spawn_refusal
    case $launcher:$name:$what in
      pwrun:*) ;;
      mpirun:spawn:mpi | mpirun:spawn_multiple:mpi)
        if [ "$mpi_spawns" = 0 ]; then
          refused=1
          refusal="Error in spawn call"
        fi
        ;;
      *:spawn:* | *:spawn_multiple:*) refused=1 ;;
    esac
    if [ ! -x "$bin" ]; then
      printf '%-32s %-8s %-6s %-6s\n' "$name" FAIL - -
      bad+=("$name (does not compile)")
      continue
    fi
    compiled=$((compiled + 1))
    results=()
    for n in 2 3; do
      log=$logs/$name.n$n.log
      if [ $((SECONDS - start)) -ge "$budget" ]; then
        results+=(skip)
        continue
      fi
      if [ "$launcher" = pwrun ]; then
        cmd=("$target/release/pwrun" -n "$n" --timeout "$run_timeout" -- "$bin")
      elif [ "$launcher" = hosts ]; then
        cmd=("$target/release/pwrun" --hosts "$RSMPI_HOSTS" -n "$n" --timeout "$run_timeout" -- "$bin")
      elif [ "$launcher" = srun ]; then
        read -r -a prefix <<<"$RSMPI_SRUN"
        cmd=("${prefix[@]}" srun -N 2 -n "$n" --mpi="$what" "$bin")
      elif [ "$launcher" = ompi ]; then
        read -r -a prefix <<<"$RSMPI_OMPIRUN"
        cmd=("${prefix[@]}" -np "$n" "$bin")
      else
        cmd=("${mpirun[@]}" -np "$n" "$bin")
      fi
      if (cd "$scratch" && env "${envs[@]}" RUST_BACKTRACE=0 timeout $((run_timeout + 10)) "${cmd[@]}") \
        > "$log" 2>&1; then
        results+=(pass)
      else
        results+=(FAIL)
      fi
    done
    printf '%-32s %-8s %-6s %-6s\n' "$name" ok "${results[0]}" "${results[1]}"
    if [ "${results[0]}" = pass ] && [ "${results[1]}" = pass ]; then
      passed=$((passed + 1))
      [ "$refused" = 0 ] || bad+=("$name (passed where it must be refused)")
    elif [ "$refused" = 1 ] && [ "${results[0]}${results[1]}" = FAILFAIL ] &&
      grep -q "$refusal" "$logs/$name.n2.log" && grep -q "$refusal" "$logs/$name.n3.log"; then
      : # refused with the message, as documented
    else
      bad+=("$name (${results[*]})")
    fi
  done
  echo "logs: $logs ($((SECONDS - start)) s)"
  line="$run: $passed of $total passed ($compiled compiled)"
  if [ "${#bad[@]}" -gt 0 ]; then
    line+="; unexpected: ${bad[*]}"
    failed_runs+=("$run")
  fi
  echo "$line"
  summary+=("$line")
done
echo "== summary"
printf '%s\n' "${summary[@]}"
if [ "$check" = 1 ] && [ "${#failed_runs[@]}" -gt 0 ]; then
  echo "rsmpi_examples: unexpected results in ${failed_runs[*]}" >&2
  exit 1
fi
