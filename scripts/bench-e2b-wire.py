#!/usr/bin/env python3
"""What E2B's wire costs next to branchbox's own API, on one sandbox of a running branchboxd:
a command (`true`) and a 64 KiB file read, each through our SDK (`/v1`) and through the real
`e2b` SDK (`/e2b`, `/e2b/envd`), and a fork of 10 (`Sandbox.fork(count=10)` in each SDK, timed
to the call's return, every child started), all interleaved so both see the same host load.
Prints one JSON report with p50 and p90 of each, in milliseconds; asserts nothing.

Run with the test environment's Python (target/py, which has both SDKs) against a service:
    BRANCHBOX_URL=http://127.0.0.1:7420 BRANCHBOX_TOKEN=$(cat <data>/service/token) \\
        target/py/bin/python scripts/bench-e2b-wire.py [runs] [fork runs]
"""

import json
import os
import statistics
import sys
import time

url, token = os.environ["BRANCHBOX_URL"].rstrip("/"), os.environ["BRANCHBOX_TOKEN"]
os.environ.update(E2B_API_URL=url + "/e2b", E2B_SANDBOX_URL=url + "/e2b/envd", E2B_API_KEY=token)

import branchbox  # noqa: E402
import e2b  # noqa: E402

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 50
fork_runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
ours = branchbox.Sandbox.create(timeout=600)
try:
    theirs = e2b.Sandbox.connect(ours.sandbox_id)
    ours.files.write("/tmp/read.bin", os.urandom(64 * 1024))
    cases = {
        "exec_native": lambda: ours.commands.run("true", user="root"),
        "exec_e2b": lambda: theirs.commands.run("true", user="root"),
        "read_64k_native": lambda: ours.files.read("/tmp/read.bin", format="bytes"),
        "read_64k_e2b": lambda: theirs.files.read("/tmp/read.bin", format="bytes", user="root"),
    }
    times = {k: [] for k in cases}
    for _ in range(3):  # warm both paths' connections
        for f in cases.values():
            f()
    for _ in range(runs):
        for k, f in cases.items():
            t = time.perf_counter()
            f()
            times[k].append((time.perf_counter() - t) * 1000)


    def fork10(sdk_fork):
        t = time.perf_counter()
        kids = sdk_fork()
        took = (time.perf_counter() - t) * 1000
        started = [k for k in kids if not isinstance(k, Exception)]
        for k in started:
            k.kill()
        if len(started) != 10:
            raise RuntimeError(f"a fork of 10 started {len(started)}: {kids}")
        return took

    forks = {"fork10_native": lambda: ours.fork(count=10), "fork10_e2b": lambda: theirs.fork(count=10)}
    for k in forks:
        times[k] = []
    for _ in range(fork_runs):
        for k, f in forks.items():
            times[k].append(fork10(f))

    def q(v, p):
        return round(statistics.quantiles(v, n=100, method="inclusive")[p - 1], 2)

    print(json.dumps({k: {"p50_ms": round(statistics.median(v), 2), "p90_ms": q(v, 90), "runs": len(v)}
                      for k, v in times.items()}, indent=1))
finally:
    ours.kill()
