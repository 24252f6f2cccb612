"""read_tree and the process-tree backends against real processes that allocate real memory."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time

import psutil
import pytest

from optuna_memprune.exceptions import MemPruneError
from optuna_memprune.monitor import MonitorError, ProcessGone, Reading, read_tree
from optuna_memprune.monitor._proc import _ProcTree, open_tree

from _monitor_worker import Worker

MiB = 1024**2
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")


@pytest.fixture
def worker():
    w = Worker()
    yield w
    w.close()


def psutil_tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def close_to(value: int, expected: int, rel: float = 0.03) -> bool:
    return abs(value - expected) <= rel * expected


def test_reading_is_the_documented_namedtuple() -> None:
    assert Reading._fields == ("t", "rss", "hwm", "threads", "processes", "pss", "vram")


def test_tree_rss_hwm_threads_and_processes_follow_real_allocations(worker: Worker) -> None:
    base = read_tree(worker.pid)
    assert (base.processes, base.threads, base.pss, base.vram) == (1, 1, None, None)
    assert 0 < base.rss <= base.hwm

    worker.cmd(f"alloc a {100 * MiB}")
    r1 = read_tree(worker.pid)
    assert close_to(r1.rss - base.rss, 100 * MiB), (r1.rss - base.rss) / MiB
    assert r1.hwm >= r1.rss

    worker.cmd("spawn")
    base2 = read_tree(worker.pid)
    assert (base2.processes, base2.threads) == (2, 2)

    worker.cmd(f"child alloc b {80 * MiB}")
    r2 = read_tree(worker.pid)
    assert close_to(r2.rss - base2.rss, 80 * MiB), (r2.rss - base2.rss) / MiB
    worker.cmd("child threads 4")
    r2 = read_tree(worker.pid)
    assert r2.processes == 2
    assert r2.threads == 1 + (1 + 4) == sum(p.num_threads() for p in psutil_tree(worker.pid))
    assert close_to(r2.rss, sum(p.memory_info().rss for p in psutil_tree(worker.pid)), rel=0.01)

    worker.cmd("free a")  # RSS drops, the peak (VmHWM) does not
    r3 = read_tree(worker.pid)
    assert close_to(r2.rss - r3.rss, 100 * MiB), (r2.rss - r3.rss) / MiB
    assert r3.hwm - r3.rss >= 0.97 * 100 * MiB
    assert r3.hwm >= r2.hwm - MiB  # the kernel's RSS counters are batched per CPU: a few pages either way


def test_psutil_backend_agrees_with_proc_backend(worker: Worker) -> None:
    worker.cmd(f"alloc a {40 * MiB}")
    worker.cmd("spawn")
    worker.cmd("child threads 2")
    fast, slow = open_tree(worker.pid, backend="proc"), open_tree(worker.pid, backend="psutil")
    try:
        a, b = fast.read(pss=True), slow.read(pss=True)
    finally:
        fast.close()
        slow.close()
    assert (a.processes, a.threads) == (b.processes, b.threads) == (2, 4)
    assert close_to(a.rss, b.rss, rel=0.02)
    assert b.hwm >= b.rss  # psutil backend on Linux: highest RSS seen (a sampled lower bound)
    assert isinstance(b.pss, int) and close_to(a.pss, b.pss, rel=0.05)


@linux_only
def test_pss_is_read_and_not_above_rss(worker: Worker) -> None:
    worker.cmd("spawn")
    worker.cmd(f"child alloc b {60 * MiB}")
    r = read_tree(worker.pid, pss=True)
    assert isinstance(r.pss, int)
    assert 60 * MiB < r.pss <= r.rss * 1.01
    assert read_tree(worker.pid).pss is None


@linux_only
def test_child_forked_from_another_thread_is_found_at_the_next_pass(worker: Worker) -> None:
    tree = _ProcTree(worker.pid, sweep_every=3600.0)  # only the first pass is a full sweep
    try:
        assert tree.read().processes == 1
        child_pid = int(worker.cmd("spawn_thread"))
        # Precondition: the child is not on the main thread's children list, so only the scan of new pids
        # (from /proc/loadavg) can find it before the next full sweep.
        with open(f"/proc/{worker.pid}/task/{worker.pid}/children") as f:
            assert str(child_pid) not in f.read().split()
        r = tree.read()
        assert (r.processes, r.threads) == (2, 3)  # worker: main + forking thread; child: main
    finally:
        tree.close()


def test_read_tree_of_this_process() -> None:
    r = read_tree()
    assert r.processes >= 1 and r.threads >= 1 and 0 < r.rss <= r.hwm
    assert r.vram is None and r.pss is None
    assert abs(r.t - time.monotonic()) < 5


def test_root_that_exited_raises_process_gone_which_pickles(worker: Worker) -> None:
    pid = worker.pid
    worker.kill()
    with pytest.raises(ProcessGone) as info:
        read_tree(pid)
    err = info.value
    assert err.pid == pid and isinstance(err, MonitorError) and isinstance(err, MemPruneError)
    copy = pickle.loads(pickle.dumps(err))
    assert (type(copy), copy.pid, str(copy)) == (ProcessGone, pid, str(err))


@linux_only
def test_zombie_root_counts_as_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(ProcessGone, match="zombie"):
            read_tree(proc.pid)
    finally:
        proc.wait()


def test_bad_pids() -> None:
    for bad in (-1, 0, True, "1", 1.5):
        with pytest.raises(ValueError, match="pid must be"):
            read_tree(bad)  # type: ignore[arg-type]
    with open("/proc/sys/kernel/pid_max") if os.path.exists("/proc/sys/kernel/pid_max") else open(os.devnull) as f:
        pid_max = int(f.read() or 4194304)
    with pytest.raises(ProcessGone):
        read_tree(pid_max + 1)


@linux_only
def test_process_handles_are_the_tree_members(worker: Worker) -> None:
    child_pid = int(worker.cmd("spawn"))
    tree = open_tree(worker.pid)
    try:
        tree.read()
        procs = tree.processes()
        assert sorted(p.pid for p in procs) == sorted([worker.pid, child_pid])
        assert set(procs) == {psutil.Process(worker.pid), psutil.Process(child_pid)}  # psutil compares (pid, start)
        assert tree.processes()[0] is procs[0]  # cached, not remade
    finally:
        tree.close()


_STARTS_COMMANDS = """
import os, subprocess, sys, time
import numpy as np
held = np.ones(200 * 2**20, dtype=np.uint8)
if sys.argv[1] == "fork":  # a child forked without vfork: its own process, counted
    if os.fork() == 0:
        time.sleep(3)
        os._exit(0)
