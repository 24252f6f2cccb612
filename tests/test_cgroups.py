"""Linux cgroups with real groups of this machine: a kernel-enforced limit (cgroup v1's memory controller or
cgroup v2's), a v2 group without controllers killing a tree whole, reaping the groups of dead runners, and
the host's RAM read from a group's limit. Each test is skipped, with the reason, where the host lacks it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from optuna_memprune import cgroups, procfs

MiB, GiB = 2**20, 2**30
ROOT = Path(__file__).resolve().parent.parent


def _usable(places: list[cgroups.Place]) -> list[cgroups.Place]:
    """The places where this process may really make a group (each probed)."""
    return [p for p in places if cgroups._probe(p) is None]  # noqa: SLF001 - the probe is what place() runs


def _place(memory: bool, version: int | None = None) -> cgroups.Place:
    found, why = cgroups.places()
    usable = [p for p in _usable(found) if p.memory == memory and (version is None or p.version == version)]
    if not usable:
        kind = "a cgroup with a memory controller" if memory else "a cgroup v2 hierarchy without one"
        pytest.skip(
            f"this host gives this process no {kind} it may make groups in "
            f"(found: {[p.label for p in found]}; {'; '.join(why) or 'no reason given'})"
        )
    return usable[0]


def _start(pid: int) -> int | None:
    try:
        fields = procfs.stat_fields(procfs.read(f"/proc/{pid}/stat"))
    except OSError:
        return None
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def _python(code: str, *args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=env, **kw)


def _own_group(version: int) -> str | None:
    """This process's group in the v2 hierarchy or v1's memory hierarchy, read from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if (version == 2 and number == "0" and not controllers) or (
            version == 1 and "memory" in controllers.split(",")
        ):
            return path
    return None


def _own_limit(where: cgroups.Place) -> int | None:
    """The memory limit written on this process's own group (None: unlimited)."""
    name = "memory.max" if where.version == 2 else "memory.limit_in_bytes"
    text = Path(where.path, name).read_text().strip()
    return None if text == "max" or int(text) >= 1 << 60 else int(text)


def test_place_is_this_processs_own_group_and_host_limit_sees_its_limit() -> None:
    where, reason = cgroups.place()
    assert (where is None) == bool(reason)
    if where is None:  # then the reason names what is missing, and nothing here is limited by a group we see
        assert "cgroup" in reason, reason
        return
    assert where.label.startswith("cgroup v") and os.path.isdir(where.path)
    assert where.name == _own_group(where.version) and where.path.rstrip("/").endswith(where.name.rstrip("/"))
    if where.version == 1:
        assert where.memory  # v1 groups are made in the memory hierarchy only
    else:
        assert where.memory == ("memory" in Path(where.path, "cgroup.controllers").read_text().split())
    limit = cgroups.host_limit()
    own = _own_limit(where) if where.memory else None
    if own is not None:  # a limited own group is seen (the tightest room may be an ancestor's)
        assert limit is not None and limit.limit > 0 and limit.source.startswith("cgroup v"), limit
    if limit is None:
        assert own is None


def test_a_burst_over_the_limit_is_killed_by_the_kernel_with_the_exact_peak() -> None:
    where = _place(memory=True)
    group, reason = cgroups.TrialGroup.create(where, 900001)
    assert group is not None, reason
    try:
        assert os.path.basename(group.path).startswith(f"memprune-{os.getpid()}-")
        group.limit(100 * MiB, 90 * MiB)
        assert group.hard_limit() == 100 * MiB
        # the process joins, lowers the limit by its own RSS, then touches 300 MiB at once
        proc = _python(
            """
            import sys
            from optuna_memprune import cgroups
            spec = cgroups.Join(sys.argv[1], int(sys.argv[2]), 100 * 2**20, 90 * 2**20)
            print(cgroups.join(spec), flush=True)
            block = bytearray(300 * 2**20)
            print("survived", flush=True)
        """,
            group.path,
            str(where.version),
            stdout=subprocess.PIPE,
            text=True,
        )
        out, _ = proc.communicate(timeout=120)
        r0 = int(out.split()[0])
        assert proc.returncode == -signal.SIGKILL and "survived" not in out
        assert group.oom_kills() == 1
        assert group.hard_limit() == (100 * MiB - r0) // cgroups.PAGE * cgroups.PAGE
        peak = group.peak()
        if peak is not None:  # cgroup v2 before Linux 5.19 has no memory.peak
            assert 50 * MiB < peak + r0 <= 100 * MiB
        assert group.ran() and group.pids() == []
    finally:
        assert group.remove()
    assert not os.path.exists(group.path)


