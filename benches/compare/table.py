"""Merge the JSON outputs of one compare run into one markdown table.

    python3 table.py OUTDIR

OUTDIR holds ringwire-{uring-unix,uring-shm,uring-tcp,portable-tcp}-p{N}.json
and {mpi,mpi-sm,gloo}-p{N}.json (ringwire-bench --json, and the
same field names from mpi_coll.c and torch_gloo_coll.py), or
{...}-p{N}-r{K}.json for round K of several, and meta.txt (lines "key:
value"). With several rounds every cell is the median over the rounds, and
a ratio is the median of the per-round ratios followed by their range (each
round's libraries ran minutes apart, so a round's ratio compares like with
like). A
missing file shows as "n/a" (a peer that was skipped or failed). Standard
library only.
"""

import glob
import json
import os
import re
import statistics
import sys

# (key, column name, file prefix, ringwire transport or None)
# ringwire links local ranks with Unix sockets by default; "-tcp" rows are
# forced onto TCP, like the TCP peers here (the like-for-like comparison);
# "-shm" rows use shared memory, like Open MPI with its own defaults.
PEERS = [
    ("ringwire", "ringwire (uring, unix links)", "ringwire-uring-unix", "uring"),
    ("ringwire_shm", "ringwire (uring, shm links)", "ringwire-uring-shm", "uring-shm"),
    ("ringwire_tcp", "ringwire (uring, TCP)", "ringwire-uring-tcp", "uring-tcp"),
    ("portable", "ringwire (portable, TCP)", "ringwire-portable-tcp", "portable-tcp"),
    ("mpi", "Open MPI (TCP)", "mpi", None),
    ("mpi_sm", "Open MPI (defaults: shared memory)", "mpi-sm", None),
    ("gloo", "gloo", "gloo", None),
]

# Each ratio column: ringwire's variant, the peers it is set against.
TCP_PEERS = ("mpi", "gloo")
RATIOS = [
    ("ringwire_tcp", TCP_PEERS, "uring TCP / best TCP peer"),
    ("ringwire", TCP_PEERS, "uring unix / best TCP peer"),
    ("ringwire_shm", ("mpi_sm",), "uring shm / Open MPI shm"),
]


