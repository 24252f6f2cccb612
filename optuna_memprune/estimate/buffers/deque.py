"""A ``collections.deque`` of transition tuples as a Footprint, from object sizes measured with tracemalloc.

Owns the object-overhead measurement and pymalloc's and glibc's rounding of each object; knows nothing of
SB3's layouts, gymnasium, torch, psutil or Optuna.
"""

from __future__ import annotations

import collections
import math
import sys
import threading
import tracemalloc
from collections.abc import Mapping, Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np

from ...exceptions import EstimateError
from ...units import format_bytes
from ..footprint import Component, Footprint, Kind
from .fill import FillCurve, Growth
from .layouts import PAGE_SIZE, check_count, check_dtype, check_shape, check_steps, round_up

__all__ = ["deque_buffer", "deque_fill_curve", "measure_object_overheads"]


# glibc malloc/malloc.c: request2size() = (req + SIZE_SZ + MALLOC_ALIGN_MASK) & ~MALLOC_ALIGN_MASK, at
# least MINSIZE; requests from DEFAULT_MMAP_THRESHOLD_MIN up are mmap()ed whole pages with a 2 * SIZE_SZ
# header (the threshold then moves up to the largest freed mmapped chunk, at most 32 MiB on 64-bit).
GLIBC_SIZE_SZ = 8
GLIBC_MALLOC_ALIGNMENT = 16
GLIBC_MINSIZE = 32
GLIBC_MMAP_THRESHOLD = 128 * 1024

# CPython Objects/obmalloc.c (3.10+ on 64-bit, radix tree on): requests up to SMALL_REQUEST_THRESHOLD
# come from 16 KiB pools (POOL_BITS 14) in size classes of ALIGNMENT bytes, each pool losing
# POOL_OVERHEAD (its header) to bookkeeping; larger requests fall through to the system malloc.
PYMALLOC_ALIGNMENT = 16
PYMALLOC_MAX = 512
PYMALLOC_POOL_SIZE = 16 * 1024
PYMALLOC_POOL_OVERHEAD = 48


_MEASURE_LOCK = threading.Lock()
# CPython 3.11 Objects/tupleobject.c PyTuple_MAXFREELIST (2000 per size) and floatobject.c
# PyFloat_MAXFREELIST (100): more than this many objects are made before measuring.
_FREELIST_DRAIN = 2100
_SCALAR_DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)


def _traced_at(line: int) -> int:
    """Bytes tracemalloc holds for live allocations made from one line of this file."""
    here = _traced_at.__code__.co_filename
    return sum(
        s.size
        for s in tracemalloc.take_snapshot().statistics("lineno")
        if s.traceback[0].filename == here and s.traceback[0].lineno == line
    )


def _traced_per_object(make: Any, n: int, *, freelist: bool = False) -> float:
    """Bytes tracemalloc sees per object that the one-line lambda ``make(i)`` returns.

    Only allocations made from the lambda's line count, so neither other threads nor this function's
    own bookkeeping disturb the figure. An object reused from a freelist or cache is no new allocation,
    so ``n`` objects (more for ``freelist=True``: tuple, float) are made before counting; for those types
    the result is floored at ``sys.getsizeof`` (which counts the GC header), since another thread may
    refill the freelist.
    """
    line = make.__code__.co_firstlineno
    warm = max(n, _FREELIST_DRAIN if freelist else 0)
    keep: list[Any] = [None] * (warm + n)
    for i in range(warm):
        keep[i] = make(i)
    before = _traced_at(line)
    for i in range(warm, warm + n):
        keep[i] = make(i)
    after = _traced_at(line)
    floor = sys.getsizeof(keep[-1]) if freelist else 0
    del keep
    return max((after - before) / n, floor)


