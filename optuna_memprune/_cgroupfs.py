"""This process's Linux cgroup hierarchies as ``/proc/self`` shows them (its cgroup mounts, its group in each,
a group's directory in a mount) and the memory limit its own ancestry puts on it (``host_limit``).

Standard library only (layer 0, below ``cgroups``, which makes the trial groups); reads, never writes, and
knows nothing of trials, budgets, Optuna or the ledger. ``host_limit`` is re-exported by ``cgroups``.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from .units import format_bytes

#: cgroup v1 reports "no limit" as the largest page-aligned signed 64-bit value; anything this big is unlimited.
UNLIMITED = 1 << 62


class HostLimit(NamedTuple):
    """The tightest memory limit of this process's cgroup ancestry: bytes, the group's usage, and where
    it came from (``"cgroup v1 /system.slice/job.scope limit 2.00 GiB"``)."""

    limit: int
    usage: int
    source: str


def read_text(path: str) -> str:
    """The text of a cgroup or /proc file."""
    with open(path) as f:
        return f.read()


def mounts() -> list[tuple[str, str, str, str]]:
    """``(root, mount point, fs type, super options)`` of every cgroup mount of this process."""
    out = []
    for line in read_text("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            out.append((_unescape(fields[3]), _unescape(fields[4]), tail[0], tail[2]))
    return out


def _unescape(field: str) -> str:  # mountinfo writes a space, tab, newline or backslash as octal
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def memberships() -> dict[str, str]:
    """This process's group per controller from /proc/self/cgroup; the v2 group under the key ``""``."""
    out = {}
    for line in read_text("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def group_dir(mount: tuple[str, str, str, str], group: str) -> str | None:
    """The directory of ``group`` in a mounted hierarchy, or None when the mount does not show it."""
    root, point = mount[0].rstrip("/"), mount[1]
    if group != root and not group.startswith(root + "/"):
        return None
    return (point + group[len(root) :]).rstrip("/") or "/"


def host_limit() -> HostLimit | None:
    """The tightest memory limit along this process's cgroup ancestry (the group with the least room left,
    limit less usage: a container's, a Slurm job's, a systemd slice's), or None when none is limited.

    cgroup v2: ``memory.max`` and ``memory.current`` of each ancestor visible in the mount; v1: the same
    of ``memory.limit_in_bytes`` and ``memory.usage_in_bytes``, and ``hierarchical_memory_limit`` of
    ``memory.stat`` (which sees ancestors above the mount's root too)."""
    try:
        hierarchies, groups = mounts(), memberships()
    except (OSError, ValueError):
        return None
    found: list[HostLimit] = []
    for mount in hierarchies:
        if mount[2] == "cgroup2" and "" in groups:
            version, group, files = 2, groups[""], ("memory.max", "memory.current")
        elif mount[2] == "cgroup" and "memory" in mount[3].split(",") and "memory" in groups:
            version, group, files = 1, groups["memory"], ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        path = group_dir(mount, group)
        if path is None:
            continue
        top = mount[1].rstrip("/") or "/"
        name = group
        while True:
            found += _limit_at(path, version, name, files)
            if path.rstrip("/") == top or len(path) <= len(top):
                break
            path, name = os.path.dirname(path), os.path.dirname(name) or "/"
        if version == 1:
            found += _hierarchical(group_dir(mount, group) or "", group)
    if not found:
        return None
    return min(found, key=lambda h: h.limit - h.usage)


def _limit_at(path: str, version: int, name: str, files: tuple[str, str]) -> list[HostLimit]:
    try:
        text = read_text(f"{path}/{files[0]}").strip()
        if text == "max" or int(text) >= UNLIMITED:
            return []
        limit, usage = int(text), int(read_text(f"{path}/{files[1]}").split()[0])
    except (OSError, ValueError, IndexError):
        return []
    return [HostLimit(limit, usage, f"cgroup v{version} {name} limit {format_bytes(limit)}")]


def _hierarchical(path: str, name: str) -> list[HostLimit]:
    try:
        stat = dict(line.split() for line in read_text(f"{path}/memory.stat").splitlines() if line.count(" ") == 1)
        limit = int(stat.get("hierarchical_memory_limit", UNLIMITED))
        usage = int(read_text(f"{path}/memory.usage_in_bytes").split()[0])
    except (OSError, ValueError, IndexError):
        return []
    if limit >= UNLIMITED:
        return []
    return [HostLimit(limit, usage, f"cgroup v1 {name} hierarchical limit {format_bytes(limit)}")]
