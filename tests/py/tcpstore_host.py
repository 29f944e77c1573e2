"""Hosts a real torch.distributed.TCPStore for ringwire's tests.

Prints the port it bound, then runs one command per line from stdin through
its own Python client and prints each answer on a line:
    set KEY VALUE | get KEY | add KEY N | check KEY | keys PREFIX... | quit
argv[1]: "libuv" (torch's default server) or "classic" (use_libuv=False).
"""

import datetime
import sys

import torch.distributed as dist

backend = sys.argv[1] if len(sys.argv) > 1 else "libuv"
store = dist.TCPStore(
    "127.0.0.1",
    0,
    1,
    True,
    timeout=datetime.timedelta(seconds=30),
    wait_for_workers=False,
    use_libuv=(backend == "libuv"),
)
print(store.port, flush=True)


def check(key):
    """Whether `key` exists (torch before 2.3 has no TCPStore.check in Python)."""
    if hasattr(store, "check"):
        return store.check([key])
    try:
        store.wait([key], datetime.timedelta(milliseconds=10))
        return True
    except Exception:
        return False


for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "set":
        store.set(args[0], args[1])
        print("ok", flush=True)
    elif cmd == "get":
        print(store.get(args[0]).decode(), flush=True)
    elif cmd == "add":
        print(store.add(args[0], int(args[1])), flush=True)
    elif cmd == "check":
        print(check(args[0]), flush=True)
    elif cmd == "quit":
        break
