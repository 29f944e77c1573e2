"""Replays a diagnostic build's rank 0 log (diag-build-patch.py: every send
lane's TCP_INFO at every placement look) through rules for a lane's rate,
and counts the placement looks at which each rule judged a fast lane
clearly slow (under half the fastest) or missed the slow one.

  python3 replay-rate-rules.py RUN_FOLDER/all_reduce-l4-R-rank0.log ...

The slow lane is the one whose busy-time rate over the run's second half
is lowest (lanes.sh slows the first connection it sees carry a megabyte,
not a fixed one). Looks from before the slow lane was slowed (the first
fifth of the run) are not judged."""
import collections, re, sys

def load(path):
    looks = []
    for line in open(path):
        if not line.startswith("DIAG fd"):
            continue
        f = line.split()
        d = {f[i]: f[i + 1] for i in range(1, len(f) - 1, 2)}
        t = re.search(r"tv_sec: (\d+), tv_nsec: (\d+)", line)
        looks.append((d["fd"], int(d["rate"]), d["al"] == "true", int(d["busy"]),
                      int(d["acked"]), int(t.group(1)) + int(t.group(2)) / 1e9))
    return looks

class Kernel:
    """eab6263's rule: a new sample not marked app-limited is kept; a kept
    rate is forgotten 1 s after it was kept."""
    def __init__(s): s.rate, s.at, s.last = 0, None, None
    def see(s, rate, al, busy, acked, t):
        if (rate, al) != s.last and rate > 0 and not al:
            s.rate, s.at = rate / 1e6, t
        elif s.at is not None and t - s.at > 1.0:
            s.rate, s.at = 0, None
        s.last = (rate, al)

class Busy:
    """Bytes acknowledged over each W µs of busy time; the rate is the
    highest of the last k windows (none until k are whole)."""
    def __init__(s, W, k): s.W, s.k, s.base, s.hist, s.rate = W, k, None, [], 0
    def see(s, rate, al, busy, acked, t):
        if s.base is None or busy < s.base[0] or acked < s.base[1]:
            s.base = (busy, acked)
            return
        if busy - s.base[0] >= s.W:
            s.hist.append((acked - s.base[1]) / (busy - s.base[0]))
            s.base = (busy, acked)
            if len(s.hist) >= s.k:
                s.rate = max(s.hist[-s.k:])

def slow_lane(looks):
    fds = sorted(set(x[0] for x in looks))
    half = looks[len(looks) // 2:]
    def rate(fd):
        xs = [x for x in half if x[0] == fd]
        return (xs[-1][4] - xs[0][4]) / max(1, xs[-1][3] - xs[0][3])
    return fds, min(fds, key=rate)

def judge(looks, make):
    fds, slow = slow_lane(looks)
    est = {fd: make() for fd in fds}
    n = missed = fast_as_slow = 0
    last_miss = 0.0
    for i, (fd, *sample) in enumerate(looks):
        est[fd].see(*sample)
        if fd != fds[-1] or i < len(looks) // 5:
            continue
        rates = {f: est[f].rate for f in fds}
        fastest = max(rates.values())
        if fastest == 0:
            continue
        n += 1
        for f in fds:
            clearly = rates[f] > 0 and 2 * rates[f] < fastest
            if f == slow and not clearly:
                missed += 1
                last_miss = i / len(looks)
            fast_as_slow += f != slow and clearly
    return slow, n, missed / n, fast_as_slow / n / (len(fds) - 1), last_miss

rules = [("kernel samples (eab6263)", Kernel), ("busy 50 ms, 1 window", lambda: Busy(50000, 1)),
         ("busy 50 ms, higher of 2", lambda: Busy(50000, 2))]
for path in sys.argv[1:]:
    looks = load(path)
    print(path)
    for name, make in rules:
        slow, n, missed, fast, last = judge(looks, make)
        print(f"  {name:26} slow lane fd {slow}: of {n} looks, missed it at {missed:.2f} "
              f"(the last miss {last:.0%} into the run), a given fast lane judged slow at {fast:.2f}")
