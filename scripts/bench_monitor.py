"""Measure the Monitor's own CPU cost: a real tree of 3 processes sampled at 10 Hz for about 20 s.

The cost is the CPU time of the monitor thread itself (``time.thread_time()`` inside it, reported as
``Monitor.sampler_cpu_s``) over the wall time. For comparison it also times a pass of the portable psutil
backend (``children(recursive=True)`` plus ``oneshot()`` per process) on the same tree.

    python scripts/bench_monitor.py [--seconds 20] [--interval 0.1] [--pss] [--no-gpu]

Final line: ``MONITOR cpu_pct_of_core=<x> interval_ms=<x> readings=<n>``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import psutil

from optuna_memprune.monitor import Monitor
from optuna_memprune.monitor._proc import open_tree

MiB = 1024**2

# Root holds 64 MiB and starts two children holding 64 MiB each; all wait until the bench closes stdin.
_TREE = """
import subprocess, sys, time
code = 'import sys; x = bytearray(b"1") * (64 << 20); sys.stdin.read()'
kids = [subprocess.Popen([sys.executable, '-c', code], stdin=subprocess.PIPE) for _ in range(2)]
x = bytearray(b"1") * (64 << 20)
time.sleep(0.5)
print("ready", flush=True)
sys.stdin.read()
for k in kids:
    k.stdin.close()
    k.wait()
"""


def start_tree() -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError("the process tree did not start")
    return proc


def psutil_pass_us(pid: int, n: int = 50) -> float:
    tree = open_tree(pid, backend="psutil")
    try:
        t = time.thread_time()
        for _ in range(n):
            tree.read()
        return (time.thread_time() - t) / n * 1e6
    finally:
        tree.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--pss", action="store_true", help="also read PSS (smaps_rollup) every pass")
    parser.add_argument("--no-gpu", action="store_true", help="gpu=None instead of gpu='auto'")
    args = parser.parse_args()

    proc = start_tree()
    try:
        mon = Monitor(proc.pid, interval=args.interval, pss=args.pss, gpu=None if args.no_gpu else "auto")
        t0 = time.monotonic()
        with mon:
            time.sleep(args.seconds)
        wall = time.monotonic() - t0
        peak = mon.peak
        print(
            f"tree: processes={peak.processes} threads={peak.threads} peak_rss={peak.rss / MiB:.1f}MiB "
            f"hwm={peak.hwm / MiB:.1f}MiB pss={None if peak.pss is None else round(peak.pss / MiB, 1)} "
            f"vram={peak.vram} host_processes={len(psutil.pids())}"
        )
        print(
            f"monitor: {mon.readings} readings in {wall:.1f} s, thread cpu {mon.sampler_cpu_s * 1e3:.1f} ms, "
            f"{mon.sampler_cpu_s / max(mon.readings, 1) * 1e6:.0f} us per reading"
        )
        print(f"psutil backend (children(recursive=True) + oneshot): {psutil_pass_us(proc.pid):.0f} us per reading")
        pct = 100.0 * mon.sampler_cpu_s / wall
        print(f"MONITOR cpu_pct_of_core={pct:.3f} interval_ms={args.interval * 1e3:g} readings={mon.readings}")
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
