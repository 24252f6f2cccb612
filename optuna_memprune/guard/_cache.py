"""The footprint function's own figures: called under the time limit, cached, and what its failures showed.

Owns the cache (the latest ``CACHE_SIZE`` footprints by params; params with an unhashable value are never
cached), the call through ``_call.py``'s ``LimitedCall`` (one at a time; a late answer still fills the cache)
and the names the footprint asked for that a finished trial showed to be no param at all; knows nothing of
budgets, learning or Optuna.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..estimate.footprint import Footprint
from ._call import LimitedCall, NotAFootprint

CACHE_SIZE = 4096  # footprints kept per guard; the clamp search evaluates tens per infeasible trial

#: A cache key: the params as ``(name, value)`` pairs sorted by name.
Key = tuple[tuple[str, Any], ...]


class FootprintCache:
    """``footprint(params)`` within ``timeout`` seconds (``None``: no limit), its answers kept. Thread-safe.

    Never pickled: a policy makes its own in each process.

    Examples:
        >>> from optuna_memprune import Footprint
        >>> cache = FootprintCache(lambda p: Footprint.of(ram=p["n"]), None)
        >>> cache({"n": 3}) is cache({"n": 3}), len(cache), cache.get({"n": 4})
        (True, 1, None)
    """

    def __init__(self, footprint: Callable[[dict[str, Any]], Any] | None, timeout: float | None) -> None:
        self._lock = threading.Lock()
        self._caller = None if footprint is None else LimitedCall(footprint, timeout)  # one call at a time
        self._cache: OrderedDict[Key, Footprint] = OrderedDict()
        self._not_params: set[str] = set()  # names the footprint asked for that a trial did not suggest

    def __call__(self, params: dict[str, Any]) -> Footprint:
        """The footprint function's figures for ``params`` (cached). Raises what the function raises,
        ``NotAFootprint`` when it returns something else than a Footprint,
        or ``FootprintTimeout`` over the time limit."""
        key = _key(params)
        hit = self._get(key)
        if hit is not None:
            return hit
        if self._caller is None:
            raise TypeError("there is no footprint function to call")
        result = self._caller(dict(params), lambda late: self._store(key, late))
        if not isinstance(result, Footprint):
            raise NotAFootprint(_kind(result))
        self._store(key, result)
        return result

    def get(self, params: dict[str, Any]) -> Footprint | None:
        """The cached footprint of ``params``, without calling the function (``None``: none cached)."""
        return self._get(_key(params))

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

    def _store(self, key: Key | None, result: object) -> None:
        if key is not None and isinstance(result, Footprint):
            with self._lock:
                self._cache[key] = result
                if len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)


def _key(params: dict[str, Any]) -> Key | None:
    """The cache key of ``params``; ``None`` when a value is unhashable (such params are not cached)."""
    try:
        key = tuple(sorted(params.items()))
        hash(key)
    except TypeError:
        return None
    return key


def _kind(value: object) -> str:
    """``None`` or ``a dict``: what a footprint function returned instead of a Footprint, in words."""
    return "None" if value is None else f"a {type(value).__name__}"
