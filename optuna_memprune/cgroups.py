"""Linux control groups of this process: where its trial groups can go, one trial's group (hard limit, soft
line, exact peak, OOM kills, whole-tree kill, removal), reaping the groups of dead runners, and the memory
limit that this process's own ancestry puts on it (``host_limit``, read by ``_cgroupfs`` and re-exported here).

Standard library only (layer 0, next to ``procfs``); knows nothing of trials, budgets, Optuna or the ledger.
Never raises into its caller for a host without cgroups: what cannot be made is ``None`` with a reason.
Groups are made only below this process's own group (cgroup v2 with a memory controller, cgroup v1's
memory controller, or a v2 hierarchy without controllers, which still kills a tree whole).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from typing import NamedTuple

from . import procfs
from ._cgroupfs import UNLIMITED, group_dir, memberships, mounts, read_text
from ._cgroupfs import HostLimit as HostLimit  # re-exported: the ledger and the tests take it from here
from ._cgroupfs import host_limit as host_limit

PREFIX = "memprune-"
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_KILL_S = 2.0  # killing a group's processes until none is left, at most this long
_REMOVE_S = 1.0  # rmdir of a group whose last processes are still exiting, retried this long


class Place(NamedTuple):
    """Where this process's trial groups go: the directory of its own group in one hierarchy.

    ``version`` is 1 or 2, ``name`` the group's path in its hierarchy (``/system.slice/job.scope``), ``memory``
    whether groups made here get memory limits (else a v2 group gives the whole-tree kill only)."""

    version: int
    path: str
    name: str
    memory: bool

    @property
    def label(self) -> str:
        """``"cgroup v1"``, ``"cgroup v2"`` or ``"cgroup v2 (no memory controller)"``."""
        return f"cgroup v{self.version}" + ("" if self.memory else " (no memory controller)")


class Join(NamedTuple):
    """What a trial's process needs to enter its group and set its own limits (picklable): the group's
    directory, its version and, in bytes of the whole tree's RSS, the hard limit and the soft line (v2
    ``memory.high``) or None."""

    path: str
    version: int
    hard: int | None
    high: int | None


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _owner_tag() -> str:
    """``memprune-<pid>-<start ticks since boot>-``: the prefix of every group this process makes."""
    return f"{PREFIX}{os.getpid()}-{int(procfs.stat_fields(procfs.read('/proc/self/stat'))[19])}-"


def place() -> tuple[Place | None, str]:
    """Where this process's trial groups can go, best first: cgroup v2 with a memory controller, cgroup
    v1's memory controller, a v2 hierarchy without one; ``(None, reason)`` where no group can be made.

    Every candidate is tried by making (and removing) a probe group, so a read-only or undelegated
    hierarchy is refused here, not at the first trial."""
    candidates, why = places()
    if not candidates and not why:
        return None, "no cgroup hierarchy of this process is mounted (no cgroupfs)"
    for cand in candidates:
        made = _probe(cand)
        if made is None:
            return cand, ""
        why.append(f"{cand.label} {cand.name}: {made}")
    return None, "; ".join(why)


def places() -> tuple[list[Place], list[str]]:
    """Every place of this process's own groups, best first (not yet probed), and why a v2 group has no
    memory controller for sub-groups, where it has none."""
    try:
        hierarchies, groups = mounts(), memberships()
    except (OSError, ValueError) as exc:
        return [], [f"this process's cgroups cannot be read ({exc})"]
    candidates, why = [], []
    for mount in hierarchies:
        if mount[2] == "cgroup2" and "" in groups:
            path = group_dir(mount, groups[""])
            if path is not None:
                candidates.append(Place(2, path, groups[""], False))
        elif mount[2] == "cgroup" and "memory" in mount[3].split(",") and "memory" in groups:
            path = group_dir(mount, groups["memory"])
            if path is not None:
                candidates.append(Place(1, path, groups["memory"], True))
    for cand in [c for c in candidates if c.version == 2]:
        memory, reason = _v2_memory(cand)
        if memory is not None:
            candidates.insert(0, memory)
        elif reason:
            why.append(reason)
    return sorted(candidates, key=lambda c: not c.memory), why  # stable: v2 with memory, v1, v2 without


def _v2_memory(cand: Place) -> tuple[Place | None, str]:
    """The v2 place with memory limits, enabling the controller for sub-groups where it is delegated to
    this group but not yet enabled. cgroup v2 lets no group with processes of its own do that, so a runner
    alone in its group moves into a leaf of its own (``memprune-<pid>-<start>-runner``) first."""
    path, name = cand.path, cand.name
    if os.path.basename(path) == f"{_owner_tag()}runner":  # this runner's own leaf, made by an earlier call
        path, name = os.path.dirname(path), os.path.dirname(name) or "/"
    try:
        if "memory" not in read_text(f"{path}/cgroup.subtree_control").split():
            if "memory" not in read_text(f"{path}/cgroup.controllers").split():
                return None, f"cgroup v2 {name}: no memory controller is delegated to it"
            if [int(p) for p in read_text(f"{path}/cgroup.procs").split()] == [os.getpid()]:
                os.makedirs(f"{path}/{_owner_tag()}runner", exist_ok=True)
                _write(f"{path}/{_owner_tag()}runner/cgroup.procs", str(os.getpid()))
            _write(f"{path}/cgroup.subtree_control", "+memory")
    except (OSError, ValueError) as exc:
        return None, (
            f"cgroup v2 {name}: the memory controller cannot be enabled for its sub-groups ({exc}); "
            "run the study alone in a delegated group"
        )
    return cand._replace(path=path, name=name, memory=True), ""


def _probe(cand: Place) -> str | None:
    """None when a group can be made (and removed) at ``cand``, else why not."""
    probe = f"{cand.path}/{_owner_tag()}probe"
    try:
        os.mkdir(probe)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot make a group there ({exc.strerror})"
    try:
        need = ["cgroup.procs", "memory.limit_in_bytes" if cand.version == 1 else "memory.max"]
        missing = [n for n in need[: 1 + cand.memory] if not os.path.exists(f"{probe}/{n}")]
        return f"a new group lacks {', '.join(missing)}" if missing else None
    finally:
        _rmdir(probe)


class TrialGroup:
    """One trial's group, below this process's own: made by ``create``, limited, joined by the trial's
    process (``join``), read, killed and removed by the runner."""

    def __init__(self, where: Place, path: str) -> None:
        self.place, self.path = where, path

    @classmethod
    def create(cls, where: Place, number: int) -> tuple[TrialGroup | None, str]:
        """A new group named ``memprune-<pid>-<start ticks>-<number>`` (its owner recognisable by pid and
        start time; ``<number>.<k>`` where another study of this process has one of that number), or
        ``(None, reason)``."""
        base = f"{where.path}/{_owner_tag()}{number}"
        for path in (base, *(f"{base}.{k}" for k in range(1, 100))):
            try:
                os.mkdir(path)
                return cls(where, path), ""
            except FileExistsError:
                continue
            except OSError as exc:
                return None, f"the trial's cgroup could not be made ({exc.strerror or exc})"
        return None, f"the trial's cgroup could not be made ({base} and 99 others exist)"

    memory = property(lambda self: self.place.memory)

    def _file(self, v1: str, v2: str) -> str:
        return f"{self.path}/{v1 if self.place.version == 1 else v2}"

    def limit(self, hard: int, high: int | None = None) -> None:
        """Set the hard limit (v1 ``memory.limit_in_bytes``, v2 ``memory.max``; no swap beyond it) and, on
        v2, ``memory.high``; OSError where the group has no memory controller or refuses."""
        _set_limits(self.path, self.place.version, hard, high)

    def join_spec(self, hard: int | None, high: int | None) -> Join:
        """What the trial's process passes to ``join``."""
        return Join(self.path, self.place.version, hard if self.memory else None, high if self.memory else None)

    def add(self, pid: int) -> None:
        """Move process ``pid`` (and its threads) into the group."""
        _write(f"{self.path}/cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in read_text(f"{self.path}/cgroup.procs").split()]
        except (OSError, ValueError):
            return []

    def hard_limit(self) -> int | None:
        """The hard limit in place now, bytes; None when unlimited or unreadable."""
        try:
            text = read_text(self._file("memory.limit_in_bytes", "memory.max")).strip()
        except OSError:
            return None
        return None if text == "max" or int(text) >= UNLIMITED else int(text)

    def peak(self) -> int | None:
        """The exact peak charge of the group (v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak`` where
        the kernel has it, since Linux 5.19); None where there is none."""
        try:
            return int(read_text(self._file("memory.max_usage_in_bytes", "memory.peak")).split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def usage(self) -> int:
        """What the group is charged now (v1 ``memory.usage_in_bytes``, v2 ``memory.current``); once its
        processes are gone, that is the page cache they left (still charged to it); 0 where unreadable."""
        try:
            return int(read_text(self._file("memory.usage_in_bytes", "memory.current")).split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer killed in the group (v1 ``memory.oom_control``, v2
        ``memory.events``); 0 where not counted."""
        try:
            text = read_text(self._file("memory.oom_control", "memory.events"))
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def ran(self) -> bool:
        """Whether any process ever ran in the group (charged memory, or v2 CPU time)."""
        if self.memory and (self.peak() or 0) > 0:
            return True
        if self.place.version == 2:
            try:
                for line in read_text(f"{self.path}/cpu.stat").splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec":
                        return int(value) > 0
            except (OSError, ValueError):
                pass
        return False

    def kill(self) -> bool:
        """SIGKILL every process in the group (v2 ``cgroup.kill``; else each pid of ``cgroup.procs`` until
        none is left, for at most ``_KILL_S``); whether the group is empty now."""
        return _kill(self.path)

    def remove(self) -> bool:
        """Kill what is left, then remove the group (rmdir, retried while its last processes exit);
        whether it is gone."""
        _kill(self.path)
        return _rmdir(self.path)


def _set_limits(path: str, version: int, hard: int, high: int | None) -> None:
    hard = max(PAGE, hard // PAGE * PAGE)
    if version == 1:
        _write(f"{path}/memory.limit_in_bytes", str(hard))
        _try_write(f"{path}/memory.memsw.limit_in_bytes", str(hard))  # where swap is accounted: none beyond
    else:
        if high is not None:
            _write(f"{path}/memory.high", str(max(PAGE, high // PAGE * PAGE)))
        _write(f"{path}/memory.max", str(hard))
        _try_write(f"{path}/memory.swap.max", "0")


def _try_write(path: str, text: str) -> None:
    try:
        _write(path, text)
    except OSError:  # the file is optional: the limit stands without it
        pass


def join(spec: Join) -> int:
    """Move this process into its trial's group, then lower the limits by its present RSS ``r0``.

    A process forked from a server shares (and is not charged for) the pages it inherited: the group
    charges only what it allocates or copies from now on, so the tree's RSS stays within ``hard`` when
    the charge stays within ``hard - r0``. The limit is in place before this returns; returns ``r0``."""
    _write(f"{spec.path}/cgroup.procs", str(os.getpid()))
    r0 = (procfs.status() or {}).get("VmRSS", 0)
    if spec.hard is not None:
        high = None if spec.high is None else spec.high - r0
        _set_limits(spec.path, spec.version, spec.hard - r0, high)
    return r0


def _kill(path: str) -> bool:
    procs = f"{path}/cgroup.procs"
    if os.path.exists(f"{path}/cgroup.kill"):
        try:
            _write(f"{path}/cgroup.kill", "1")
        except OSError:
            pass
    deadline = time.monotonic() + _KILL_S
    while True:
        try:
            pids = [int(p) for p in read_text(procs).split()]
        except (OSError, ValueError):
            return True  # gone
        if not pids:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


def _rmdir(path: str) -> bool:
    deadline = time.monotonic() + _REMOVE_S
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                return False
        time.sleep(0.02)


def _alive(pid: int, start: int) -> bool:
    """Whether process ``pid`` runs and started at ``start`` clock ticks after boot (the ledger's rule: a
    pid with its start time; a pid alone may have been given to a new process)."""
    try:
        fields = procfs.stat_fields(procfs.read(f"/proc/{pid}/stat"))
    except OSError:
        return False
    return fields[0] not in (b"Z", b"X") and int(fields[19]) == start


def reap(where: Place) -> list[str]:
    """Kill and remove the groups that dead runners left at ``where`` (a runner killed before it could);
    the names of those removed."""
    out: list[str] = []
    try:
        names = os.listdir(where.path)
    except OSError:
        return out
    for name in names:
        parts = name[len(PREFIX) :].split("-") if name.startswith(PREFIX) else []
        if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()):
            continue
        if _alive(int(parts[0]), int(parts[1])):
            continue
        path = f"{where.path}/{name}"
        _kill(path)
        if _rmdir(path):
            out.append(name)
    return out