def test_a_v2_group_without_controllers_kills_a_tree_whole_and_is_removed() -> None:
    where = _place(memory=False, version=2)
    group, reason = cgroups.TrialGroup.create(where, 900002)
    assert group is not None, reason
    try:
        with pytest.raises(OSError):
            group.limit(100 * MiB)  # no memory controller: no limit, the caller polls
        # a process in the group starts a grandchild in a session of its own that ignores SIGTERM, then exits
        proc = _python(
            """
            import os, signal, subprocess, sys
            from optuna_memprune import cgroups
            cgroups.join(cgroups.Join(sys.argv[1], 2, None, None))
            subprocess.Popen([sys.executable, "-c", "import os, signal, time; "
                              "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(os.getpid(), flush=True); "
                              "time.sleep(120)"], start_new_session=True)
        """,
            group.path,
            stdout=subprocess.PIPE,
            text=True,
        )
        grandchild = int(proc.stdout.readline())  # once it ignores SIGTERM; it holds the pipe: no communicate()
        proc.wait(timeout=60)
        proc.stdout.close()
        start = _start(grandchild)
        assert start is not None and group.pids() == [grandchild] and group.ran()
        os.kill(grandchild, signal.SIGTERM)  # ignored
        time.sleep(0.2)
        assert _start(grandchild) == start
        assert group.kill()
        assert _start(grandchild) != start  # gone (or a zombie of its new parent)
    finally:
        assert group.remove()
    assert not os.path.exists(group.path)


def test_groups_of_a_dead_runner_are_reaped_and_a_live_runners_are_kept() -> None:
    where = (
        _place(memory=False, version=2)
        if not _usable([p for p in cgroups.places()[0] if p.memory])
        else _place(memory=True)
    )
    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead_start = _start(dead.pid)
    dead.kill()
    dead.wait()
    left = f"{where.path}/memprune-{dead.pid}-{dead_start}-3"
    os.mkdir(left)
    mine, reason = cgroups.TrialGroup.create(where, 900003)
    twin, _ = cgroups.TrialGroup.create(where, 900003)  # another study's trial of the same number
    assert mine is not None and twin is not None, reason
    assert twin.path == mine.path + ".1"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with open(f"{left}/cgroup.procs", "w") as f:
            f.write(str(sleeper.pid))  # a trial's process its runner left behind
        reaped = cgroups.reap(where)  # with this one, any other dead runner's group the suite left there
        assert os.path.basename(left) in reaped, reaped
        for name in reaped:  # memprune-<runner pid>-<its start>-<trial>: only groups of runners that are gone
            pid, start = name.split("-")[1:3]
            assert _start(int(pid)) != int(start), name
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert not os.path.exists(left) and os.path.isdir(mine.path) and os.path.isdir(twin.path)
    finally:
        sleeper.kill()
        sleeper.wait()
        mine.remove()
        twin.remove()
        if os.path.exists(left):
            os.rmdir(left)


def test_host_ram_auto_comes_from_a_2gib_cgroup_limit_and_names_it() -> None:
    where = _place(memory=True)
    group, reason = cgroups.TrialGroup.create(where, 900004)
    assert group is not None, reason
    try:
        group.limit(2 * GiB)
        procs = f"{group.path}/cgroup.procs"

        def enter() -> None:  # in the new process, before it runs Python: it starts inside the group
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                "from optuna_memprune.ledger import HostBudget, describe, physical_ram\n"
                "c = HostBudget(ram='auto', gpus=None, headroom=0.0).resolve()\n"
                "print(c.ram); print(c.source); print(physical_ram()[0]); print(describe(c))",
            ],
            env=env,
            preexec_fn=enter,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.splitlines()
        ram, source, physical = int(out[0]), out[1], int(out[2])
        assert 0 < ram <= 2 * GiB
        assert source.startswith(f"cgroup v{where.version} ") and "limit 2.00 GiB" in source, source
        assert physical == 2 * GiB
        assert out[3].endswith(f"(ram from {source})"), out[3]  # what the runner logs at its start
    finally:
        assert group.remove()
