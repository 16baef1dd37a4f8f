#!/usr/bin/env bash
# rsmpi's own examples against pagewire (issue 14): builds every example of rsmpi 0.8.2
# unchanged in a scratch crate whose only change is the dependency line
#   mpi = { package = "pagewire", path = ... }
# (rsmpi's features `user-operations`, `derive` and `complex` mirrored where pagewire has
# them), runs each built one under `pwrun -n 2` and `-n 3`, and prints
#   N of 58 compiled, M passed
# where "passed" means it exited 0 on both 2 and 3 ranks. It never fails on the counts (exit 0
# unless the script itself breaks); the per-example results are in the printed table and the
# compiler's messages in $scratch/build.log.
#
# Settings: PAGEWIRE_MODE (passed through to the ranks), RSMPI_RUN_TIMEOUT (seconds per run,
# default 30), RSMPI_BUDGET (seconds for all runs, default 360; later runs are skipped and
# counted as not passed).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
scratch=$target/rsmpi-examples
run_timeout=${RSMPI_RUN_TIMEOUT:-30}
budget=${RSMPI_BUDGET:-360}
start=$SECONDS

# rsmpi's sources come with the `mpi` feature's dependency; fetch them if they are missing.
cargo_home=${CARGO_HOME:-$HOME/.cargo}
examples=$(ls -d "$cargo_home"/registry/src/*/mpi-0.8.2/examples 2>/dev/null | head -n 1 || true)
if [ -z "$examples" ]; then
  cargo fetch --quiet
  examples=$(ls -d "$cargo_home"/registry/src/*/mpi-0.8.2/examples | head -n 1)
fi
total=$(ls "$examples"/*.rs | wc -l)

# The scratch crate: rsmpi's examples and features, pagewire as `mpi`.
rm -rf "$scratch/examples"
mkdir -p "$scratch/examples" "$scratch/src"
cp "$examples"/*.rs "$scratch/examples/"
: > "$scratch/src/lib.rs"
have_feature() { sed -n '/^\[features\]/,/^\[/p' "$repo/Cargo.toml" | grep -q "^$1 *="; }
features=()
feature_table=""
for f in user-operations derive complex; do
  if have_feature "$f"; then
    features+=("\"$f\"")
    feature_table+="$f = [\"mpi/$f\"]"$'\n'
  else
    feature_table+="$f = []"$'\n'
  fi
done
cat > "$scratch/Cargo.toml" <<EOF
[package]
name = "rsmpi-examples"
version = "0.0.0"
edition = "2021"
publish = false

# Not part of pagewire's workspace.
[workspace]

[dependencies]
mpi = { package = "pagewire", path = "$repo" }
# rsmpi's own dependency for complex numbers, which its examples use directly.
num-complex = "0.4"

[features]
default = ["user-operations", "derive", "complex"]
$feature_table
# rsmpi's build script declares cfg(msmpi) (Microsoft MPI); the examples test it.
[lints.rust]
unexpected_cfgs = { level = "warn", check-cfg = ["cfg(msmpi)"] }
EOF

# Build: every example, keeping going past the ones that do not compile.
cargo build --release --quiet --bin pwrun
pwrun=$target/release/pwrun
export CARGO_TARGET_DIR=$scratch/target
rm -rf "$scratch/target/release/examples"
(cd "$scratch" && cargo build --release --examples --keep-going --message-format short) \
  > "$scratch/build.log" 2>&1 || true

compiled=0
passed=0
printf '%-32s %-8s %-6s %-6s\n' example build n=2 n=3
for src in "$examples"/*.rs; do
  name=$(basename "$src" .rs)
  bin=$scratch/target/release/examples/$name
  if [ ! -x "$bin" ]; then
    printf '%-32s %-8s %-6s %-6s\n' "$name" FAIL - -
    continue
  fi
  compiled=$((compiled + 1))
  results=()
  for n in 2 3; do
    if [ $((SECONDS - start)) -ge "$budget" ]; then
      results+=(skip)
    elif (cd "$scratch" && timeout $((run_timeout + 10)) "$pwrun" -n "$n" --timeout "$run_timeout" -- "$bin") \
      > "$scratch/$name.n$n.log" 2>&1; then
      results+=(pass)
    else
      results+=(FAIL)
    fi
  done
  printf '%-32s %-8s %-6s %-6s\n' "$name" ok "${results[0]}" "${results[1]}"
  if [ "${results[0]}" = pass ] && [ "${results[1]}" = pass ]; then
    passed=$((passed + 1))
  fi
done
echo "logs: $scratch/build.log, $scratch/<example>.n<ranks>.log ($((SECONDS - start)) s)"
echo "$compiled of $total compiled, $passed passed"
