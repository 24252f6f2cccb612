"""The footprint function's own figures: called under the time limit, cached, and what its failures showed.

Owns the cache (the latest ``CACHE_SIZE`` footprints by the params the function read, ``_Reads``; params
with an unhashable value are never cached), the call through ``_call.py``'s ``LimitedCall`` (one at a time;
a late answer still fills the cache) and the names the footprint asked for that a finished trial showed to be
no param at all; knows nothing of budgets, learning or Optuna.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..estimate.footprint import Footprint
from ._call import LimitedCall, NotAFootprint

CACHE_SIZE = 4096  # footprints kept per guard; the clamp search evaluates tens per infeasible trial

#: A cache key: the names the call read (``None``: it read the whole dict) and their values, by name.
Key = tuple[tuple[str, ...] | None, tuple[Any, ...]]
SHAPES = 16  # the distinct sets of names read that are looked up; beyond, a call's answer is kept by all params
_ABSENT = object()  # a name the call asked for that the params lack (``get``, ``in``)


class FootprintCache:
    """``footprint(params)`` within ``timeout`` seconds (``None``: no limit), its answers kept. Thread-safe.

    Never pickled: a policy makes its own in each process.

    Examples:
        >>> from optuna_memprune import Footprint
        >>> cache = FootprintCache(lambda p: Footprint.of(ram=p["n"]), None)
        >>> cache({"n": 3}) is cache({"n": 3}), len(cache), cache.get({"n": 4})
        (True, 1, None)
        >>> cache({"n": 3, "lr": 0.1}) is cache({"n": 3}), len(cache)  # "lr" was never read
        (True, 1)
    """

    def __init__(self, footprint: Callable[[dict[str, Any]], Any] | None, timeout: float | None) -> None:
        self._lock = threading.Lock()
        self._caller = None if footprint is None else LimitedCall(footprint, timeout)  # one call at a time
        self._cache: OrderedDict[Key, Footprint] = OrderedDict()
        self._shapes: dict[tuple[str, ...], None] = {}  # the sets of names calls read, in order seen
        self._not_params: set[str] = set()  # names the footprint asked for that a trial did not suggest

    def __call__(self, params: dict[str, Any]) -> Footprint:
        """The footprint function's figures for ``params`` (cached). Raises what the function raises,
        ``NotAFootprint`` when it returns something else than a Footprint,
        or ``FootprintTimeout`` over the time limit."""
        hit = self.get(params)
        if hit is not None:
            return hit
        if self._caller is None:
            raise TypeError("there is no footprint function to call")
        reads = _Reads(params)
        result = self._caller(reads, lambda late: self._store(reads, late))
        if not isinstance(result, Footprint):
            raise NotAFootprint(_kind(result))
        self._store(reads, result)
        return result

    def get(self, params: dict[str, Any]) -> Footprint | None:
        """The cached footprint of ``params``, without calling the function (``None``: none cached): one
        whose call read the same values of the names it read (a footprint is a function of the params)."""
        with self._lock:
            shapes = list(self._shapes)
        for key in [_key(params)] + [_key(params, shape) for shape in shapes]:
            hit = self._get(key)
            if hit is not None:
                return hit
        return None

    def __len__(self) -> int:
        """How many footprints the cache holds."""
        with self._lock:
            return len(self._cache)

    @property
    def threads(self) -> int:
        """The threads the time limit runs now (its worker, kept up to a second after its last call)."""
        return 0 if self._caller is None else self._caller.threads

    def not_a_param(self, name: str) -> None:
        """The footprint asked for ``name``, and a trial that ran showed it is no param (a typo in the
        footprint, not a conditional param no earlier trial suggested)."""
        with self._lock:
            self._not_params.add(name)

    def is_not_a_param(self, name: str) -> bool:
        """Whether ``not_a_param`` was said of ``name``."""
        with self._lock:
            return name in self._not_params

    def _get(self, key: Key | None) -> Footprint | None:
        if key is None:
            return None
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
            return hit

    def _store(self, reads: _Reads, result: object) -> None:
        if not isinstance(result, Footprint):
            return
        with self._lock:
            names = None if reads.whole or not all(isinstance(n, str) for n in reads.read) else sorted(reads.read)
            shape = None if names is None else tuple(names)
            if shape is not None and shape not in self._shapes and len(self._shapes) >= SHAPES:
                shape = None
            key = _key(reads.params, shape, reads.read)
            if key is not None:
                if shape is not None:
                    self._shapes[shape] = None
                self._cache[key] = result
                if len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)


def _key(
    params: dict[str, Any], shape: tuple[str, ...] | None = None, read: dict[str, Any] | None = None
) -> Key | None:
    """The cache key of ``params`` for a call that read the names ``shape`` (``None``: all of them), with
    the values it read (``read``; else those of ``params``); ``None`` when a value is unhashable (not cached)."""
    try:
        if shape is None:
            key: Key = (None, tuple(sorted(params.items())))
        else:
            values = read if read is not None else params
            key = (shape, tuple(values.get(n, _ABSENT) for n in shape))
        hash(key)
    except TypeError:
        return None
    return key


class _Reads(dict):  # type: ignore[type-arg]
    """The params a footprint function is called with (a copy), noting the names it reads and their values
    as first read (``read``), or that it read the dict whole (``whole``: iterated it, took its length, printed
    or compared it, changed it). TPE draws a new learning rate with a width seen before: the call that read
    only the width answers it from the cache (a formula of width and batch: half of 300 TPE trials)."""

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.params = dict(params)
        self.read: dict[Any, Any] = {}
        self.whole = False

    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)  # a missing name raises KeyError as a dict does
        self.read.setdefault(key, value)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        value = super().get(key, _ABSENT)
        self.read.setdefault(key, value)
        return default if value is _ABSENT else value

    def __contains__(self, key: object) -> bool:
        value = super().get(key, _ABSENT)
        self.read.setdefault(key, value)
        return value is not _ABSENT


def _whole(name: str) -> Callable[..., Any]:
    method = getattr(dict, name)

    def read_whole(self: _Reads, *args: Any, **kwargs: Any) -> Any:
        self.whole = True
        return method(self, *args, **kwargs)

    read_whole.__name__ = name
    return read_whole


for _name in (
    "__iter__", "__len__", "__repr__", "__eq__", "__ne__", "__or__", "__ror__", "__ior__", "__reduce_ex__",
    "keys", "items", "values", "copy", "__setitem__", "__delitem__", "pop", "popitem", "setdefault", "update",
    "clear", "__reversed__",
):  # fmt: skip
    setattr(_Reads, _name, _whole(_name))


def _kind(value: object) -> str:
    """``None`` or ``a dict``: what a footprint function returned instead of a Footprint, in words."""
    return "None" if value is None else f"a {type(value).__name__}"
