#!/usr/bin/env bash
# A dynamic window whose attached regions change, in the three buffer modes: pw-dynwin on
# 2 ranks (pwrun, soft NIC, bound to cores), ROUNDS rounds alternating the modes' order.
# Each step rank 0 attaches a freshly allocated region, rank 1 puts it whole under rank 0's
# lock, rank 0 detaches it. copy and pindown register and pin each region (their runs lift
# the locked-memory limit, PAGEWIRE_MEMLOCK_LIMIT=unlimited); odp registered the whole
# address space once. One more run shows what pindown does at the machine's own limit with
# a region larger than it. Writes MODE-rROUND.txt, memlock-default.txt and summary.md
# (medians over the rounds of each run's medians, with their range) into OUTDIR.
#
# Usage: tools/bench/rma_dynamic.sh [OUTDIR]   (default: target/bench/rma-dynamic)
# Environment: ROUNDS [3], SIZES [4K,64K,1M,16M,64M], STEPS [100], BUILD [1], SUMMARY_ONLY [0]
# (1: no runs, the summary and the plot attach-detach.svg again from the raw outputs).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/rma-dynamic}
rounds=${ROUNDS:-3}
sizes=${SIZES:-4K,64K,1M,16M,64M}
steps=${STEPS:-100}
mkdir -p "$out"
source tools/bench/run_record.sh
summary_only=${SUMMARY_ONLY:-0}
if [ "$summary_only" = 1 ]; then
  rounds=$(ls "$out"/odp-r*.txt | wc -l)
else
  run_record_start "$out" "$0" "$@"
  rm -f "$out"/*-r*.txt "$out"/summary.md
fi
[ "${BUILD:-1}" = 1 ] && cargo build --release -q -p pagewire-tools --bin pwrun --bin pw-dynwin --bin pw-plot
run() { # MODE OUTFILE [ENV...]
  local mode=$1 file=$2
  shift 2
  env PAGEWIRE_MODE="$mode" "$@" timeout 900 target/release/pwrun -n 2 --bind-to core \
    target/release/pw-dynwin --sizes "$sizes" --steps "$steps" > "$file" 2>&1
}
for r in $(seq 1 "$rounds"); do
  [ "$summary_only" = 1 ] && break
  modes=(copy pindown odp)
  [ $((r % 2)) = 0 ] && modes=(odp pindown copy)
  for m in "${modes[@]}"; do
    case $m in
      odp) run odp "$out/odp-r$r.txt" ;;
      *) run "$m" "$out/$m-r$r.txt" PAGEWIRE_MEMLOCK_LIMIT=unlimited ;;
    esac
  done
done
# At the machine's own locked-memory limit: the first region larger than it is refused.
[ "$summary_only" = 1 ] || run pindown "$out/memlock-default.txt" || true
python3 - "$out" "$rounds" > "$out/summary.md" <<'PY'
import statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
cols = ["attach", "put", "detach", "step"]
rows = {}  # (mode, bytes) -> {col: [per round]}, plus pinned/registrations
for mode in ["copy", "pindown", "odp"]:
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{mode}-r{r}.txt"):
            f = line.split()
            if not f or line.startswith("#") or not f[0].isdigit():
                continue
            d = rows.setdefault((mode, int(f[0])), {c: [] for c in cols + ["pinned", "regs"]})
            for i, c in enumerate(cols):
                d[c].append(float(f[2 + i]))
            d["pinned"].append(int(f[6]))
            d["regs"].append(int(f[7]))
def cell(v):
    m = statistics.median(v)
    return f"{m:.1f} ({min(v):.1f}-{max(v):.1f})" if len(v) > 1 else f"{m:.1f}"
print(f"# A dynamic window whose regions change: attach, put, detach per step ({rounds} rounds)\n")
print("Microseconds per part of a step, median over the rounds of each run's median (range);")
print("pinned peak is the most bytes the window held pinned on rank 0 (its 64 KiB control")
print("page included); registrations are rank 0's per size.\n")
print("| region | mode | attach | put (rank 1, locked) | detach | whole step | pinned peak | registrations |")
print("|---|---|---|---|---|---|---|---|")
for size in sorted({b for _, b in rows}):
    for mode in ["copy", "pindown", "odp"]:
        d = rows.get((mode, size))
        if not d:
            continue
        print(f"| {size} | {mode} | " + " | ".join(cell(d[c]) for c in cols)
              + f" | {max(d['pinned'])} | {d['regs'][0]} |")
print()
print("At the machine's own locked-memory limit (pindown, no PAGEWIRE_MEMLOCK_LIMIT):\n")
for line in open(f"{out}/memlock-default.txt"):
    if line.startswith("pagewire:"):
        print("    " + line.strip())
# The plot's table: attach and detach medians per size and mode.
with open(f"{out}/plot.txt", "w") as f:
    f.write("# bytes attach: copy pindown odp, detach: copy pindown odp (usec)\n")
    for size in sorted({b for _, b in rows}):
        cols = [statistics.median(rows[(m, size)][c]) for c in ("attach", "detach")
                for m in ("copy", "pindown", "odp")]
        f.write(f"{size} " + " ".join(f"{v:.2f}" for v in cols) + "\n")
PY
p="$out/plot.txt"
target/release/pw-plot --title "Dynamic window: attach and detach of a fresh region" \
  --x-label "region [bytes]" --y-label "time [usec]" -o "$out/attach-detach.svg" \
  "attach, copy=$p:1:2" "attach, pindown=$p:1:3" "attach, odp=$p:1:4" \
  "detach, copy=$p:1:5" "detach, pindown=$p:1:6" "detach, odp=$p:1:7"
[ "$summary_only" = 1 ] || run_record_end "$out"
cat "$out/summary.md"
