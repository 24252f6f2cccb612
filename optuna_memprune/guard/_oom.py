"""Running out of memory, recognised: which exceptions and process deaths count, what they say about the
trial's need, and torch's CUDA allocator seen around an in-process trial.

One rule for the in-process objective and the process-per-trial runner (``_outcome`` words the ending).
Recognises torch's errors by class name, module and text, never importing torch; calls torch only where the
objective already imported it and initialised CUDA. Knows nothing of Optuna, the record's attrs or how a
trial is stopped.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import sys
import traceback
from typing import Any

from .. import procfs, records
from ..budget import Budget
from ..units import parse_bytes

_LABELS = {"ram": "RAM", "vram": "VRAM"}
_SIZE = r"([0-9]+(?:\.[0-9]*)?)\s*(bytes|B|KiB|MiB|GiB|TiB|PiB|EiB)\b"
# numpy's "Unable to allocate 3.00 GiB for an array ...", torch's CUDA "Tried to allocate 2.00 GiB" and its
# CPU allocator's "you tried to allocate 1125899906842624 bytes"
_REQUESTED = re.compile(r"(?:Unable to allocate|Tried to allocate|you tried to allocate) " + _SIZE)
# torch >= 2.1: "Including non-PyTorch memory, this process has 7.90 GiB memory in use"; older torch:
# "7.33 GiB reserved in total by PyTorch"
_IN_USE = re.compile(r"this process has " + _SIZE + r" memory in use|" + _SIZE + r" reserved in total by PyTorch")
_CPU_ALLOCATOR = "DefaultCPUAllocator: can't allocate memory"
_MEMORY_ERRORS = ("MemoryError",)  # the names a MemoryError comes back under as text (numpy shows its own so)


@dataclasses.dataclass(frozen=True)
class OutOfMemory:
    """A trial that ran out of memory: which resource, in words, and what the failure said of its need.

    ``resource`` is ``"ram"`` or ``"vram"``; ``what`` starts the record's reason; ``requested`` is the size
    of the allocation that failed and ``in_use`` what the process held then, in bytes, where known.

    Examples:
        >>> oom = out_of_memory(MemoryError("Unable to allocate 3.00 GiB for an array with shape (3221225472,)"))
        >>> oom.resource, oom.requested == 3 * 2**30, oom.what[:46]
        ('ram', True, 'ran out of memory: MemoryError: Unable to allo')
        >>> oom.needs({"ram": 2**30, "vram": None, "threads": 4}, Budget(ram="2GiB"))["ram"] == 3 * 2**30
        True
        >>> oom.needs({"ram": 2**30, "vram": None, "threads": 4}, Budget(ram="8GiB"))["ram"] == 8 * 2**30 + 1
        True
    """

    resource: str
    what: str
    requested: int | None = None
    in_use: int | None = None

    def needs(self, peaks: dict[str, int | None], budget: Budget) -> dict[str, int | None]:
        """``peaks`` with the resource that ran out raised to the least the trial needed: its observed peak,
        what it held plus what it asked for, and more than its budget (it did not fit), so that the
        resource's constraint is positive whatever the soft line."""
        figures = [peaks.get(self.resource), self.requested]
        if self.requested is not None and self.in_use is not None:
            figures.append(self.in_use + self.requested)
        limit = getattr(budget, self.resource)
        if limit is not None:
            figures.append(int(limit) + 1)
        known = [f for f in figures if f is not None]
        return {**peaks, self.resource: max(known) if known else None}

    def describe(self, budget: Budget) -> str:
        """The record's reason: what happened, and which constraint tells the sampler (if any does)."""
        label, key = _LABELS[self.resource], records.constraint_keys([self.resource])[0]
        if getattr(budget, self.resource) is None:
            return f"{self.what}; no {label} budget, so no {key} constraint records it (ended PRUNED all the same)"
        return f"{self.what}; {key} counts it over the {label} budget"

    def measured_here(self) -> OutOfMemory:
        """This one with ``in_use`` read from this process where the text did not give it (in process only)."""
        if self.in_use is not None:
            return self
        if self.resource == "vram":
            return dataclasses.replace(self, in_use=_cuda_call("memory_reserved"))
        status = procfs.status()
        return dataclasses.replace(self, in_use=status.get("VmRSS") if status else None)


def out_of_memory(exc: BaseException | None, text: str | None = None) -> OutOfMemory | None:
    """The out-of-memory failure ``exc`` is (or was raised from, through ``raise ... from``), else None.

    Counted: ``MemoryError`` and its subclasses (numpy's "Unable to allocate"), torch's ``OutOfMemoryError``
    (``torch.cuda.OutOfMemoryError`` is the same class), a ``RuntimeError`` saying "CUDA out of memory" or
    "CUDA error: out of memory" (older torch) or from torch's CPU allocator ("can't allocate memory").
    Where only the exception's ``text`` came back (``"TypeName: message"``, an exception that did not
    unpickle), the same rules apply to its name and message.

    Examples:
        >>> out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB")).resource
        'vram'
        >>> out_of_memory(None, "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB").requested
        2147483648
        >>> out_of_memory(ValueError("bad config")) is None
        True
    """
    seen = 0
    while exc is not None and seen < 8:
        found = _classify(exc)
        if found is not None:
            return found
        exc, seen = exc.__cause__, seen + 1
    if text:
        name, _, message = text.partition(": ")
        if name in _MEMORY_ERRORS:
            return _found("ram", name, message)
        if name == "OutOfMemoryError" and "out of memory" in message.lower():
            return _found("vram", name, message)
        resource = _by_message(message)
        if resource is not None:
            return _found(resource, name, message)
    return None