def human(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def load_file(path, transport):
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    rows = [r for r in d.get("rows", []) if transport is None or r.get("transport") == transport]
    return {r["size_bytes"]: r for r in rows} or None


def rounds_of(out, prefix, p):
    """Round number -> file: 0 for a single-round file, else K of -rK."""
    found = {}
    single = os.path.join(out, f"{prefix}-p{p}.json")
    if os.path.exists(single):
        found[0] = single
    for path in glob.glob(os.path.join(out, f"{prefix}-p{p}-r*.json")):
        m = re.search(r"-r(\d+)\.json$", path)
        if m:
            found[int(m.group(1))] = path
    return found


def load(out, prefix, p, transport):
    """Round -> {size: row}, for the rounds that have this variant. Runs
    before the variants ran apart kept all of ringwire's in ringwire-p*.json."""
    files = rounds_of(out, prefix, p)
    if not files and prefix.startswith("ringwire-"):
        files = rounds_of(out, "ringwire", p)
    per_round = {}
    for k, path in sorted(files.items()):
        rows = load_file(path, transport)
        if rows:
            per_round[k] = rows
    return per_round or None


def median_row(per_round, size):
    """The median over rounds of time (busbw from it) and p50; wrong summed."""
    rows = [r[size] for r in (per_round or {}).values() if size in r]
    if not rows:
        return None
    if len(rows) == 1:
        return rows[0]
    time = statistics.median(r["time_us"] for r in rows)
    p50s = [r["p50_us"] for r in rows if r.get("p50_us") is not None]
    # busbw is inversely proportional to time for a given size and op.
    scale = rows[0]["busbw_gbps"] * rows[0]["time_us"]
    return {
        "time_us": time,
        "busbw_gbps": scale / time if time > 0 else 0.0,
        "p50_us": statistics.median(p50s) if p50s else None,
        "wrong": sum(r.get("wrong", 0) for r in rows),
    }


def round_ratios(data, ours, size, against):
    """ours' busbw / the best of `against`, per round where all ran."""
    out = []
    for k, rows in (data.get(ours) or {}).items():
        peers = [
            data[peer][k][size]["busbw_gbps"]
            for peer in against
            if data.get(peer) and k in data[peer] and size in data[peer][k]
        ]
        if size in rows and peers and max(peers) > 0:
            out.append(rows[size]["busbw_gbps"] / max(peers))
    return out


def main():
    out = sys.argv[1]
    meta = {}
    try:
        with open(os.path.join(out, "meta.txt")) as f:
            for line in f:
                k, _, v = line.partition(":")
                if v:
                    meta[k.strip()] = v.strip()
    except OSError:
        pass
    ranks = sorted(int(x) for x in meta.get("ranks", "2 4").split())
    for k in ("command", "op", "machine", "versions", "settings"):
        if k in meta:
            print(f"{k}: {meta[k]}")
    for k, v in meta.items():
        if k.startswith("memcpy "):
            print(f"before {k[len('memcpy '):]}: memcpy {v}")
    rounds = int(meta.get("rounds", "1") or 1)
    if rounds > 1:
        print(f"rounds: {rounds}, round-robin; every time, busbw and p50 below is the median over"
              " the rounds; each ratio is the median of the per-round ratios, then their range")
    for p in ranks:
        if f"load p{p}" in meta:
            print(f"before p={p}: {meta[f'load p{p}']}")
    print()
    head = ["ranks", "size"]
    for _, name, _, _ in PEERS:
        head += [f"{name} time (us)", f"{name} busbw (GB/s)"]
    head += [label for _, _, label in RATIOS]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---:"] * len(head)) + "|")
    wrong_total = {k: 0 for k, _, _, _ in PEERS}
    missing = []
    for p in ranks:
        data = {}
        for key, _, prefix, transport in PEERS:
            data[key] = load(out, prefix, p, transport)
            if data[key] is None:
                missing.append(f"{key} p={p}")
        sizes = sorted({s for d in data.values() if d for rows in d.values() for s in rows})
        for s in sizes:
            cells = [str(p), human(s)]
            bw = {}
            for key, _, _, _ in PEERS:
                r = median_row(data[key], s)
                if r is None:
                    cells += ["n/a", "n/a"]
                    continue
                wrong_total[key] += r.get("wrong", 0)
                bw[key] = r["busbw_gbps"]
                flag = "" if r.get("wrong", 0) == 0 else " (WRONG)"
                cells += [f"{r['time_us']:.1f}{flag}", f"{r['busbw_gbps']:.3f}"]
            for ours, against, _ in RATIOS:
                peers = [bw[k] for k in against if k in bw]
                if ours in bw and peers and max(peers) > 0:
                    per_round = round_ratios(data, ours, s, against)
                    if len(per_round) > 1:
                        # Each round's ratio compares libraries run minutes
                        # apart; their median, then their range.
                        cell = (f"{statistics.median(per_round):.2f}"
                                f" ({min(per_round):.2f}-{max(per_round):.2f})")
                    else:
                        cell = f"{bw[ours] / max(peers):.2f}"
                    cells.append(cell)
                else:
                    cells.append("n/a")
            print("| " + " | ".join(cells) + " |")
    # Medians: a few slow ops (scheduler ticks, retransmits) move a mean of
    # 20 ops a lot at small sizes; the median shows the typical op.
    print()
    print("Median op time (us), same runs:")
    print()
    print("| ranks | size | " + " | ".join(f"{name} p50 (us)" for _, name, _, _ in PEERS) + " |")
    print("|" + "|".join(["---:"] * (2 + len(PEERS))) + "|")
    for p in ranks:
        data = {key: load(out, prefix, p, t) for key, _, prefix, t in PEERS}
        for s in sorted({s for d in data.values() if d for rows in d.values() for s in rows}):
            cells = [str(p), human(s)]
            for key, _, _, _ in PEERS:
                r = median_row(data[key], s)
                cells.append(f"{r['p50_us']:.1f}" if r and r.get("p50_us") is not None else "n/a")
            print("| " + " | ".join(cells) + " |")
    print()
    print("wrong elements: " + ", ".join(f"{name} {wrong_total[k]}" for k, name, _, _ in PEERS))
    print("ratios: ringwire's busbw (uring over TCP, like the TCP peers; then uring with its"
          " default Unix-socket links between local ranks) / the better of Open MPI over TCP and"
          " gloo at that size; then uring with shared-memory links / Open MPI with its own"
          " defaults (shared memory) (> 1: ringwire faster; equals peer time / ringwire time)")
    others = [f"{k[len('others '):]} {v}" for k, v in meta.items() if k.startswith("others ")]
    if others:
        print("CPU other processes used during each library's sweep (cores; the machine has "
              f"{os.cpu_count()}): " + ", ".join(others))
    phases = [f"{k[len('phase '):]} {v}" for k, v in meta.items() if k.startswith("phase ")]
    if phases:
        print("core-to-core round trip before/after each library's sweep (far: the VM's vCPUs"
              " sat far apart, which slows every TCP library 2-2.5x; such a sweep is not a"
              " fair comparison): " + ", ".join(phases))
    if missing:
        print("missing (skipped or failed, see the logs in " + out + "): " + ", ".join(missing))


if __name__ == "__main__":
    main()
