"""GPU memory per process through NVML (the ``pynvml`` module of nvidia-ml-py), loaded on first use.

Knows nothing of process trees, Optuna or estimates: it answers "how much GPU memory do these pids use".
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import sys
import threading
from collections.abc import Iterable
from typing import Any, Protocol

_logger = logging.getLogger("optuna_memprune.monitor")

# The two NVML per-process lists. A process that is both (nvidia-smi's "C+G") appears in both with the same
# memory, so one device's figure for a pid is the larger of its entries, never their sum.
_PROCESS_LISTS = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses")


class GpuSource(Protocol):
    """What a reading asks of its GPU reader: a ``GpuReader``, or any object with its ``used_by``."""

    def used_by(self, pids: Iterable[int]) -> int:
        """The bytes of GPU memory used by ``pids``."""
        ...


class GpuReader:
    """Reads GPU memory per process from NVML. Make one with ``gpu_reader``.

    Notes:
        - NVML reports pids in the host's pid namespace. Inside a container with its own pid namespace
          the pids differ from ``os.getpid()``, ``used_by`` then finds nothing and answers 0.
        - ``usedGpuMemory`` is what the driver attributes to the process: its CUDA context plus what its
          allocator reserved (PyTorch's caching allocator keeps freed blocks), not what tensors use.
          Drivers that cannot tell (Windows WDDM) give ``None``, counted as 0.
        - MIG instances: untested; the process lists of a MIG-enabled parent device may be refused, and a
          device whose lists NVML refuses is skipped (logged at debug level).
    """

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self._nvml = nvml
        self._handles = handles
        self._closed = False

    @property
    def count(self) -> int:
        """Number of GPUs NVML sees."""
        return len(self._handles)

    def used_by(self, pids: Iterable[int]) -> int:
        """Return the bytes of GPU memory used by ``pids``, summed over every device."""
        wanted = pids if isinstance(pids, (set, frozenset)) else set(pids)
        if not wanted:
            return 0
        total = 0
        for index, handle in enumerate(self._handles):
            per_pid: dict[int, int] = {}
            for name in _PROCESS_LISTS:
                try:
                    entries = getattr(self._nvml, name)(handle)
                except self._nvml.NVMLError as err:
                    _logger.debug("NVML %s failed on GPU %d: %s", name, index, err)
                    continue
                for entry in entries:
                    if entry.pid in wanted:
                        used = entry.usedGpuMemory or 0  # None: the driver cannot tell (WDDM)
                        if used > per_pid.get(entry.pid, -1):
                            per_pid[entry.pid] = used
            total += sum(per_pid.values())
        return total

    def devices(self) -> list[tuple[int, int, int]]:
        """Return ``(index, total, used)`` in bytes for every GPU NVML sees (``used`` by all processes)."""
        out = []
        for index, handle in enumerate(self._handles):
            try:
                info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except self._nvml.NVMLError as err:
                _logger.debug("NVML nvmlDeviceGetMemoryInfo failed on GPU %d: %s", index, err)
                continue
            out.append((index, int(info.total), int(info.used)))
        return out

    def close(self) -> None:
        """Release this reader's NVML initialisation (NVML counts them). The reader is unusable after."""
        if not self._closed:
            self._closed = True
            self._handles = []
            try:
                self._nvml.nvmlShutdown()
            except Exception as err:  # noqa: BLE001 - shutdown failures change nothing for the caller
                _logger.debug("NVML shutdown failed: %s", err)

    def __repr__(self) -> str:
        return f"GpuReader(devices={self.count})"


def gpu_reader(module: Any = None) -> GpuReader | None:
    """Return a ``GpuReader``, or ``None`` when there is no usable NVIDIA GPU.

    ``None`` when ``pynvml`` (package nvidia-ml-py) is not installed, when ``nvmlInit`` fails (no driver,
    no GPU: the usual case on CPU machines) or when NVML sees no device. ``module`` replaces ``pynvml``
    (tests pass a fake NVML); each call initialises NVML once more, so keep the reader you get.

    Examples:
        >>> reader = gpu_reader()
        >>> vram = reader.used_by({os.getpid()}) if reader is not None else None
    """
    if module is None:
        if not nvml_library_loads():
            _logger.debug("NVIDIA's NVML library (libnvidia-ml.so.1) does not load: no GPU readings")
            return None
        try:
            module = importlib.import_module("pynvml")
        except ImportError:
            _logger.debug('pynvml is not installed (pip install "optuna-memprune[gpu]"): no GPU readings')
            return None
    try:
        module.nvmlInit()
    except Exception as err:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, OSError, ...
        _logger.debug("nvmlInit failed (%s): no GPU readings", err)
        return None
    try:
        handles = [module.nvmlDeviceGetHandleByIndex(i) for i in range(module.nvmlDeviceGetCount())]
    except Exception as err:  # noqa: BLE001
        _logger.debug("NVML could not list devices (%s): no GPU readings", err)
        handles = []
    reader = GpuReader(module, handles)
    if not handles:
        reader.close()
        return None
    return reader


def nvml_library_loads() -> bool:
    """Whether NVML's library (the driver's ``libnvidia-ml.so.1``, which ``pynvml.nvmlInit`` loads) loads here.

    Asked before ``pynvml`` is imported: importing that module takes 0.3-0.6 s of CPU, paid once by every
    process that reads a GPU level (each runner, each in-process guard) on a machine without the driver (the
    fault drill's workers spent 17% of their CPU there in a 60 s profile) for an ``nvmlInit`` that then
    fails. Elsewhere than Linux, True (``pynvml`` finds its library).
    """
    if not sys.platform.startswith("linux"):
        return True
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


_auto_lock = threading.Lock()
_auto: tuple[int, GpuReader | None] | None = None  # (pid that made it, reader): NVML state is per process


def auto_gpu_reader() -> GpuReader | None:
    """Return this process's shared reader, made by ``gpu_reader`` on first use (``gpu="auto"``)."""
    global _auto
    with _auto_lock:
        if _auto is None or _auto[0] != os.getpid():
            _auto = (os.getpid(), gpu_reader())
        return _auto[1]


def resolve_gpu(gpu: Any) -> GpuSource | None:
    """Turn the ``gpu=`` argument ("auto", None or an object with ``used_by``) into a reader or None."""
    if gpu is None:
        return None
    if isinstance(gpu, str):
        if gpu != "auto":
            raise ValueError(f"gpu must be 'auto', None or a GpuReader, but got {gpu!r}.")
        return auto_gpu_reader()
    if not callable(getattr(gpu, "used_by", None)):
        raise ValueError(f"gpu must be 'auto', None or a GpuReader, but got {gpu!r}.")
    source: GpuSource = gpu  # any object with a callable used_by (a GpuReader, a test's fake)
    return source
