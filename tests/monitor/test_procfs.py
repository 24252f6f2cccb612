"""procfs, the one /proc reader the monitor and the calibration probes share, against real processes."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from optuna_memprune import procfs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
MiB = 1024**2


def test_status_of_this_process_agrees_with_psutil() -> None:
    st = procfs.status()
    assert set(st) == {"VmHWM", "VmRSS", "Threads"}
    me = psutil.Process()
    assert st["VmHWM"] >= st["VmRSS"] > 0 and st["Threads"] == me.num_threads()
    assert abs(st["VmRSS"] - me.memory_info().rss) < 8 * MiB
    assert procfs.status(os.getpid())["Threads"] == st["Threads"]


def test_read_own_reads_each_time_afresh_and_a_forked_child_reads_its_own() -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    before = int(procfs.read_own("statm").split()[1]) * page
    block = bytearray(64 * MiB)
    block[::page] = b"x" * len(block[::page])  # touched: resident
    after = int(procfs.read_own("statm").split()[1]) * page
    assert after - before >= 60 * MiB, (before / MiB, after / MiB)
    assert int(procfs.stat_fields(procfs.read_own("stat"))[17]) == psutil.Process().num_threads()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own stat, not the parent's through the inherited descriptor
        try:
            os.write(write, procfs.read_own("stat").split()[0])
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 64) == str(pid).encode()
    os.waitpid(pid, 0)
    os.close(read)
    assert procfs.read_own("stat").split()[0] == str(os.getpid()).encode()
    # a descriptor closed under it (a program closing every descriptor): one read fails, the next opens again
    kept, procfs._own["stat"] = procfs._own["stat"], 999_999  # no descriptor has that number
    os.close(kept)
    with pytest.raises(OSError):
        procfs.read_own("stat")
    assert procfs.read_own("stat").split()[0] == str(os.getpid()).encode()
    del block


def test_status_of_a_gone_process_is_none() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert procfs.status(child.pid) is None


def test_descendants_finds_children_and_grandchildren() -> None:
    code = (
        "import subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']);"
        "print(g.pid, flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(child.stdout.readline())
        assert {child.pid, grandchild} <= set(procfs.descendants(os.getpid()))
        assert procfs.descendants(child.pid) == [grandchild]
    finally:
        for p in psutil.Process(child.pid).children(recursive=True) + [psutil.Process(child.pid)]:
            p.kill()
        child.wait()


def test_reset_peak_brings_the_peak_back_to_the_present_rss() -> None:
    block = bytearray(b"1") * (200 * MiB)
    del block
    before = procfs.status()
    assert before["VmHWM"] - before["VmRSS"] > 150 * MiB
    procfs.reset_peak()
    after = procfs.status()
    assert after["VmHWM"] - after["VmRSS"] < 16 * MiB


def test_fields_of_status_and_stat_files() -> None:
    status = b"Name:\tpython\nState:\tZ (zombie)\nTgid:\t42\nVmRSS:\t   1024 kB\nThreads:\t3\n"
    assert procfs.field(status, b"\nVmRSS:") == 1024 and procfs.field(status, b"\nVmHWM:") == 0
    assert procfs.is_zombie(status) and not procfs.is_zombie(status.replace(b"Z (zombie)", b"S (sleeping)"))
    stat = b"42 (a (odd) name) S 7 42 42 0 -1 " + b" ".join(b"0" for _ in range(13)) + b" 12345 rest"
    fields = procfs.stat_fields(stat)
    assert fields[1] == b"7" and fields[19] == b"12345"
    assert procfs.children(b"12 345 \n") == [12, 345]
    me = procfs.read(f"/proc/{os.getpid()}/stat")
    start = int(procfs.stat_fields(me)[19])
    assert abs(start / os.sysconf("SC_CLK_TCK") + psutil.boot_time() - psutil.Process().create_time()) < 0.05


def test_procfs_imports_the_standard_library_only() -> None:
    tree = ast.parse(Path(procfs.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "os"}, imported
