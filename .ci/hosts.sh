#!/usr/bin/env bash
# Two hosts: the facade's point-to-point, collectives and communicator suites and
# the examples as 2 hosts x 2 ranks, under pagewire's own `pwrun --hosts` and under MPICH's
# mpiexec, across two hosts made of namespaces on this machine (tools/hosts/ns-hosts: each
# its own network, on a veth pair, and its own /dev/shm, PID, mount, UTS and IPC
# namespaces); then rsmpi 0.8.2's examples under `pwrun --hosts` in the three modes. Ranks on
# one host use shared memory, the others the soft NIC's TCP wire.
#   - pwrun --hosts: the agents start through the ssh stand-in (PAGEWIRE_RSH);
#   - mpiexec: from a login node on the first host's network, through the same stand-in;
#     the programs are built without the `mpi` feature and bootstrap through hydra's PMI
#     server. (Built with it, ranks bootstrapped by MPI sometimes hang in MPI_Finalize
#     across these hosts, in UCX's tcp transport: docs/soft-nic.md, "Beyond one host".)
# Each checks that Jacobi's result matches `pwrun -n 4`'s, and at the end neither host's
# /dev/shm keeps anything and no process is left on either. Needs root and MPICH (.ci/mpi.sh
# installs it; run this after it). Where namespaces are not permitted this says why and
# skips, except in CI. By hand: bash .ci/hosts.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PAGEWIRE_REQUIRE="${PAGEWIRE_REQUIRE:-mpirun}"

if ! tools/hosts/ns-hosts check; then
  if [ "${CI:-}" = true ]; then
    echo "hosts: CI needs namespaces for the two-host runs" >&2
    exit 1
  fi
  exit 0
fi
cargo build --release --bin pwrun --examples
cargo test --release --no-run -p pagewire --test collectives --test point_to_point \
  --test communicators

hid="ci$(( $$ % 100000 ))"
hosts_dir=$(tools/hosts/ns-hosts up "$hid")
trap 'tools/hosts/ns-hosts down "$hid"' EXIT
h0=pw$hid-0
h1=pw$hid-1
export PAGEWIRE_RSH=$hosts_dir/rsh
local_line=$(timeout 300 target/release/pwrun -n 4 target/release/examples/jacobi | tail -1 |
  sed 's/ ([0-9.]* s)$//')

# Runs the suites and the examples under the launcher command "$@" (which takes -np N and -n N).
across() {
  local name=$1
  shift
  local start=$SECONDS
  PAGEWIRE_MPIRUN="$*" PAGEWIRE_MPI_NP=4 timeout 1800 cargo test --release -p pagewire \
    --test collectives --test point_to_point --test communicators -- --test-threads=1 \
    --ignored under_mpirun::
  for ex in ring parallel_sum; do
    timeout 300 "$@" -n 4 "target/release/examples/$ex" > /dev/null
  done
  # The result line without its time.
  local line
  line=$(timeout 300 "$@" -n 4 target/release/examples/jacobi | tail -1 | sed 's/ ([0-9.]* s)$//')
  [ "$line" = "$local_line" ] ||
    { echo "hosts: Jacobi under $name: $line; under pwrun -n 4: $local_line" >&2; exit 1; }
  echo "hosts: the suites and examples passed as 2 hosts x 2 ranks under $name ($((SECONDS - start)) s)"
}

across "pwrun --hosts" "$PWD/target/release/pwrun" --hosts "$h0:2,$h1:2"
across "mpiexec (PMI)" "$hosts_dir/frontend" mpiexec -launcher ssh -launcher-exec \
  "$hosts_dir/rsh" -iface "pw${hid}a" -hosts "$h0:2,$h1:2"

# rsmpi's examples with ranks spread over both hosts (2 ranks: one each; 3: two and one).
RSMPI_HOSTS="$h0,$h1" bash .ci/rsmpi_examples.sh --check hosts:local hosts:copy hosts:pindown hosts:odp

# Nothing left on either host.
for h in "$h0" "$h1"; do
  left=$("$hosts_dir/enter" "$h" ls -A /dev/shm)
  [ -z "$left" ] || { echo "hosts: left in $h's /dev/shm: $left" >&2; exit 1; }
  procs=$("$hosts_dir/enter" "$h" ps -e -o pid=,args= | awk '$1 != 1 && !/ps -e -o/')
  [ -z "$procs" ] || { echo "hosts: left running on $h: $procs" >&2; exit 1; }
done
tools/hosts/ns-hosts down "$hid"
trap - EXIT
