#!/usr/bin/env bash
# One-sided communication against MPICH: imb-bench's IMB-RMA on pagewire's windows in the
# three buffer modes (pwrun, soft NIC) and on MPICH's windows (the same binary under
# mpirun with --transport mpi), 2 ranks bound to cores, alternating, ROUNDS rounds. Prints
# per benchmark, aggregation mode and size the median time of each and pagewire's over
# MPICH's (below 1: faster than MPICH), with the range over the rounds. Every raw output is
# kept in OUTDIR as CONFIG-rROUND.json and .txt, with summary.md. Needs MPICH's mpirun (the
# `mpi` feature's build).
#
# Configurations: mpich; local (pagewire's local path: shared memory for windows that
# Window::allocate makes, kernel copies into the peer's memory for windows over the
# benchmark's own); copy, pindown, odp (PAGEWIRE_LOCAL=nic: through the soft NIC, where the
# buffer mode applies). WINDOW picks the windows for all of them: create (the default, as
# IMB-RMA's MPI_Win_create over its own buffer) or allocate (MPI_Win_allocate).
#
# Usage: tools/bench/rma.sh [OUTDIR]   (default: target/bench/rma)
# Environment: ROUNDS [3], WINDOW [create], MSGLOG [0:20], TIME [1] (imb-bench -time, seconds per size at
# most), BENCHMARKS [a selection of IMB-RMA's], BUILD [1], PLOT [1] (rma-BENCH.svg of
# Unidir_put, Unidir_get and Accumulate over every size), SUMMARY_ONLY [0] (1: no runs, the
# summary and plots again from the raw outputs in OUTDIR).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/bench/rma}
rounds=${ROUNDS:-3}
msglog=${MSGLOG:-0:20}
secs=${TIME:-1}
read -r -a benchmarks <<<"${BENCHMARKS:-Unidir_put Unidir_get Bidir_put Put_local One_put_all Exchange_put Accumulate Get_accumulate Fetch_and_op Compare_and_swap Truly_passive_put}"
mkdir -p "$out"
source tools/bench/run_record.sh
if [ "${SUMMARY_ONLY:-0}" = 1 ]; then
  # The summary and plots again from the raw outputs already in OUTDIR (RUN.md kept).
  rounds=$(ls "$out"/mpich-r*.json | wc -l)
