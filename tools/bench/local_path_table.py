#!/usr/bin/env python3
"""The tables of tools/bench/local_path.sh: pagewire's local path next to MPICH.

Reads the raw outputs that local_path.sh saves in OUTDIR, named CONFIG-BENCH-rROUND.txt:
  CONFIG  mpich (the mpi transport under mpirun), ompi (the same on Open MPI, when it was
          run), local (PAGEWIRE_LOCAL=shm under pwrun), nic (PAGEWIRE_LOCAL=nic,
          PAGEWIRE_MODE=copy, under pwrun);
  BENCH   imb-warm, imb-offcache (imb-bench's IMB-MPI1 tables), api (examples/rsmpi_api's
          tables, in IMB's format: rsmpi itself over MPICH against pagewire) or beff (b_eff's
          summary line).
Writes OUTDIR/rows.tsv (every figure parsed, one per line) and prints a Markdown summary:
per benchmark and message size the MPICH time (median over the rounds) and, for local and
nic, the ratio pagewire / MPICH as `median (min-max)` over the rounds, each round's
pagewire time divided by the MPICH time of the same round (the runs of a round are next
to each other in time). Times are PingPong's t[usec] and the t_avg[usec] of the others;
below 1 = pagewire faster. For b_eff the ratio is of MB/s: above 1 = pagewire better.
With Open MPI's outputs, two columns more: its time and local's ratio over it. Last, per
configuration, Sendrecv's time at 8 B over PingPong's (warm), the same round's runs; and
over every size measured, how many local/MPICH medians are above 1.0 (and in every round),
with the rows above 1.1x or above 1.0 in every round.

Usage: local_path_table.py OUTDIR ROUNDS [SIZES]
  SIZES: comma-separated byte counts with optional K/M suffix (default 0,8,1K,64K,1M,4M), or
  `all` for every size measured.
Standard library only.
"""

import os
import re
import statistics
import sys

CONFIGS = ("mpich", "ompi", "local", "nic")
PAGEWIRE = ("local", "nic")
IMB = (("imb-warm", "warm"), ("imb-offcache", "off_cache -1"), ("api", "rsmpi API"))
BENCH_ORDER = ("PingPong", "Sendrecv", "Exchange", "Allreduce", "Bcast", "Alltoall")
BEFF_LINE = re.compile(r"^b_eff\S*\s*=\s*([0-9.]+)\s*MB/s")


def parse_imb(path):
    """{benchmark: {bytes: time_usec}} from one IMB-MPI1-style output."""
    tables = {}
    name = None
    cols = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.match(r"^#\s*Benchmarking\s+(\S+)", line)
            if m:
                name, cols = m.group(1), None
                tables.setdefault(name, {})
                continue
            if name is None:
                continue
            stripped = line.strip()
            if stripped.startswith("#bytes"):
                cols = stripped.split()
                continue
            if cols and re.match(r"^\d", stripped):
                fields = stripped.split()
                if len(fields) < len(cols):
                    continue
                row = dict(zip(cols, fields))
                t = row.get("t[usec]", row.get("t_avg[usec]"))
                if t is None:
                    continue
                try:
                    tables[name][int(row["#bytes"])] = float(t)
                except ValueError:
                    pass
                continue
            if cols is not None and (stripped == "" or stripped.startswith("#")):
                # The end of this benchmark's table (the next one starts with its own line).
                name, cols = None, None
    return tables


