#!/usr/bin/env bash
# The verbs provider (cargo feature `verbs`, docs/verbs.md): installs what its build needs,
# then builds it, lints it and runs its tests. No RDMA hardware is needed or used: the tests
# that run are the unit tests of the provider's pure parts and the no-device path; the
# hardware tests are `#[ignore]`d.
#
# What the build needs (Debian package -> why):
#   libibverbs-dev  libibverbs headers and libibverbs.so (rdma-sys binds the system rdma-core)
#   librdmacm-dev   rdma-sys's build script also probes librdmacm with pkg-config
#   libclang-dev    bindgen (in rdma-sys's build script) loads libclang
#   pkg-config      rdma-sys's build script finds both libraries with it
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in libibverbs-dev librdmacm-dev libclang-dev pkg-config; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  echo "verbs: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

cargo build -p pagewire-transport --features verbs
cargo clippy -p pagewire-verbs -p pagewire-transport --features pagewire-verbs/rdma-core,pagewire-transport/verbs \
  --all-targets -- -D warnings
# The no-device path (runs here: libibverbs finds no device) ...
cargo test -p pagewire-verbs --features rdma-core --test verbs
cargo test -p pagewire-transport --features verbs --test verbs_start_up
# ... and the unit tests of the provider's pure parts (builders, mappings, parsing).
cargo test -p pagewire-verbs --features rdma-core --lib
# The binary links no libibverbs symbol newer than IBVERBS_1.1: the newer entry points are
# looked up at run time (ffi::LateSymbols in verbs/src/ffi.rs), so a build with the feature
# starts against any libibverbs and the verbs provider says itself which rdma-core it needs.
bin=$(cargo test -p pagewire-verbs --features rdma-core --test verbs --no-run 2>&1 |
  sed -n 's/.*Executable tests\/verbs\.rs (\(.*\))$/\1/p')
newest=$(objdump -T "$bin" | grep -o 'IBVERBS_[0-9.]*' | sort -uV | tail -n 1)
if [ "$newest" != IBVERBS_1.1 ]; then
  echo "verbs: $bin needs libibverbs $newest; link nothing newer than IBVERBS_1.1" >&2
  exit 1
fi
echo "verbs: the test binary needs libibverbs $newest at most"