else
run_record_start "$out" "$0" "$@"
rm -f "$out"/*-r*.json "$out"/*-r*.txt "$out"/summary.md
if [ "${BUILD:-1}" = 1 ]; then
  cargo build --release -q -p imb-bench -p pagewire-tools
  cargo build --release -q -p imb-bench --features mpi --target-dir target/mpi
fi
mpirun=(mpirun)
command -v ssh >/dev/null 2>&1 || mpirun+=(-launcher fork)
args=("${benchmarks[@]}" -msglog "$msglog" -time "$secs" --window "${WINDOW:-create}" --no-progress)
{
  echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "# $(nproc) cpus, $(uname -sr); $("${mpirun[@]}" --version | sed -n 2p | xargs)"
  echo "# rounds $rounds; imb-bench ${args[*]}"
} > "$out/machine.txt"
run() {
  local config=$1 r=$2
  shift 2
  timeout 1800 "$@" "${args[@]}" --json "$out/$config-r$r.json" > "$out/$config-r$r.txt"
}
for r in $(seq 1 "$rounds"); do
  configs=(mpich local copy pindown odp)
  [ $((r % 2)) = 0 ] && configs=(odp pindown copy local mpich)
  for c in "${configs[@]}"; do
    case $c in
      mpich) run mpich "$r" "${mpirun[@]}" -bind-to core -np 2 target/mpi/release/imb-bench \
        --transport mpi ;;
      # The local path (the buffer mode does not apply).
      local) PAGEWIRE_LOCAL=shm run local "$r" target/release/pwrun -n 2 --bind-to core \
        target/release/imb-bench ;;
      # Through the soft NIC, where the buffer mode applies.
      pindown) PAGEWIRE_LOCAL=nic PAGEWIRE_MEMLOCK_LIMIT=unlimited run pindown "$r" \
        target/release/pwrun -n 2 --bind-to core target/release/imb-bench --mode pindown ;;
      *) PAGEWIRE_LOCAL=nic run "$c" "$r" target/release/pwrun -n 2 --bind-to core \
        target/release/imb-bench --mode "$c" ;;
    esac
  done
done
fi
python3 - "$out" "$rounds" <<'PY' | tee "$out/summary.md"
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
mine_configs = [c for c in ("local", "copy", "pindown", "odp") if os.path.exists(f"{out}/{c}-r1.json")]
def tables(config, r):
    res = json.load(open(f"{out}/{config}-r{r}.json"))
    t = {}
    for tab in res["tables"]:
        if tab["invalid"] or tab["processes"] != 2:
            continue
        key = (tab["benchmark"], tab.get("aggregation"))
        t[key] = {row["bytes"]: (row["t_max_usec"], row.get("t_ovrl_usec")) for row in tab["rows"]}
    return t
runs = {c: [tables(c, r) for r in range(1, rounds + 1)] for c in ["mpich"] + mine_configs}
print(open(f"{out}/machine.txt").read().rstrip())
print()
print("Time per operation in µs (median over the rounds; Truly_passive_put: t_ovrl), and "
      "pagewire's over MPICH's, median (min-max over the rounds):")
print()
print("| benchmark | mode | bytes | MPICH µs | " + " | ".join(mine_configs) + " |")
print("|---|---|---|---|" + "---|" * len(mine_configs))
sizes = (8, 4096, 65536, 1048576)
for key in runs["mpich"][0]:
    bench, agg = key
    mode = {"NonAggregate": "non-aggr.", "Aggregate": "aggr."}.get(agg, "")
    for size in sorted(runs["mpich"][0][key]):
        if size not in sizes and not (bench in ("Fetch_and_op", "Compare_and_swap") and size == 4):
            continue
        def t(run):
            v = run.get(key, {}).get(size)
            if v is None:
                return None
            return v[1] if bench == "Truly_passive_put" else v[0]
        base = [t(x) for x in runs["mpich"]]
        if any(b is None or b <= 0 for b in base):
            continue
        cells = []
        for c in mine_configs:
            mine = [t(x) for x in runs[c]]
            if any(m is None for m in mine):
                cells.append("-")
                continue
            ratios = [m / b for m, b in zip(mine, base)]
            cells.append(f"{statistics.median(mine):.2f} µs, {statistics.median(ratios):.2f} "
                         f"({min(ratios):.2f}-{max(ratios):.2f})")
        print(f"| {bench} | {mode} | {size} | {statistics.median(base):.2f} | " + " | ".join(cells) + " |")
# The plots' tables: every size of the non-aggregate runs, median time per configuration.
for bench in ("Unidir_put", "Unidir_get", "Accumulate"):
    key = (bench, "NonAggregate")
    with open(f"{out}/plot-{bench}.txt", "w") as f:
        f.write("# bytes mpich " + " ".join(mine_configs) + " (µs, median over the rounds)\n")
        for size in sorted(runs["mpich"][0].get(key, {})):
            if size == 0:
                continue
            cols = []
            for c in ["mpich"] + mine_configs:
                v = [x.get(key, {}).get(size) for x in runs[c]]
                cols.append(f"{statistics.median(t[0] for t in v):.3f}" if all(v) else "nan")
            f.write(f"{size} " + " ".join(cols) + "\n")
PY
if [ "${PLOT:-1}" = 1 ]; then
  [ -x target/release/pw-plot ] || cargo build --release -q -p pagewire-tools --bin pw-plot
  for bench in Unidir_put Unidir_get Accumulate; do
    # One series per column of the table's header (mpich, local if run, the modes).
    mapfile -t series < <(head -1 "$out/plot-$bench.txt" | awk -v f="$out/plot-$bench.txt" '{
      for (i = 3; i <= NF - 5; i++) {
        name = ($i == "mpich") ? "MPICH 4.0.2" : ($i == "local" ? "local path" : "NIC, " $i)
        printf "%s=%s:1:%d\n", name, f, i - 1
      } }')
    target/release/pw-plot --title "IMB-RMA $bench, non-aggregate, 2 ranks of one host" \
      --y-label "time per operation [usec]" -o "$out/rma-$bench.svg" "${series[@]}"
  done
fi
[ "${SUMMARY_ONLY:-0}" = 1 ] || run_record_end "$out"