print("ready", flush=True)
end = time.time() + 4
while time.time() < end:
    if sys.argv[1] == "vfork":
        subprocess.run(["true"])  # vfork() then exec: the child runs on this process's memory until its exec
    else:
        time.sleep(0.1)
"""


@linux_only
def test_a_child_between_vfork_and_exec_is_not_counted_twice_a_forked_one_is() -> None:
    # A trial that starts commands (subprocess.run) while it holds 200 MiB: a reading that caught one of its
    # children between vfork() and exec counted the 200 MiB twice (3% of the readings, 2676 of 82,695 in one
    # run), which could stop a trial above half its budget. A child forked without vfork is its own process.
    for mode in ("vfork", "fork"):
        proc = subprocess.Popen([sys.executable, "-c", _STARTS_COMMANDS, mode], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            tree = open_tree(proc.pid)
            held = psutil.Process(proc.pid).memory_info().rss
            doubled = with_child = n = 0
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                r = tree.read()
                n += 1
                with_child += r.processes > 1
                doubled += r.rss > 1.6 * held
            tree.close()
        finally:
            proc.kill()
            proc.wait()
        if mode == "vfork":
            assert with_child > 50, f"only {with_child} of {n} readings saw a command's process"
            assert doubled <= 0.005 * n, f"{doubled} of {n} readings counted the process twice"
        else:
            assert with_child == n and doubled > 0.9 * n, (with_child, doubled, n)
