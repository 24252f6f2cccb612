"""The cache of this host's measured baselines: one JSON file per set of versions, read, filled on a miss, saved.

Knows nothing of how a probe measures (``probes``, run by ``baselines``), of recipes, Optuna or Footprints.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

from ..paths import cache_dir
from .baselines import KERNEL_CONVS, THREAD_POINTS, CpuKernels, EnvProfile, StackBaseline, run_probe

__all__ = ["Calibration", "CpuKernels", "EnvProfile", "StackBaseline", "cache_dir", "load", "versions"]

_logger = logging.getLogger("optuna_memprune.estimate.calibration")

#: Libraries every probe loads: their versions (with the interpreter's and the platform's) key the cache file.
#: A recipe's own libraries key the entries it asks for (``versioned`` below), not the whole file.
CORE = ("torch", "numpy")
SCHEMA = 1


def versions(dists: Iterable[str] = CORE, *, platform_too: bool = True) -> dict[str, str]:
    """The versions of the installed ``dists`` (with the interpreter and platform unless ``platform_too`` is
    False): what keys the calibration cache file (``CORE``) or one of its entries (a recipe's ``VERSIONED``)."""
    out = {"python": platform.python_version(), "machine": platform.machine(),
           "system": platform.system()} if platform_too else {}
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


@dataclass
class Calibration:
    """This host's measured baselines, loaded from (and saved to) the cache file for these versions.

    Each getter returns the cached figures, measuring them now (a probe in a fresh interpreter, seconds) and
    saving the file when they were never measured. ``versioned`` names the libraries (distributions) whose
    versions key an entry beyond the file's: a new version of any of them measures that entry anew.
    """

    path: Path
    data: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)  # atomic: concurrent readers never see half a file

    def forget(self) -> None:
        """Drop every measured figure (the next getters measure anew)."""
        with self._lock:
            self.data = {"schema": SCHEMA, "versions": versions()}

    def stack(self, imports: Iterable[str], *, train: bool = True, versioned: Iterable[str] = ()) -> StackBaseline:
        """The baseline of a process importing ``imports``; measured now (and cached) if never measured."""
        imports = tuple(sorted(set(imports)))
        if "torch" not in imports:
            train = False
        key = _stack_key(imports, train, versioned)
        with self._lock:
            raw = self.data.setdefault("stacks", {}).get(key)
            if raw is None:
                _logger.info("Calibrating the baseline of a process importing %s (one-off, a few seconds).",
                             ", ".join(imports) or "nothing")
                points = THREAD_POINTS if "torch" in imports else (1,)
                with ThreadPoolExecutor(max_workers=2) as pool:
                    probes = list(pool.map(lambda n: run_probe("stack", {
                        "imports": list(imports), "train": train, "threads": n}), points))
                raw = {"points": [[n, p] for n, p in zip(points, probes)]}
                self.data["stacks"][key] = raw
                self.save()
        return StackBaseline.from_raw(imports, train, raw)

    def stacks(self) -> list[StackBaseline]:
        """Every stack measured so far, in key order."""
        out = []
        for key, raw in sorted(self.data.get("stacks", {}).items()):
            mods, train = key.split(":")[1:3]
            out.append(StackBaseline.from_raw(tuple(m for m in mods.split(",") if m), train == "1", raw))
        return out

    def cpu_kernels(self) -> CpuKernels:
        """The CPU kernel workspace coefficients of this host; measured now (and cached) if never measured.

        One probe process (about 4 s): reference convolutions, forward and backward, each op's peak RSS above
        its inputs and outputs (see ``probes.kernels``), fitted per op kind on torchnet's workspace features.
        """
        with self._lock:
            raw = self.data.get("cpu_kernels")
            if raw is None:
                _logger.info("Calibrating CPU kernel workspaces (one-off, a few seconds).")
                raw = run_probe("kernels", {"convs": [list(c) for c in KERNEL_CONVS]})
                self.data["cpu_kernels"] = raw
                self.save()
        if "error" in raw:
            _logger.warning("CPU kernel workspaces not measured here (%s): using the default coefficients.",
                            raw["error"])
        return CpuKernels.from_raw(raw)

    def env(self, env_id: str, *, atari: bool, frame_stack: int | None, imports: Iterable[str],
            subproc: bool = True, versioned: Iterable[str] = ()) -> EnvProfile:
        """The profile of ``env_id`` as SB3 builds it; measured now (and cached) if never measured."""
        imports = tuple(sorted(set(imports)))
        spec = {"env_id": env_id, "atari": bool(atari), "frame_stack": frame_stack or 0,
                "imports": list(imports), "steps": 200, "subproc": bool(subproc)}
        versioned = sorted(set(versioned))
        key = "env:" + _key(spec) + (f":{_key(versions(versioned, platform_too=False))}" if versioned else "")
        with self._lock:
            raw = self.data.setdefault("envs", {}).get(key)
            if raw is None:
                _logger.info("Calibrating environment %s (one-off, about 10 s).", env_id)
                raw = run_probe("env", spec)
                self.data["envs"][key] = raw
                self.save()
        return EnvProfile.from_raw(env_id, atari, frame_stack, raw)


_CURRENT: Calibration | None = None
_CURRENT_LOCK = threading.Lock()


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
    try:
        data = json.loads(path.read_text())
        if data.get("schema") != SCHEMA:
            data = {}
    except (OSError, ValueError):
        data = {}
    data.setdefault("schema", SCHEMA)
    data.setdefault("versions", versions())
    return Calibration(path, data)
