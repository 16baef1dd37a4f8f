#!/usr/bin/env bash
# A published rsmpi code against pagewire: bempp-octree 0.1.1 (a distributed octree library
# with a parallel sort of Morton keys; its global minimum and maximum are user reductions
# over a derived struct), built unchanged but for its dependency line
#   mpi = { package = "pagewire", path = ... }
# (and a `[workspace]` line, so that it builds on its own inside this repository's target/).
# Its MPI examples, which check their own results, run on 2, 3 and 4 ranks in each RUN given;
# what each prints (a timing removed) must be the same in every run, and, with the run
# `mpich`, the same as the unchanged crate's on rsmpi over MPICH under mpirun.
#
# Usage: .ci/published_codes.sh [RUN ...]      (default RUN: pwrun:copy)
#   pwrun:MODE   under pagewire's launcher, buffer mode MODE (copy, pindown or odp), local
#                traffic through the NIC (PAGEWIRE_LOCAL=nic); `pwrun:local`: the default
#                path (shared memory between ranks of one host)
#   mpich        the crate unchanged, on rsmpi 0.8 over the system's MPICH, under mpirun
#                (needs what .ci/mpi.sh installs)
# Exits 1 if a program fails or prints something else than in the first run.
# Logs: target/published/logs/RUN/EXAMPLE.nRANKS.log.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
work=$target/published
run_timeout=${PUBLISHED_RUN_TIMEOUT:-120}
runs=("$@")
[ "${#runs[@]}" -gt 0 ] || runs=(pwrun:copy)
crate=bempp-octree
version=0.1.1
# The examples that use MPI, each of which asserts what it computed (parsort: the keys are
# sorted across ranks; mpi_cumsum: the scan against a sequential one; the bounding box
# against one of the gathered points; mpi_complete_tree_debug: the octree is complete,
# linear and 2:1 balanced; mpi_complete_tree: prints the global point count and depth).
examples=(parsort mpi_cumsum mpi_global_bounding_box mpi_complete_tree_debug mpi_complete_tree)

# The crate's sources, through a scratch crate that depends on it.
mkdir -p "$work/fetch/src"
cat > "$work/fetch/Cargo.toml" <<TOML
[package]
name = "published-fetch"
version = "0.0.0"
edition = "2021"
publish = false

[workspace]

[dependencies]
$crate = "=$version"
TOML
: > "$work/fetch/src/lib.rs"
(cd "$work/fetch" && cargo fetch --quiet)
cargo_home=${CARGO_HOME:-$HOME/.cargo}
src=$(ls -d "$cargo_home"/registry/src/*/"$crate-$version" | head -n 1)

# A copy of the crate in $1 whose `mpi` dependency is $2 (a TOML table body), else unchanged.
copy_crate() {
  local dir=$1 dep=$2
  rm -rf "$dir"
  mkdir -p "$dir"
  cp -r "$src"/. "$dir"/
  python3 - "$dir/Cargo.toml" "$dep" <<'PY'
import re, sys
path, dep = sys.argv[1], sys.argv[2]
text = open(path).read()
# The [dependencies.mpi] table, up to the next table.
new, n = re.subn(r'\[dependencies\.mpi\]\n(?:(?!\[).*\n)*', '[dependencies.mpi]\n' + dep + '\n\n', text)
assert n == 1, "no [dependencies.mpi] table"
open(path, 'w').write(new + '\n[workspace]\n')
PY
}

build_examples() {
  local dir=$1
  (cd "$dir" && CARGO_TARGET_DIR=$dir/target cargo build --release --quiet --examples) \
    > "$dir/build.log" 2>&1 || { cat "$dir/build.log"; echo "published: $dir does not build" >&2; exit 1; }
}

need_pwrun=0
need_mpich=0
for run in "${runs[@]}"; do
  case $run in
    pwrun:copy | pwrun:pindown | pwrun:odp | pwrun:local) need_pwrun=1 ;;
    mpich) need_mpich=1 ;;
    *) echo "published: unknown run '$run' (pwrun:MODE or mpich)" >&2; exit 2 ;;
  esac
done
if [ "$need_pwrun" = 1 ]; then
  cargo build --release --quiet --bin pwrun
  copy_crate "$work/pagewire" "package = \"pagewire\"
path = \"$repo\"
features = [\"derive\", \"user-operations\"]"
  build_examples "$work/pagewire"
fi
mpirun=(mpirun)
if [ "$need_mpich" = 1 ]; then
  command -v ssh >/dev/null 2>&1 || mpirun+=(-launcher fork)
  copy_crate "$work/rsmpi" 'version = "0.8.*"
features = ["derive", "user-operations"]'
  build_examples "$work/rsmpi"
fi

failed=0
first=
for run in "${runs[@]}"; do
  logs=$work/logs/${run/:/-}
  rm -rf "$logs"
  mkdir -p "$logs"
  echo "== $run"
  printf '%-26s %-6s %-6s %-6s\n' example n=2 n=3 n=4
  start=$SECONDS
  for name in "${examples[@]}"; do
    results=()
    for n in 2 3 4; do
      log=$logs/$name.n$n.log
      if [ "$run" = mpich ]; then
        bin=$work/rsmpi/target/release/examples/$name
        cmd=("${mpirun[@]}" -np "$n" "$bin")
        envs=()
      else
        bin=$work/pagewire/target/release/examples/$name
        cmd=("$target/release/pwrun" -n "$n" --timeout "$run_timeout" -- "$bin")
        envs=(PAGEWIRE_MODE="${run#pwrun:}" PAGEWIRE_LOCAL=nic)
        [ "$run" = pwrun:local ] && envs=(PAGEWIRE_LOCAL=shm)
      fi
      if env "${envs[@]}" RUST_BACKTRACE=0 timeout $((run_timeout + 10)) "${cmd[@]}" \
        > "$log.out" 2> "$log"; then
        # What the program printed, its timing removed, is what runs are compared by.
        sed -E 's/ in [0-9]+ ms$//' "$log.out" > "$log.result"
        if [ -z "$first" ] || cmp -s "$log.result" "$work/logs/${first/:/-}/$name.n$n.log.result"; then
          results+=(pass)
        else
          results+=(DIFF)
          failed=1
          echo "published: $name on $n ranks printed, in $run and in $first:" >&2
          cat "$log.result" "$work/logs/${first/:/-}/$name.n$n.log.result" >&2
        fi
      else
        results+=(FAIL)
        failed=1
        tail -n 5 "$log" >&2
      fi
    done
    printf '%-26s %-6s %-6s %-6s\n' "$name" "${results[@]}"
  done
  echo "$run: $((SECONDS - start)) s; what rank 0 printed, on 4 ranks:"
  cat "$logs"/*.n4.log.result
  [ -n "$first" ] || first=$run
done
if [ "$failed" = 1 ]; then
  echo "published: $crate $version: a program failed or printed something else than in $first" >&2
  exit 1
fi
echo "published: $crate $version: every example passed in ${runs[*]}, printing the same"