def _classify(exc: BaseException) -> OutOfMemory | None:
    message = str(exc)
    if isinstance(exc, MemoryError):
        requested = _array_bytes(exc)
        found = _found("ram", type(exc).__name__, message)
        return found if requested is None else dataclasses.replace(found, requested=requested)
    if any(c.__name__ == "OutOfMemoryError" and c.__module__.split(".")[0] == "torch" for c in type(exc).__mro__):
        return _found("vram", type(exc).__name__, message)
    resource = _by_message(message) if isinstance(exc, RuntimeError) else None
    return None if resource is None else _found(resource, type(exc).__name__, message)


def _by_message(message: str) -> str | None:
    """The resource a RuntimeError's message says ran out: older torch's CUDA errors, torch's CPU allocator."""
    if message.startswith("CUDA out of memory") or "CUDA error: out of memory" in message:
        return "vram"
    if _CPU_ALLOCATOR in message:
        return "ram"
    return None


def _found(resource: str, name: str, message: str) -> OutOfMemory:
    words = f"{name}: {message}" if message else name
    return OutOfMemory(resource, f"ran out of memory: {words}", _size(_REQUESTED, message), _size(_IN_USE, message))


def _size(pattern: re.Pattern[str], message: str) -> int | None:
    match = pattern.search(message)
    if match is None:
        return None
    number, unit = [g for g in match.groups() if g is not None][:2]
    return int(float(number) * parse_bytes(f"1 {unit}"))  # the unit from units; the figure as printed, cut


def _array_bytes(exc: MemoryError) -> int | None:
    """numpy's exact request (its error carries the array's ``shape`` and ``dtype``), else None."""
    # whatever the error carries: an object that is no shape or dtype fails below and counts as none
    shape: Any = getattr(exc, "shape", None)
    dtype: Any = getattr(exc, "dtype", None)
    try:
        count = 1
        for n in shape:
            count *= int(n)
        return count * int(dtype.itemsize)
    except (TypeError, AttributeError, ValueError):
        return None


def killed_by_oom_killer(exitcode: int | None, oom_kills_at_launch: int | None) -> OutOfMemory | None:
    """A process that died from SIGKILL while the host's OOM-kill count rose (since ``oom_kills_at_launch``,
    from ``optuna_memprune.procfs.oom_kills``): the kernel's OOM killer acted, and most likely on it.
    None otherwise (another signal, no count to compare, or no OOM kill meanwhile)."""
    if exitcode != -signal.SIGKILL or oom_kills_at_launch is None:
        return None
    now = procfs.oom_kills()
    if now is None or now <= oom_kills_at_launch:
        return None
    return OutOfMemory(
        "ram",
        f"killed by the kernel's OOM killer (SIGKILL while the host's OOM kill count "
        f"rose by {now - oom_kills_at_launch})",
    )


def release(exc: BaseException) -> None:
    """Let go of what a trial that ran out of memory still holds: the locals of the frames in ``exc``'s
    traceback (its arrays and tensors; the caller's own running frame is left alone), then torch's cached
    CUDA blocks, so the next trial starts clean."""
    if exc.__traceback__ is not None:
        traceback.clear_frames(exc.__traceback__)
        exc.__traceback__ = None
    empty_cuda_cache()


def cuda_reserved() -> int:
    """What torch's CUDA allocator holds now, in bytes (0 where torch runs no CUDA in this process)."""
    return int(_cuda_call("memory_reserved") or 0)


def empty_cuda_cache() -> None:
    """Give torch's cached CUDA blocks back to the driver (where torch runs CUDA in this process)."""
    _cuda_call("empty_cache")


def reset_cuda_peak() -> None:
    """Start torch's peak counters afresh for a trial (where torch runs CUDA in this process)."""
    _cuda_call("reset_peak_memory_stats")


def with_cuda_peak(peaks: dict[str, int | None]) -> dict[str, int | None]:
    """``peaks`` with ``vram`` raised to torch's peak reserved CUDA memory since ``reset_cuda_peak``
    (where torch runs CUDA in this process; unchanged elsewhere)."""
    reserved = _cuda_call("max_memory_reserved")
    if reserved is None:
        return peaks
    return {**peaks, "vram": max(int(reserved), peaks.get("vram") or 0)}


def _cuda_call(name: str) -> Any:
    """``torch.cuda.<name>()`` when the objective already imported torch and initialised CUDA here, else
    None (torch is never imported for it, nor CUDA initialised)."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return None
        return getattr(cuda, name)()
    except Exception:  # noqa: BLE001 - bookkeeping around a trial must not change how it ends
        return None
