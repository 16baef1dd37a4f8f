#!/usr/bin/env bash
# mpirun (cargo feature `mpi`, docs/launching.md, "Running under mpirun"): installs MPICH if missing,
# builds and lints the feature, runs its unit tests, then runs under a real `mpirun`:
#   - tests/mpirun.rs on 2, 3 and 4 ranks: the host-MPI backend (src/backend/host_mpi/) against
#     sequential references, pagewire's facade on the soft NIC bootstrapped by MPI, and a
#     rank failing inside a collective (the job must end with an error on both transports);
#   - the `under_mpirun::` tests of tests/collectives.rs, point_to_point.rs,
#     communicators.rs and user_reductions.rs on 2, 3 and 4 ranks: the facade's collective suite and its
#     point-to-point and communicator tests, each binary started by mpirun as ranks of its
#     own tests, on the mpi transport (PAGEWIRE_TRANSPORT=mpi) and on pagewire's transport
#     bootstrapped by MPI in the copy, pindown and odp modes;
#   - tests/mpirun_examples.rs: ring, parallel_sum and jacobi under mpirun -np 2 and 4 on
#     both transports, the Jacobi line identical to pwrun's;
#   - rsmpi 0.8.2's 58 examples, unchanged, on 2 and 3 ranks, on the mpi transport and on
#     pagewire's on its local path and in copy, pindown and odp (.ci/rsmpi_examples.sh --check);
#   - a published rsmpi code, bempp-octree 0.1.1, on rsmpi over MPICH and on pagewire under
#     pwrun in the three modes, the outputs compared (.ci/published_codes.sh);
#   - pw-collbench on both transports (a smoke run of tools/bench/side_by_side.sh's binary);
#   - pw-msgperf bootstrapped by MPI on the soft NIC, on 2 and 4 ranks;
#   - pw-msgperf built *without* the feature under mpirun: it runs, bootstrapped through
#     hydra's PMI server (PMI-2's wire protocol); with half a PMIx launch's variables, or an
#     MPI launcher's with no PMI or PMIx server named, it fails with the line that says what
#     is missing (not run as N one-rank jobs);
#
# What the build needs (Debian package -> why):
#   mpich         the MPI library and its launcher (hydra's mpirun)
#   libmpich-dev  MPI headers and libmpi.so (rsmpi's mpi-sys binds the system MPI)
#   libclang-dev  bindgen (in mpi-sys's build script) loads libclang
#   pkg-config    mpi-sys's build script finds MPICH with it
#
# The feature builds into its own target directory (target/mpi): it changes the transport
# crate, so sharing target/ would rebuild the default build back and forth.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in mpich libmpich-dev libclang-dev pkg-config; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  echo "mpi: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# The tests under mpirun fail, not skip, without a launcher (PAGEWIRE_REQUIRE, README "Two
# commands").
export PAGEWIRE_REQUIRE="${PAGEWIRE_REQUIRE:+$PAGEWIRE_REQUIRE,}mpirun"

# Hydra starts local ranks itself; without ssh, tell it not to look for a remote shell.
# (MPICH's hydra runs as root without complaint; Open MPI would need --allow-run-as-root.)
mpirun=(mpirun)
command -v ssh >/dev/null 2>&1 || mpirun+=(-launcher fork)
export PAGEWIRE_MPIRUN="${mpirun[*]}"
mpirun --version | sed -n 1,2p  # sed reads to the end: no SIGPIPE under pipefail

T=(--target-dir target/mpi)
cargo build -p pagewire-boot -p pagewire-transport -p pagewire --features mpi "${T[@]}"
cargo clippy -p pagewire-boot -p pagewire-transport -p pagewire --features mpi --all-targets "${T[@]}" -- -D warnings
cargo clippy -p pagewire-collectives --features pagewire/mpi --all-targets "${T[@]}" -- -D warnings

# Unit tests of the feature's pure parts (launcher detection, layouts, type/op mapping).
cargo test -p pagewire-boot --features mpi --lib "${T[@]}"
cargo test -p pagewire --features mpi --lib host_mpi "${T[@]}"

# The test programs: each test starts itself under mpirun on these rank counts. One test at a
# time (busy-polling ranks on a small machine). Of the facade's suites only the tests that
# start their binary under mpirun (`under_mpirun::`) run here; the others run under pwrun in
# .ci/run.
export PAGEWIRE_MPI_NP=2,3,4
timeout 900 cargo test --release -p pagewire --features mpi --test mpirun "${T[@]}" -- --test-threads=1
timeout 1800 cargo test --release -p pagewire --features mpi --test collectives \
  --test point_to_point --test communicators --test user_reductions --test windows "${T[@]}" -- \
  --test-threads=1 under_mpirun::
timeout 900 cargo test --release -p pagewire --features mpi --test mpirun_examples "${T[@]}" -- \
  --test-threads=1

# rsmpi 0.8.2's own examples, unchanged, under mpirun on both transports (the soft NIC in the
# three modes); spawn is checked against what the host MPI library can do.
bash .ci/rsmpi_examples.sh --check mpirun:mpi mpirun:local mpirun:copy mpirun:pindown mpirun:odp

# A published rsmpi code (bempp-octree 0.1.1: a parallel sort and octrees, user reductions
# over derived structs): unchanged on rsmpi over MPICH under mpirun, and with its dependency
# renamed to pagewire under pwrun in the three modes; every run must print what MPICH's does.
bash .ci/published_codes.sh mpich pwrun:local pwrun:copy pwrun:pindown pwrun:odp