def _measure_deque_blocks(n: int) -> tuple[int, int, int]:
    """(block bytes, items per block, items the first block takes) of ``collections.deque``, from the
    jumps of ``sys.getsizeof`` (CPython's ``deque.__sizeof__`` counts whole blocks)."""
    d: collections.deque[None] = collections.deque()
    jumps: list[tuple[int, int]] = []
    last = sys.getsizeof(d)
    for i in range(1, n + 1):
        d.append(None)
        size = sys.getsizeof(d)
        if size != last:
            jumps.append((i, size - last))
            last = size
            if len(jumps) == 3:
                break
    if len(jumps) < 3:
        raise RuntimeError(f"could not see three deque blocks in {n} appends: {jumps!r}")
    (first, block), (second, _), (third, _) = jumps
    return block, third - second, first - 1


def measure_object_overheads() -> dict[str, Any]:
    """Measure, in this interpreter, the bytes Python and numpy request per object of a deque buffer.

    Uses ``tracemalloc`` (numpy reports its data allocations to it, in its own domain) and identity
    checks. The figures are request sizes, before the allocators round them: ``deque_buffer`` applies
    pymalloc's and glibc's rules on top. Safe beside other threads (only this module's allocations are
    counted, under a lock); tracemalloc is started and stopped only if it was not already tracing.

    Returns:
        A JSON-ready dict: ``tuple_base`` and ``tuple_per_item`` (a tuple of n items requests
        ``tuple_base + n * tuple_per_item``), ``ndarray_object`` (the array object), ``ndarray_dims_per_axis``
        (its shape and strides block, none for 0-d), ``ndarray_data_extra`` (data bytes beyond ``nbytes``),
        ``float``, ``int`` (an int past the small-int cache), ``small_int_max`` (largest shared int),
        ``bool`` (0: shared), ``numpy_scalars`` (``{dtype name: bytes}``, 0 where shared),
        ``deque_block``, ``deque_block_items``, ``deque_first_block_items``, plus ``python`` and ``numpy``
        versions.

    Examples:
        >>> overheads = measure_object_overheads()
        >>> overheads["deque_block_items"], overheads["small_int_max"]
        (64, 256)
    """
    with _MEASURE_LOCK:
        started = not tracemalloc.is_tracing()
        if started:
            tracemalloc.start(1)
        try:
            return _measure(n=500)
        finally:
            if started:
                tracemalloc.stop()


def _measure(n: int) -> dict[str, Any]:
    sizes = {k: _traced_per_object(lambda i, k=k: tuple([None] * k), n, freelist=True) for k in (1, 9)}
    per_item = (sizes[9] - sizes[1]) / 8
    # An ndarray is its object, a shape-and-strides block per axis and its data (numpy's own tracemalloc
    # domain): T(nd) = object + nd * dims + nbytes + extra; two ndims give dims and extra.
    arrays = {nd: _traced_per_object(lambda i, nd=nd: np.empty((2,) * nd, np.uint8), n) for nd in (1, 3)}
    ndarray_object = np.ndarray.__basicsize__
    dims = (arrays[3] - arrays[1] - (8 - 2)) / 2
    small_int_max = max(i for i in range(-10, 2000) if int(str(i)) is int(str(i)))
    scalars = {}
    for name in _SCALAR_DTYPES:
        kind = np.dtype(name).type
        shared = kind(1) is kind(1)
        scalars[name] = 0 if shared else round(_traced_per_object(lambda i, kind=kind: kind(i % 2 + 1), n))
    block, block_items, first_items = _measure_deque_blocks(10_000)
    return {
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "tuple_base": round(sizes[1] - per_item),
        "tuple_per_item": round(per_item),
        "ndarray_object": ndarray_object,
        "ndarray_dims_per_axis": round(dims),
        "ndarray_data_extra": max(0, round(arrays[1] - ndarray_object - dims - 2)),
        "float": round(_traced_per_object(lambda i: float(i) + 0.5, n, freelist=True)),
        "int": round(_traced_per_object(lambda i: i + 10**6, n)),
        "small_int_max": small_int_max,
        "bool": 0 if bool(int("1")) is True else sys.getsizeof(True),
        "numpy_scalars": scalars,
        "deque_block": block,
        "deque_block_items": block_items,
        "deque_first_block_items": first_items,
    }


