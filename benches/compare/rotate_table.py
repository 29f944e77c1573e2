#!/usr/bin/env python3
"""Medians of `device.sh rotate`'s runs: for each world size and message
size, each label's median time (us) over the rounds and its speed-up over
the first label (and over Open MPI, labelled mpi).

    python3 benches/compare/rotate_table.py DIR   # DIR holds LABEL-pP-rK.json
"""
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main(folder):
    times = defaultdict(list)  # (label, p, size) -> [us]
    labels = []
    for f in sorted(Path(folder).glob("*.json")):
        m = re.match(r"(.+)-p(\d+)-r(\d+)\.json$", f.name)
        if not m:
            continue
        label, p = m.group(1), int(m.group(2))
        if label not in labels:
            labels.append(label)
        try:
            rows = json.loads(f.read_text())["rows"]
        except (ValueError, KeyError):
            continue
        for row in rows:
            if row.get("wrong"):
                print(f"{f.name}: {row['wrong']} wrong elements at {row['size_bytes']} B")
            times[(label, p, row["size_bytes"])].append(row["time_us"])
    labels.sort(key=lambda l: (l == "mpi", l != "old", l))
    base = labels[0]
    print("| ranks | bytes | " + " | ".join(f"{l} us" for l in labels)
          + " | " + " | ".join(f"{l} / {base}" for l in labels[1:] if l != "mpi")
          + (" | " + " | ".join(f"{l} / mpi" for l in labels if l != "mpi") if "mpi" in labels else "")
          + " |")
    keys = sorted({(p, s) for (_, p, s) in times})
    for p, s in keys:
        med = {l: statistics.median(times[(l, p, s)]) for l in labels if times[(l, p, s)]}
        cells = [f"{med[l]:.1f}" if l in med else "n/a" for l in labels]
        ratio = lambda a, b: f"{med[b] / med[a]:.2f}" if a in med and b in med else "n/a"
        cells += [ratio(l, base) for l in labels[1:] if l != "mpi"]
        if "mpi" in labels:
            cells += [ratio(l, "mpi") for l in labels if l != "mpi"]
        print(f"| {p} | {s} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