# pw-collbench, the side-by-side benchmark's binary, on both transports (short).
cargo build --release -p pagewire-collectives --example pw-collbench --features pagewire/mpi "${T[@]}"
for env in PAGEWIRE_TRANSPORT=mpi PAGEWIRE_MODE=copy; do
  env "$env" timeout 300 "${mpirun[@]}" -np 2 target/mpi/release/examples/pw-collbench \
    --sizes 8,1M --iters 20 allreduce bcast pingpong
done

# examples/rsmpi_api (the rsmpi-API program of tools/bench/local_path.sh), short: the same
# source on rsmpi over MPICH, and on pagewire under mpirun; each run checks the data it moved.
cargo build --release --features mpi --example rsmpi_api "${T[@]}"
for api in rsmpi pagewire; do
  timeout 300 "${mpirun[@]}" -np 2 target/mpi/release/examples/rsmpi_api --api "$api" \
    --msglog 0:18 --iter 50 > /dev/null
done
echo "mpi: examples/rsmpi_api ran on rsmpi and on pagewire"

# pw-msgperf bootstrapped by MPI, data on the soft NIC.
cargo build --release -p pagewire-tools --bin pw-msgperf --features pagewire/mpi "${T[@]}"
for np in 2 4; do
  timeout 300 "${mpirun[@]}" -np "$np" target/mpi/release/pw-msgperf pingpong --msglog 0:20 --iters 50
done

# Without the feature, under MPICH's mpiexec: the ranks bootstrap through hydra's PMI
# server and run; with half a PMIx launch (PMIX_RANK without PMIX_NAMESPACE) or an MPI
# launcher's variable and no server named (OMPI_COMM_WORLD_RANK alone), a clear error.
cargo build --release --bin pw-msgperf
timeout 300 "${mpirun[@]}" -np 2 target/release/pw-msgperf pingpong --msglog 0:16 --iters 20
echo "mpi: pw-msgperf without the mpi feature ran under mpiexec -np 2 through PMI"
refused() { # VAR=VALUE EXPECTED: pw-msgperf must fail with EXPECTED in its error
  local out
  if out=$(env "$1" RUST_BACKTRACE=0 timeout 120 target/release/pw-msgperf pingpong \
    --msglog 0:4 --iters 5 2>&1); then
    echo "mpi: pw-msgperf without the mpi feature ran with $1; it must refuse" >&2
    echo "$out" >&2
    exit 1
  fi
  grep -q -- "$2" <<<"$out" || { echo "$out" >&2; exit 1; }
  echo "mpi: without the feature, with $1, it fails with: $(grep -m1 -- "$2" <<<"$out")"
}
refused PMIX_RANK=0 "PMIX_RANK is set but PMIX_NAMESPACE is not"
refused OMPI_COMM_WORLD_RANK=0 'rebuild with `--features mpi`'

# ---- imb-bench (owner: the imb-bench engineer) -------------------------------
# Every IMB-MPI1 benchmark bootstrapped by MPI on 1-4 ranks, short, in each buffer mode; the
# host MPI library with --transport mpi; and --mode all refused with its explanation.
cargo build --release -p imb-bench --features mpi "${T[@]}"
imb=(target/mpi/release/imb-bench -msglog 0:4 -iter 20 -iter_policy off -npmin 1 --no-progress)
modes=(copy pindown odp copy)
for np in 1 2 3 4; do
  out=$(timeout 300 "${mpirun[@]}" -np "$np" "${imb[@]}" --mode "${modes[$((np - 1))]}")
  grep -q '^# All processes entering MPI_Finalize' <<<"$out" || { echo "$out" >&2; exit 1; }
  echo "mpi: imb-bench on $np ranks (${modes[$((np - 1))]}): $(grep -c '^# Benchmarking' <<<"$out") tables"
done
timeout 300 "${mpirun[@]}" -np 2 "${imb[@]}" --transport mpi PingPong Allreduce Bcast Barrier
# IMB-RMA on the host MPI library's windows and on pagewire's, 3 ranks.
for transport in mpi soft; do
  out=$(timeout 300 "${mpirun[@]}" -np 3 "${imb[@]}" --suite rma --transport "$transport")
  grep -q '^# All processes entering MPI_Finalize' <<<"$out" || { echo "$out" >&2; exit 1; }
  echo "mpi: imb-bench --suite rma on 3 ranks ($transport): $(grep -c '^# Benchmarking' <<<"$out") tables"
done
if out=$(timeout 120 "${mpirun[@]}" -np 2 "${imb[@]}" --mode all PingPong 2>&1); then
  echo "mpi: imb-bench --mode all ran under mpirun; it must refuse" >&2
  exit 1
fi
grep -q -- '--mode all needs one job per buffer mode' <<<"$out" || { echo "$out" >&2; exit 1; }

# ---- beff: a short b_eff under mpirun on both transports ------------------------
cargo build --release -p beff --features mpi "${T[@]}"
for tr in soft mpi; do
  out=$(timeout 300 "${mpirun[@]}" -np 2 target/mpi/release/beff --short --test --verify \
    --memory-per-process 8 --transport "$tr" --seed 1 2>/dev/null)
  grep -q '^b_effSHORT&TEST = .* \*   2 PEs with   8 MB/PE' <<<"$out" ||
    { echo "mpi: beff --transport $tr failed" >&2; echo "$out" >&2; exit 1; }
  echo "mpi: beff --transport $tr: $(grep -m1 '^b_eff' <<<"$out")"
done