@lru_cache(maxsize=1)
def _default_overheads() -> dict[str, Any]:
    return measure_object_overheads()


def _glibc_chunk(request: int) -> int:
    """Bytes glibc malloc takes for a request (chunk header and alignment; whole pages when mmapped)."""
    if request >= GLIBC_MMAP_THRESHOLD:
        return round_up(request + 2 * GLIBC_SIZE_SZ, PAGE_SIZE)
    return max(GLIBC_MINSIZE, round_up(request + GLIBC_SIZE_SZ, GLIBC_MALLOC_ALIGNMENT))


def _pymalloc_block(request: int) -> Fraction:
    """Bytes an object allocation takes: its pymalloc size class plus its share of the pool header (a
    fraction of a byte), or a glibc chunk beyond PYMALLOC_MAX."""
    if request <= 0:
        return Fraction(0)
    if request <= PYMALLOC_MAX:
        size = round_up(request, PYMALLOC_ALIGNMENT)
        return Fraction(PYMALLOC_POOL_SIZE, (PYMALLOC_POOL_SIZE - PYMALLOC_POOL_OVERHEAD) // size)
    return Fraction(_glibc_chunk(request))


_OVERHEAD_KEYS = (
    "tuple_base",
    "tuple_per_item",
    "ndarray_object",
    "ndarray_dims_per_axis",
    "ndarray_data_extra",
    "float",
    "numpy_scalars",
    "deque_block",
    "deque_block_items",
    "deque_first_block_items",
)


def _transition_bytes(transition: Any, ov: Mapping[str, Any]) -> tuple[int, int, str]:
    """(array data bytes, object and allocator bytes, a short description) of one transition tuple."""
    if isinstance(transition, (str, bytes)) or not isinstance(transition, Sequence) or not transition:
        raise EstimateError(
            f"transition must be a non-empty list of items ((shape, dtype), int, float, bool, None or a numpy "
            f"scalar type), but got {transition!r}."
        )
    data = 0
    other = _pymalloc_block(ov["tuple_base"] + ov["tuple_per_item"] * len(transition))  # exact, then rounded up
    words = []
    for i, item in enumerate(transition):
        if item is None or item is int or item is bool:  # shared: a reference, a small int, True/False
            words.append("ref" if item is None else item.__name__)
        elif item is float:
            other += _pymalloc_block(ov["float"])
            words.append("float")
        elif isinstance(item, type) and issubclass(item, np.generic):
            dtype = check_dtype(item, f"transition[{i}]")
            if dtype.name not in ov["numpy_scalars"]:
                raise EstimateError(f"transition[{i}]: no measured size for numpy scalar {dtype.name!r} in overheads.")
            other += _pymalloc_block(ov["numpy_scalars"][dtype.name])
            words.append(f"np.{dtype.name}")
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            shape = check_shape(item[0], f"transition[{i}] shape")
            dtype = check_dtype(item[1], f"transition[{i}] dtype")
            nbytes = math.prod(shape) * dtype.itemsize
            chunk = _glibc_chunk(nbytes + ov["ndarray_data_extra"])
            data += nbytes
            other += chunk - nbytes + _pymalloc_block(ov["ndarray_object"])
            if shape:
                other += _glibc_chunk(ov["ndarray_dims_per_axis"] * len(shape))
            words.append(f"{'x'.join(map(str, shape))} {dtype.name}")
        else:
            raise EstimateError(
                f"transition[{i}] must be (shape, dtype), int, float, bool, None or a numpy scalar type, "
                f"but got {item!r}."
            )
    return data, math.ceil(other), f"({', '.join(words)})"


def _check_overheads(overheads: Any) -> Mapping[str, Any]:
    if overheads is None:
        return _default_overheads()
    if not isinstance(overheads, Mapping) or any(k not in overheads for k in _OVERHEAD_KEYS):
        raise EstimateError(
            f"overheads must be the dict measure_object_overheads() returns (keys {', '.join(_OVERHEAD_KEYS)}), "
            f"but got {overheads!r}."
        )
    return overheads


def deque_fill_curve(
    transition: Sequence[Any],
    *,
    maxlen: int,
    overheads: Mapping[str, Any] | None = None,
    name: str = "deque buffer",
) -> FillCurve:
    """RSS of a ``collections.deque(maxlen=...)`` of transition tuples as a function of appends.

    Args as ``deque_buffer``.
    """
    maxlen = check_count(maxlen, "maxlen")
    ov = _check_overheads(overheads)
    data, other, _ = _transition_bytes(transition, ov)
    per = data + other
    per_block, first = ov["deque_block_items"], ov["deque_first_block_items"]
    lead = per_block - first  # the first block starts part-way, at the deque's centre
    blocks = -(-(maxlen + lead) // per_block)
    block_chunk = _glibc_chunk(ov["deque_block"])
    parts = (
        Growth("transitions", per, maxlen, per * maxlen),
        Growth("deque blocks", block_chunk, blocks, blocks * block_chunk, per_block, lead),
    )
    return FillCurve(name, parts, maxlen)


def deque_buffer(
    transition: Sequence[Any],
    *,
    maxlen: int,
    steps: int | None = None,
    overheads: Mapping[str, Any] | None = None,
    name: str = "deque buffer",
) -> Footprint:
    """A ``collections.deque(maxlen=...)`` of transition tuples (the tutorial DQN replay memory).

    Each transition is a tuple such as ``(obs, action, reward, next_obs, done)``; ``transition`` lists
    its items: ``(shape, dtype)`` for an ndarray that owns its data, ``int`` for a small (shared) int,
    ``float`` for a Python float, ``bool``, a numpy scalar type such as ``np.int64`` (what
    ``action_space.sample()`` returns), or ``None`` for a reference to an object counted elsewhere. Each
    object's bytes come from ``overheads`` (``measure_object_overheads``; None: measured once in this
    process), rounded as pymalloc and glibc malloc round them, plus the deque's own blocks.

    Note: with ``obs`` and ``next_obs`` as separate arrays the deque holds every frame twice, as SB3's
    ``ReplayBuffer`` does without ``optimize_memory_usage``; if ``next_obs`` is the same array object as
    the following transition's ``obs``, list it as ``None`` and the frames count once.

    Known limitations: an array item that is a view (``obs[0]`` of a batched array) keeps its base array
    alive, which this model cannot see; an ``int`` item is taken to be a small, shared int (-5..256).

    Args:
        transition: The items of one transition tuple (see above).
        maxlen: The deque's ``maxlen``; >= 1.
        steps: Transitions appended so far; None means full.
        overheads: A dict from ``measure_object_overheads`` (run by the calibration in a subprocess).
        name: The component's name.

    Examples:
        >>> obs = ((4, 84, 84), "uint8")
        >>> fp = deque_buffer([obs, int, float, obs, bool], maxlen=20_000)
        >>> 1.12e9 < fp.ram < 1.14e9
        True
    """
    steps = check_steps(steps)
    maxlen = check_count(maxlen, "maxlen")
    ov = _check_overheads(overheads)
    data, other, words = _transition_bytes(transition, ov)
    curve = deque_fill_curve(transition, maxlen=maxlen, overheads=ov, name=name)
    n = maxlen if steps is None else min(steps, maxlen)
    note = (
        f"{n:,} of {maxlen:,} tuples {words}: {data + other:,} B each "
        f"({data:,} B array data), {format_bytes(curve.full)} when full"
    )
    return Footprint((Component(name, Kind.BUFFER, ram=curve.ram(steps), note=note),))
