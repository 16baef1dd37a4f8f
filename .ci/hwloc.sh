#!/usr/bin/env bash
# Rank placement by hwloc (cargo feature `hwloc`, boot/src/binding/): installs
# what its build needs, then builds it, lints it and runs the binding tests with it. The
# tests check each rank's CPU affinity under pwrun --bind-to core|numa|none, the fallback
# when there are more ranks than cores, that hwloc's topology agrees with sysfs, and that a
# pool placed by `place_local` carries a NUMA policy for the rank's node in
# /proc/self/numa_maps (on a one-node machine too).
#
# What the build needs (Debian package -> why):
#   libhwloc-dev  hwloc's headers and libhwloc.so (hwlocality binds the system hwloc >= 2.8)
#   pkg-config    hwlocality-sys finds hwloc with it
#   libudev-dev   hwloc's pkg-config link line (Libs.private, which hwlocality-sys uses)
#                 names -ludev
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in libhwloc-dev pkg-config libudev-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  echo "hwloc: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

cargo build --release -p pagewire-boot -p pagewire-transport -p pagewire-tools --features pagewire-transport/hwloc
cargo clippy -p pagewire-boot -p pagewire-transport -p pagewire-tools --features pagewire-boot/hwloc,pagewire-transport/hwloc --all-targets -- -D warnings
# The binding tests and the binding module's unit tests, with hwloc.
cargo test --release -p pagewire-boot --features hwloc --test binding
cargo test --release -p pagewire-boot --features hwloc --lib binding
# pwrun's command line, and a benchmark header that says where each rank runs.
cargo test --release -p pagewire-tools --features hwloc --test pwrun
cargo run --release -p pagewire-tools --features hwloc --bin pw-msgperf -- pingpong --msglog 0:0 --iters 10
