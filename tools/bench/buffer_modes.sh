#!/usr/bin/env bash
# The buffer-mode figures, one run each, on the built-in launcher and the soft NIC:
#   1. PingPong in copy, pindown and odp at 8 B .. 4 MiB, warm (one buffer reused) and
#      off-cache (IMB-style rotation over 32 MiB);
#   2. pindown with its limit (8 MiB) below the working set (32 MiB), for each eviction
#      policy, cyclic and Zipf buffer reuse: hit rate and bandwidth;
#   3. odp with prefetch off, rendezvous and always on cold buffers: NPFs per message and
#      bandwidth;
#   4. resident and pinned memory after using 64 MiB of a 1 GiB buffer, per mode;
#   5. the raw NIC's warm ODP RDMA WRITE with the memory monitor vs the pagemap check.
# Usage: tools/bench/buffer_modes.sh [OUTDIR]   (default: target/bench/buffer_modes)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/buffer_modes}
mkdir -p "$out"
source tools/bench/run_record.sh
run_record_start "$out" "$0" "$@"
cargo build --release -q --bin pw-msgperf --bin pw-perftest
msgperf=target/release/pw-msgperf
perftest=target/release/pw-perftest
{
  echo "# $(date -u +%FT%TZ) $(uname -sr), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# memlock: $(ulimit -l) KiB"
} > "$out/machine.txt"

for mode in copy pindown odp; do
  PAGEWIRE_MODE=$mode "$msgperf" pingpong --msglog 3:22 > "$out/pingpong-$mode-warm.txt"
  PAGEWIRE_MODE=$mode "$msgperf" pingpong --msglog 3:22 --off-cache 32M > "$out/pingpong-$mode-offcache.txt"
  PAGEWIRE_MODE=$mode "$msgperf" footprint > "$out/footprint-$mode.txt"
done

for pattern in cyclic zipf; do
  for policy in lru lfu fifo size; do
    PAGEWIRE_MODE=pindown PAGEWIRE_PINDOWN_MAX_BYTES=8M PAGEWIRE_PINDOWN_POLICY=$policy \
      "$msgperf" pingpong --msglog 16:20 --iters 400 --off-cache 32M --pattern "$pattern" \
      > "$out/pindown-$policy-$pattern.txt"
  done
done

for prefetch in off rendezvous always; do
  PAGEWIRE_MODE=odp PAGEWIRE_ODP_PREFETCH=$prefetch "$msgperf" pingpong --msglog 16:22 --cold \
    > "$out/odp-cold-prefetch-$prefetch.txt"
done

for check in monitor pagemap; do
  PAGEWIRE_SOFT_ODP_CHECK=$check "$perftest" write_bw --size 4096,65536,1048576,4194304 --mr odp \
    > "$out/perftest-odp-warm-$check.txt"
  PAGEWIRE_SOFT_ODP_CHECK=$check "$perftest" write_bw --size 4096,65536,1048576,4194304 --mr odp --cold \
    > "$out/perftest-odp-cold-$check.txt"
done
"$perftest" write_bw --size 4096,65536,1048576,4194304 --mr pinned > "$out/perftest-pinned.txt"
echo "results in $out"
run_record_end "$out"
