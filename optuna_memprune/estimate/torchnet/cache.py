"""Cached models of a trace over batch sizes: per architecture and spec, a linear fit or exact traces.

Owns the trace cache (bounded, thread-safe) and the batch-linear fit checked on a third trace; knows nothing of
calibration, kernel-workspace coefficients, allocator models or footprints.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ...exceptions import EstimateError
from .tracing import Session, arch_key

if TYPE_CHECKING:
    from .analysis import Structure, Trace
    from .spec import Spec

__all__ = ["Entry", "lookup", "entries", "clear"]

# Batch sizes of the two traces a linear model is fitted on, and of the trace that checks it.
_FIT_BATCHES = (2, 4)
_CHECK_BATCH = 3
_CACHE_SIZE = 256
_EXACT_PER_ENTRY = 32


class Entry:
    """What the cache keeps per architecture and spec: a linear fit over batch size, or exact traces."""

    def __init__(
        self,
        structure: Structure | None,
        intercept: np.ndarray | None,
        slope: np.ndarray | None,
        session_args: tuple[Any, ...],
    ) -> None:
        self.structure = structure
        self.intercept = intercept
        self.slope = slope
        self.linear = structure is not None
        self.exact: OrderedDict[int, Trace] = OrderedDict()
        self.session_args = session_args  # (model, spec) to trace exact batch sizes; () when linear
        self.lock = threading.Lock()

    def sizes_at(self, batch_size: int) -> tuple[Structure, np.ndarray]:
        """The structure and per-record bytes at ``batch_size``: from the fit, or an exact trace (cached)."""
        if self.linear:
            return self.structure, self.intercept + self.slope * batch_size  # type: ignore[operator,return-value]
        with self.lock:
            hit = self.exact.get(batch_size)
            if hit is not None:
                self.exact.move_to_end(batch_size)
        if hit is None:
            model, spec = self.session_args
            hit = _guarded_trace(lambda: Session(model, spec).trace(batch_size), spec)
            with self.lock:
                self.exact[batch_size] = hit
                while len(self.exact) > _EXACT_PER_ENTRY:
                    self.exact.popitem(last=False)
        return hit.structure, hit.sizes


_CACHE: OrderedDict[Any, Entry] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def _guarded_trace(run: Callable[[], Trace], spec: Spec) -> Trace:
    try:
        return run()
    except EstimateError:
        raise
    except Exception as e:  # the user's model failed on meta: say so, keep the cause, name the likely input
        if "item() cannot be called on meta tensors" in str(e):
            raise EstimateError(
                "tracing the network's step on the meta device failed: the network reads a number "
                "back from a tensor (Tensor.item(), int(t) or float(t)), which a trace without "
                "data cannot know; give this footprint by hand, or leave it to the learned "
                "footprint (learn=estimate.learned())."
            ) from e
        per_net = [shapes[0] if len(shapes) == 1 else list(shapes) for shapes in spec.input_shapes]
        shown = per_net[0] if len(per_net) == 1 else dict(zip(spec.nets, per_net, strict=False))
        raise EstimateError(
            f"tracing the network's step on the meta device failed: {type(e).__name__}: "
            f"{str(e).rstrip('.')}; check input_shape={shown!r} against the network's first "
            "layer."
        ) from e


def _fit(model: Any, spec: Spec) -> Entry:
    """Trace at two small batch sizes, fit bytes = intercept + slope * batch per storage, check at a third."""

    def run() -> tuple[Trace, ...]:
        session = Session(model, spec)
        return tuple(session.trace(b) for b in (*_FIT_BATCHES, _CHECK_BATCH))

    try:
        t1, t2, t3 = run()
    except EstimateError:
        raise
    except Exception:  # noqa: BLE001 - e.g. a model that needs a larger batch: trace exact sizes only
        return Entry(None, None, None, (model, spec))
    b1, b2 = _FIT_BATCHES
    if t1.structure.same_as(t2.structure) and t1.structure.same_as(t3.structure):
        diff = t2.sizes - t1.sizes
        if not np.any(diff % (b2 - b1)):
            slope = diff // (b2 - b1)
            intercept = t1.sizes - slope * b1
            if np.all(intercept >= 0) and np.array_equal(intercept + slope * _CHECK_BATCH, t3.sizes):
                return Entry(t1.structure, intercept, slope, ())
    entry = Entry(None, None, None, (model, spec))
    for t in (t1, t2, t3):
        entry.exact[t.batch_size] = t
    return entry


def lookup(model: Any, spec: Spec, cache_key: Any) -> Entry:
    """The cached entry of ``model`` (or of ``cache_key``, which spares building it) under ``spec``; fitted
    on a miss, outside the cache's lock, and kept as the most recent of at most ``_CACHE_SIZE`` entries."""
    if cache_key is not None:
        try:
            hash(cache_key)
        except TypeError:
            raise EstimateError(f"cache_key must be hashable, but got {type(cache_key).__name__}.") from None
        key: tuple[Any, ...] = ("user", cache_key, spec)
    else:
        key = (_guarded_key(model, spec), spec)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    fitted = _fit(model, spec)  # outside the lock: other threads' evaluations go on meanwhile
    with _CACHE_LOCK:
        hit = _CACHE.setdefault(key, fitted)
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return hit


def _guarded_key(model: Any, spec: Spec) -> tuple[str, tuple[Any, ...]]:
    try:
        return arch_key(model, spec)
    except EstimateError:
        raise
    except Exception as e:
        raise EstimateError(f"building the network on the meta device failed: {type(e).__name__}: {e}") from e


def entries() -> list[Entry]:
    """The cached entries, least recently used first."""
    with _CACHE_LOCK:
        return list(_CACHE.values())


def clear() -> None:
    """Forget every cached trace."""
    with _CACHE_LOCK:
        _CACHE.clear()
