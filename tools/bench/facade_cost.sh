#!/usr/bin/env bash
# What the rsmpi-shaped API adds to a message: pw-msgperf's PingPong through the API
# (`Process::send`/`receive_into`) and through the message layer beneath it (its blocking
# `send`/`recv`, `--layer message`), alternating, on both paths (PAGEWIRE_LOCAL=shm, the
# default, and nic), ROUNDS rounds. Prints, per path and size, both times (median over the
# rounds) and the API's extra time per message in nanoseconds: median (min-max) of the
# rounds' differences. Every raw output is kept in OUTDIR as PATH-LAYER-rROUND.json, with
# summary.md. About 15 seconds per round on 2 cores after the build.
#
# Usage: tools/bench/facade_cost.sh [OUTDIR]   (default: target/bench/facade_cost)
# Environment: ROUNDS [10], MSGLOG [0:12], ITERS [100000] (repetitions per size; pw-msgperf
# times each repetition, so its clock reads are in both layers' times), BUILD [1].
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/facade_cost}
rounds=${ROUNDS:-10}
msglog=${MSGLOG:-0:12}
iters=${ITERS:-100000}
mkdir -p "$out"
source tools/bench/run_record.sh
run_record_start "$out" "$0" "$@"
rm -f "$out"/*-r*.json "$out"/summary.md
if [ "${BUILD:-1}" = 1 ]; then
  cargo build --release -q -p pagewire-tools
fi
bin=target/release
{
  echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "# $(nproc) cpus, $(uname -sr); rounds $rounds, -msglog $msglog, $iters repetitions"
} > "$out/machine.txt"
for r in $(seq 1 "$rounds"); do
  for path in shm nic; do
    # The order of the two layers alternates with the round.
    layers=(api message)
    [ $((r % 2)) = 0 ] && layers=(message api)
    for layer in "${layers[@]}"; do
      PAGEWIRE_LOCAL=$path timeout 300 "$bin/pwrun" -n 2 --bind-to core "$bin/pw-msgperf" pingpong \
        --layer "$layer" --msglog "$msglog" --iters "$iters" --json > "$out/$path-$layer-r$r.json"
    done
  done
done
python3 - "$out" "$rounds" <<'PY' | tee "$out/summary.md"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def times(path, layer, r):
    d = json.load(open(f"{out}/{path}-{layer}-r{r}.json"))
    return {row["bytes"]: row["t_usec"] for row in d["results"][0]["rows"]}
print(open(f"{out}/machine.txt").read().rstrip())
print("| path | bytes | API µs | message layer µs | API's extra ns per message, median (min-max) |")
print("|---|---|---|---|---|")
for path in ("shm", "nic"):
    api = [times(path, "api", r) for r in range(1, rounds + 1)]
    msg = [times(path, "message", r) for r in range(1, rounds + 1)]
    for size in sorted(api[0]):
        a = [t[size] for t in api]
        m = [t[size] for t in msg]
        d = [1000 * (x - y) for x, y in zip(a, m)]
        print(f"| {path} | {size} | {statistics.median(a):.3f} | {statistics.median(m):.3f} | "
              f"{statistics.median(d):+.0f} ({min(d):+.0f} to {max(d):+.0f}) |")
PY
run_record_end "$out"
