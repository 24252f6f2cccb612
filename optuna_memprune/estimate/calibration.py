"""The cache of this host's measured baselines: one JSON file per set of versions, read, filled on a miss, saved,
and its stack baseline rechecked once per process (the rule in ``recheck``; the file's format and its locked,
atomic write: ``_cache_file``).

Knows nothing of how a probe measures (``probes``, run by ``baselines``), of recipes, Optuna or Footprints.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import platform
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

from ..exceptions import CalibrationError
from ..paths import ENV_VAR, CacheDirError, cache_dir, writable_dir
from . import recheck
from ._cache_file import SCHEMA, parse, write_merged
from .baselines import (
    KERNEL_CONVS,
    THREAD_POINTS,
    CpuKernels,
    CudaCosts,
    EnvProfile,
    StackBaseline,
    run_probe,
    run_probes,
)

T = TypeVar("T")

__all__ = ["Calibration", "CpuKernels", "CudaCosts", "EnvProfile", "StackBaseline", "cache_dir", "load", "versions"]

_logger = logging.getLogger("optuna_memprune.estimate.calibration")

#: Libraries every probe loads: their versions (with the interpreter's and the platform's) key the cache file.
#: A recipe's own libraries key the entries it asks for (``versioned`` below), not the whole file.
CORE = ("torch", "numpy")


def versions(dists: Iterable[str] = CORE, *, platform_too: bool = True) -> dict[str, str]:
    """The versions of the installed ``dists`` (with the interpreter and platform unless ``platform_too`` is
    False): what keys the calibration cache file (``CORE``) or one of its entries (a recipe's ``VERSIONED``)."""
    out = (
        {"python": platform.python_version(), "machine": platform.machine(), "system": platform.system()}
        if platform_too
        else {}
    )
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _key(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _stack_key(imports: tuple[str, ...], train: bool, versioned: Iterable[str]) -> str:
    key = f"stack:{','.join(imports)}:{int(train)}"
    versioned = sorted(set(versioned))
    return key + (f":{_key(versions(versioned, platform_too=False))}" if versioned else "")


_MALFORMED = (KeyError, IndexError, TypeError, ValueError, AttributeError)


@dataclass
class Calibration:
    """This host's measured baselines, loaded from (and saved to) the cache file for these versions.

    Each getter returns the cached figures, measuring them now (a probe in a fresh interpreter, seconds) and
    saving the file when they were never measured, or when the cached entry is malformed (a hand-edited file:
    a warning says so). ``versioned`` names the libraries (distributions) whose versions key an entry beyond
    the file's: a new version of any of them measures that entry anew.

    An entry records when it was measured (``measured_at``, wall clock) and this host's memory then
    (``host``: MemAvailable and the page cache, ``/proc/meminfo``); the stack probe's figures hold the
    file-backed pages of its RSS. The first stack baseline a process reads from the cache is rechecked
    (``_recheck``): once per process and cache file, unless measured or rechecked in the last
    ``recheck.RECENT_S`` seconds or ``MEMPRUNE_RECHECK=0``.

    Several processes may share the file: each save merges this process's entries into what is on disk, under
    a lock file beside it (``fcntl.flock``), and replaces the file atomically; a concurrent reader never sees
    half a file and no process's entries are lost.
    """

    path: Path
    data: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _writable: bool = field(default=False, repr=False, compare=False)

    def save(self) -> None:
        """Write this process's entries, merged with the file's current ones (the file's win where both have
        a key: it is the newer measurement), atomically under the lock."""
        with self._lock:
            self._write()

    def forget(self) -> None:
        """Drop every measured figure, here and in the file (the next getters measure anew)."""
        with self._lock:
            self.data = {"schema": SCHEMA, "versions": versions()}
            self._write(replace=True)

    def _write(
        self,
        entry: tuple[str, str | None, Any] | None = None,
        *,
        replace: bool = False,
        stale_before: float | None = None,
    ) -> list[str]:
        """Merge ``self.data`` (and ``entry``: section, key or None, value) into the file under the lock; with
        ``stale_before``, drop the keyed entries measured before that time (but ``entry``). The dropped keys."""
        self._check_writable()
        try:
            merged, dropped = write_merged(self.path, self.data, entry, replace=replace, stale_before=stale_before)
        except OSError as exc:
            raise CalibrationError(
                f"cannot write the calibration cache {str(self.path)!r}: "
                f"{exc.strerror or exc}; set {ENV_VAR} to a writable directory."
            ) from None
        self.data = merged
        return dropped

    def _check_writable(self) -> None:
        """The cache directory can be written (checked once, before the first probe: a probe's seconds are
        never spent on a figure that cannot be kept)."""
        if not self._writable:
            writable_dir(self.path.parent)
            self._writable = True

    def _cached(self, section: str, key: str | None, build: Callable[[Any], T]) -> T | None:
        """The cached entry built into its value; None when absent or malformed (then a warning says so)."""
        raw = self.data.get(section)
        if key is not None:
            raw = raw.get(key) if isinstance(raw, dict) else None
        if raw is None:
            return None
        try:
            return build(raw)
        except _MALFORMED as exc:
            _logger.warning(
                "The calibration entry %s in %s is malformed (%s): measuring it again.", key or section, self.path, exc
            )
            return None

    def stack(self, imports: Iterable[str], *, train: bool = True, versioned: Iterable[str] = ()) -> StackBaseline:
        """The baseline of a process importing ``imports``; measured now (and cached) if never measured."""
        imports = tuple(sorted(set(imports)))
        if "torch" not in imports:
            train = False
        key = _stack_key(imports, train, versioned)

        def build(raw: Any) -> StackBaseline:
            return StackBaseline.from_raw(imports, train, raw)

        with self._lock:
            found = self._cached("stacks", key, build)
            if found is not None and _RECHECKED.get(self.path) != "done":
                found = self._recheck(imports, train, key, build) or found
            if found is not None:
                return found
            self._check_writable()
            _logger.info(
                "Calibrating the baseline of a process importing %s (one-off, a few seconds).",
                ", ".join(imports) or "nothing",
            )
            raw = self._measure_stack(imports, train)
            value = build(raw)
            self._write(("stacks", key, raw))
        return value

    def _measure_stack(
        self, imports: tuple[str, ...], train: bool, first: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The stack probe at each thread count, with when and under which memory conditions; ``first``: the
        probe's result at one torch thread, already measured."""
        points = THREAD_POINTS if "torch" in imports else (1,)
        conditions, at = recheck.host(), time.time()
        todo = [n for n in points if first is None or n != 1]
        probes = dict(
            zip(
                todo,
                run_probes("stack", [{"imports": list(imports), "train": train, "threads": n} for n in todo])
                if todo
                else [],
                strict=True,
            )
        )
        if first is not None:
            probes[1] = first
        return {"points": [[n, probes[n]] for n in points], "measured_at": at, "host": conditions}

    def _recheck(self, imports: tuple[str, ...], train: bool, key: str, build: Callable[[Any], T]) -> T | None:
        """Recheck the cached stack ``key`` with one probe at one torch thread (seconds), once per process and
        cache file; its value when the cache changed (recalibrated here, or by another process), else None.

        Within tolerance the entry notes the check (``checked``: time, figure, tolerance); past it the entry
        is measured again (reusing the fresh probe), the other stacks and envs measured before are dropped
        (measured again on first use) and one warning says what drifted by how much. A fresh figure lower
        because this host is short of memory keeps the entry (a warning says so). While another process
        rechecks the same file this one keeps its figures and looks again at its next read. Never raises but
        for a bad ``MEMPRUNE_RECHECK``: a probe or a write that fails logs a warning and keeps the cache.
        """
        raw, now = self.data["stacks"][key], time.time()
        if not recheck.enabled() or recheck.recent(raw, now):
            _RECHECKED[self.path] = "done"
            return None
        label = ", ".join(imports) or "python"
        try:
            self._check_writable()
        except CacheDirError as exc:  # a cache that cannot note the check is read as it is
            _RECHECKED[self.path] = "done"
            _logger.debug("The calibrated baseline of %s is not rechecked: %s", label, exc)
            return None
        try:
            with open(self.path.with_name(self.path.name + ".recheck.lock"), "a") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the file is closed
                except BlockingIOError:  # another process rechecks this file now: look again at the next read
                    _RECHECKED[self.path] = "pending"
                    return None
                _RECHECKED[self.path] = "done"
                disk = parse(self.path, warn=False).get("stacks", {}).get(key)
                if isinstance(disk, dict) and recheck.recent(disk, now):  # rechecked or measured by another
                    self.data.setdefault("stacks", {})[key] = disk
                    return build(disk)
                return self._recheck_now(label, imports, train, key, raw, build)
        except Exception as exc:  # noqa: BLE001 - a recheck never fails the study: the cache is kept
            _RECHECKED[self.path] = "done"
            _logger.warning(
                "The recheck of the calibrated baseline of %s failed (%s: %s): the cached figures are kept.",
                label,
                type(exc).__name__,
                exc,
            )
            return None

    def _recheck_now(
        self,
        label: str,
        imports: tuple[str, ...],
        train: bool,
        key: str,
        raw: dict[str, Any],
        build: Callable[[Any], T],
    ) -> T | None:
        """The recheck's probe, verdict and what follows from it (``_recheck``), under the recheck lock."""
        start = time.time()
        _logger.debug("Rechecking the calibrated baseline of %s (one probe, a few seconds).", label)
        fresh = run_probe("stack", {"imports": list(imports), "train": train, "threads": 1})
        cached = raw["points"][0][1]
        verdict = recheck.compare(label, cached, fresh, raw.get("measured_at"), start)
        if verdict.kind == "pressure":
            _logger.warning(verdict.message)
            return None
        if verdict.kind == "kept":
            noted = {
                **raw,
                "checked": {
                    "at": start,
                    "ram": fresh["warm"]["VmHWM"],
                    "host": recheck.host(),
                    "tolerance": recheck.tolerance(cached["warm"]["VmHWM"]),
                },
            }
            self._write(("stacks", key, noted))
            _logger.debug(verdict.message)
            return build(noted)
        new = self._measure_stack(imports, train, first=fresh)
        new["checked"] = {
            "at": new["measured_at"],
            "ram": fresh["warm"]["VmHWM"],
            "host": new["host"],
            "tolerance": recheck.tolerance(cached["warm"]["VmHWM"]),
            "drifted_from": cached["warm"]["VmHWM"],
        }
        value = build(new)
        dropped = self._write(("stacks", key, new), stale_before=start)
        stacks = sum(k.startswith("stack:") for k in dropped)
        others = f"{stacks} other stacks and {len(dropped) - stacks} envs measured before" if dropped else ""
        _logger.warning(
            "%s: recalibrated%s.", verdict.message, f"; {others} are measured again on first use" if others else ""
        )
        return value

    def stacks(self) -> list[StackBaseline]:
        """Every well-formed stack measured so far, in key order."""
        out = []
        stacks = self.data.get("stacks")
        for key, raw in sorted(stacks.items() if isinstance(stacks, dict) else ()):
            try:
                mods, train = key.split(":")[1:3]
                out.append(StackBaseline.from_raw(tuple(m for m in mods.split(",") if m), train == "1", raw))
            except _MALFORMED:
                continue
        return out

    def cpu_kernels(self) -> CpuKernels:
        """The CPU kernel workspace coefficients of this host; measured now (and cached) if never measured.

        One probe process (about 4 s): reference convolutions, forward and backward, each op's peak RSS above
        its inputs and outputs (see ``probes.kernels``), fitted per op kind on torchnet's workspace features.
        """
        with self._lock:
            kernels = self._cached("cpu_kernels", None, CpuKernels.from_raw)
            if kernels is None:
                self._check_writable()
                _logger.info("Calibrating CPU kernel workspaces (one-off, a few seconds).")
                raw = {**run_probe("kernels", {"convs": [list(c) for c in KERNEL_CONVS]}), "measured_at": time.time()}
                kernels = CpuKernels.from_raw(raw)
                self._write(("cpu_kernels", None, raw))
        if not kernels.measured:
            _logger.warning(
                "CPU kernel workspaces not measured here (%s): using the default coefficients.",
                self.data["cpu_kernels"].get("error"),
            )
        return kernels

    def cuda_costs(self, *, measure: bool = True) -> CudaCosts | None:
        """The CUDA context and cuBLAS workspace of this host's GPU under this process's
        ``CUDA_MODULE_LOADING`` (lazy by default: eager loading holds far more); measured now (and cached) if
        never measured and ``measure``, else None. One probe process (seconds) on the first visible GPU."""
        loading = os.environ.get("CUDA_MODULE_LOADING", "").upper() or "LAZY"
        with self._lock:
            costs = self._cached("cuda", loading, CudaCosts.from_raw)
            if costs is None and measure:
                self._check_writable()
                _logger.info("Calibrating the CUDA context on this host's GPU (one-off, a few seconds).")
                raw = {**run_probe("cuda", {}), "measured_at": time.time()}
                costs = CudaCosts.from_raw(raw)
                self._write(("cuda", loading, raw))
                if not costs.measured:
                    _logger.warning("The CUDA context was not measured here (%s): using the defaults.", costs.error)
        return costs

    def env(
        self,
        env_id: str,
        *,
        atari: bool,
        frame_stack: int | None,
        imports: Iterable[str],
        subproc: bool = True,
        versioned: Iterable[str] = (),
    ) -> EnvProfile:
        """The profile of ``env_id`` as SB3 builds it; measured now (and cached) if never measured."""
        imports = tuple(sorted(set(imports)))
        spec = {
            "env_id": env_id,
            "atari": bool(atari),
            "frame_stack": frame_stack or 0,
            "imports": list(imports),
            "steps": 200,
            "subproc": bool(subproc),
        }
        versioned = sorted(set(versioned))
        key = "env:" + _key(spec) + (f":{_key(versions(versioned, platform_too=False))}" if versioned else "")

        def build(raw: Any) -> EnvProfile:
            return EnvProfile.from_raw(env_id, atari, frame_stack, raw)

        with self._lock:
            found = self._cached("envs", key, build)
            if found is not None:
                return found
            self._check_writable()
            _logger.info("Calibrating environment %s (one-off, about 10 s).", env_id)
            conditions, at = recheck.host(), time.time()
            raw = {**run_probe("env", spec), "measured_at": at, "host": conditions}
            value = build(raw)
            self._write(("envs", key, raw))
        return value


_CURRENT: Calibration | None = None
_CURRENT_LOCK = threading.Lock()
#: Per cache file, this process's recheck: "done" (or not needed), "pending" (another process was at it).
_RECHECKED: dict[Path, str] = {}


def load(path: Path | str | None = None) -> Calibration:
    """The calibration for this environment (versions), read from the cache; probes run on first use."""
    global _CURRENT
    if path is None:
        with _CURRENT_LOCK:
            want = cache_dir() / f"calibration-{_key(versions())}.json"
            if _CURRENT is None or _CURRENT.path != want:
                _CURRENT = _read(want)
            return _CURRENT
    return _read(Path(path))


def _read(path: Path) -> Calibration:
    data = parse(path, warn=True)
    data.setdefault("schema", SCHEMA)
    data.setdefault("versions", versions())
    return Calibration(path, data)
