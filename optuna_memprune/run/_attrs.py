"""A program's in-memory study put on ``--storage``: attr values only memory could hold, stored as JSON.

An in-memory study keeps any object as an attr; a database or a Journal file keeps JSON. Optuna's own
terminator example reports ``cross_val_score``'s numpy array with ``report_cross_validation_scores``: on the
study ``memprune run --storage`` made, its first trial failed on "Object of type ndarray is not JSON
serializable" and the program ended. Here a value JSON cannot hold is stored as its plain form (an array or
a numpy number as ``tolist()`` gives it, inside lists and dicts too) and read back so; any other says which
attr and why. Knows nothing of guards or records (the guard's records are JSON already).
"""

from __future__ import annotations

import json
from typing import Any

from optuna.storages import JournalStorage

from .. import _internals


def stored(value: Any, key: str) -> Any:
    """``value`` as a JSON storage can hold it: unchanged where it can, else in its plain form."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        plain = _plain(value)
    try:
        json.dumps(plain)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"attr {key!r} holds a value of type {type(value).__name__!r}, which the study's storage (put there "
            f"by memprune run --storage, where the program made it in memory) cannot store as JSON ({exc}); run "
            "without --storage to keep the study in memory"
        ) from None
    return plain


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    tolist = getattr(value, "tolist", None)  # a numpy array or number, a torch tensor
    return tolist() if callable(tolist) else value


_SETTERS = ("set_trial_user_attr", "set_trial_system_attr", "set_study_user_attr", "set_study_system_attr")


def _json_attrs_class(name: str, base: type, doc: str) -> type:
    """``base`` with every attr setter's value ``stored`` first. Made by ``type`` with the base first: a
    mixin before it would change the layout that ``json_attrs``'s ``__class__`` assignment needs to be the same."""

    def setter(attr: str) -> Any:
        method = getattr(base, attr)

        def set_attr(self: Any, owner_id: int, key: str, value: Any) -> None:
            method(self, owner_id, key, stored(value, key))

        set_attr.__name__ = set_attr.__qualname__ = attr
        return set_attr

    return type(name, (base,), {"__module__": __name__, "__doc__": doc, **{a: setter(a) for a in _SETTERS}})


JsonCachedStorage = _json_attrs_class(
    "JsonCachedStorage", _internals.cached_storage_class(), "A database storage as ``get_storage(url)`` opens it."
)
JsonJournalStorage = _json_attrs_class("JsonJournalStorage", JournalStorage, "A Journal file's storage.")


def json_attrs(storage: Any) -> Any:
    """``storage`` (as ``storages.open_storage`` opened it), its attrs ``stored`` from now on: its class
    becomes the subclass above (pickled so into a trial's process); any other storage is returned as it is."""
    for cls in (JsonCachedStorage, JsonJournalStorage):
        if type(storage) is cls.__base__:
            storage.__class__ = cls
    return storage