def parse_beff(path):
    """b_eff in MB/s from beff's summary line, or None."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = BEFF_LINE.match(line)
            if m:
                return float(m.group(1))
    return None


def parse_sizes(spec):
    if spec.strip().lower() == "all":
        return None
    out = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        mult = 1
        if item[-1] in "kK":
            mult, item = 1024, item[:-1]
        elif item[-1] in "mM":
            mult, item = 1024 * 1024, item[:-1]
        out.append(int(item) * mult)
    return out


def human(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10} KiB"
    return f"{n} B"


def fmt_time(t):
    if t is None:
        return "—"
    if t >= 100:
        return f"{t:.0f}"
    if t >= 10:
        return f"{t:.1f}"
    return f"{t:.2f}"


def fmt_ratios(ratios):
    if not ratios:
        return "—"
    med = statistics.median(ratios)
    if len(ratios) == 1:
        return f"{med:.2f}"
    return f"{med:.2f} ({min(ratios):.2f}–{max(ratios):.2f})"


def ratios_for(data, key, config, rounds, base="mpich"):
    """Per-round ratios config / base, over the rounds where both were measured."""
    out = []
    for r in rounds:
        p = data.get((config, r), {}).get(key)
        m = data.get((base, r), {}).get(key)
        if p is not None and m:
            out.append(p / m)
    return out


def slower_rows(imb, keys, rounds):
    """The lines that count, over every size measured (not only the table's), the rows whose
    local/MPICH median is above 1.0, those above it in every round, and list the rows above
    1.1x or above 1.0 in every round: a ratio near 1.0 in one round says little."""
    above, every, listed = 0, 0, []
    total = 0
    for key in sorted(keys):
        ratios = ratios_for(imb, key, "local", rounds)
        if not ratios:
            continue
        total += 1
        med = statistics.median(ratios)
        always = len(ratios) > 1 and min(ratios) > 1.0
        above += med > 1.0
        every += always
        if med > 1.1 or always:
            bench_id, bench, nbytes = key
            label = dict(IMB)[bench_id]
            listed.append(f"- {bench}, {label}, {human(nbytes)}: {fmt_ratios(ratios)}")
    out = ["", f"Over every size measured: {above} of {total} local/MPICH medians above 1.0, "
           f"{every} above 1.0 in every round. Above 1.1x, or above 1.0 in every round:"]
    out.extend(listed or ["- none"])
    return out


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    outdir, nrounds = argv[1], int(argv[2])
    sizes = parse_sizes(argv[3] if len(argv) > 3 else "0,8,1K,64K,1M,4M")
    rounds = range(1, nrounds + 1)

    # imb[(config, round)][(bench_id, benchmark, bytes)] = usec
    imb = {}
    beff = {}
    missing = []
    rows = []
    # A run without the rsmpi-API program (API=0) has none of its outputs: not missing.
    ran = {b for b, _ in IMB if any(n.startswith(f"mpich-{b}-r") for n in os.listdir(outdir))}
    with_ompi = any(n.startswith("ompi-") for n in os.listdir(outdir))
    for config in CONFIGS:
        if config == "ompi" and not with_ompi:
            continue
        for r in rounds:
            for bench_id, _label in IMB:
                path = os.path.join(outdir, f"{config}-{bench_id}-r{r}.txt")
                if not os.path.exists(path):
                    if bench_id in ran or bench_id != "api":
                        missing.append(os.path.basename(path))
                    continue
                tables = parse_imb(path)
                if not tables:
                    missing.append(os.path.basename(path) + " (no IMB table)")
                d = imb.setdefault((config, r), {})
                for bench, tab in tables.items():
                    for nbytes, t in tab.items():
                        d[(bench_id, bench, nbytes)] = t
                        rows.append((config, bench_id, bench, r, nbytes, t))
            path = os.path.join(outdir, f"{config}-beff-r{r}.txt")
            if os.path.exists(path):
                v = parse_beff(path)
                if v is None:
                    missing.append(os.path.basename(path) + " (no b_eff line)")
                else:
                    beff.setdefault((config, r), {})["b_eff"] = v
                    rows.append((config, "beff", "b_eff", r, "", v))
            else:
                missing.append(os.path.basename(path))

    with open(os.path.join(outdir, "rows.tsv"), "w", encoding="utf-8") as f:
        f.write("config\tbench\tbenchmark\tround\tbytes\tvalue\n")
        for row in rows:
            f.write("\t".join(str(x) for x in row) + "\n")

    # Every (bench_id, benchmark, bytes) MPICH measured in some round.
    keys = set()
    for (config, _r), d in imb.items():
        if config == "mpich":
            keys.update(d.keys())
    benchmarks = sorted({k[1] for k in keys},
                        key=lambda b: (BENCH_ORDER.index(b) if b in BENCH_ORDER else 99, b))

    def median_of(data, config, key):
        v = [data[(config, r)][key] for r in rounds if key in data.get((config, r), {})]
        return statistics.median(v) if v else None

    out = []
    if with_ompi:
        out.append("| benchmark | run | size | MPICH µs | Open MPI µs | local/MPICH | "
                   "local/OMPI | nic/MPICH |")
        out.append("|---|---|---:|---:|---:|---:|---:|---:|")
    else:
        out.append("| benchmark | run | size | MPICH µs | local/MPICH | nic/MPICH |")
        out.append("|---|---|---:|---:|---:|---:|")
    for bench in benchmarks:
        for bench_id, label in IMB:
            measured = sorted(k[2] for k in keys if k[0] == bench_id and k[1] == bench)
            shown = measured if sizes is None else [s for s in sizes if s in measured]
            for nbytes in shown:
                key = (bench_id, bench, nbytes)
                mpich = fmt_time(median_of(imb, "mpich", key))
                cells = [fmt_ratios(ratios_for(imb, key, c, rounds)) for c in PAGEWIRE]
                if with_ompi:
                    om = median_of(imb, "ompi", key)
                    om = "—" if om is None else fmt_time(om)
                    vs = fmt_ratios(ratios_for(imb, key, "local", rounds, base="ompi"))
                    out.append(f"| {bench} | {label} | {human(nbytes)} | {mpich} | {om} | "
                               f"{cells[0]} | {vs} | {cells[1]} |")
                else:
                    out.append(f"| {bench} | {label} | {human(nbytes)} | {mpich} | "
                               f"{cells[0]} | {cells[1]} |")
    out.append("")
    mpich = median_of(beff, "mpich", "b_eff")
    med = "—" if mpich is None else f"{mpich:.0f}"
    cells = [fmt_ratios(ratios_for(beff, "b_eff", c, rounds)) for c in PAGEWIRE]
    if with_ompi:
        om = median_of(beff, "ompi", "b_eff")
        om = "—" if om is None else f"{om:.0f}"
        vs = fmt_ratios(ratios_for(beff, "b_eff", "local", rounds, base="ompi"))
        out.append("| b_eff | MPICH MB/s | Open MPI MB/s | local/MPICH | local/OMPI | nic/MPICH |")
        out.append("|---|---:|---:|---:|---:|---:|")
        out.append(f"| b_eff | {med} | {om} | {cells[0]} | {vs} | {cells[1]} |")
    else:
        out.append("| b_eff | MPICH MB/s | local/MPICH | nic/MPICH |")
        out.append("|---|---:|---:|---:|")
        out.append(f"| b_eff | {med} | {cells[0]} | {cells[1]} |")
    # Bidirectional against one-way traffic in each configuration: Sendrecv's time over
    # PingPong's at 8 B (warm), each round's runs of one configuration divided.
    out.append("")
    out.append("| Sendrecv 8 B / PingPong 8 B, warm | " +
               " | ".join(c for c in CONFIGS if c != "ompi" or with_ompi) + " |")
    out.append("|---|" + "---:|" * len([c for c in CONFIGS if c != "ompi" or with_ompi]))
    cells = []
    for c in CONFIGS:
        if c == "ompi" and not with_ompi:
            continue
        ratios = []
        for r in rounds:
            d = imb.get((c, r), {})
            sr, pp = d.get(("imb-warm", "Sendrecv", 8)), d.get(("imb-warm", "PingPong", 8))
            if sr is not None and pp:
                ratios.append(sr / pp)
        cells.append(fmt_ratios(ratios))
    out.append("| ratio | " + " | ".join(cells) + " |")
    out.extend(slower_rows(imb, keys, rounds))
    if missing:
        out.append("")
        out.append("Missing or unparsable outputs: " + ", ".join(missing))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
