# Sourced by the scripts in tools/bench/: records how a run was made in OUTDIR/RUN.md, so that
# every published table can be traced to its command, commit, machine and load.
#   run_record_start OUTDIR "$0" "$@"   at the start (after OUTDIR exists)
#   run_record_end OUTDIR               at the end
# RUN.md: the command line, the PAGEWIRE_* settings and the script's own variables in force,
# the commit (and whether the work tree had changes), the date, the machine and the load
# before and after.

run_record_start() {
  local out=$1
  shift
  local commit dirty=""
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null | grep -v ' docs/results/' || true)" ]; then
    dirty=" (with uncommitted changes)"
  fi
  RUN_RECORD_T0=$(date +%s)
  {
    echo "# How this run was made"
    echo
    echo "- command: \`$*\`"
    echo "- settings: \`$(env | grep -E '^(PAGEWIRE_|ROUNDS=|MSGLOG=|ITERS=|NP=|SIZES=|IMB_ARGS=|BEFF_ARGS=|OMPI=|TIMEOUT=|BUILD=|API=|IMB_BENCHMARKS=|WINDOW=|STARTS=|BENCHES=)' | sort | tr '\n' ' ' | sed 's/ $//')\`"
    echo "- commit: $commit$dirty"
    echo "- date: $(date -u +%FT%TZ)"
    echo "- machine: $(uname -sr), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
    echo "- load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  } > "$out/RUN.md"
}

run_record_end() {
  local out=$1
  {
    echo "- load after: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- run time: $(( $(date +%s) - ${RUN_RECORD_T0:-$(date +%s)} )) s"
  } >> "$out/RUN.md"
}
