"""The calibration cache's file: its schema, reading it back (``parse``), and writing this process's entries
into it (``write_merged``: merged with the file's, stale entries dropped, atomically under a lock file).

Knows nothing of what an entry holds (``baselines``), nor of when one is measured or rechecked
(``calibration``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["KEYED", "SCHEMA", "drop_stale", "merge", "parse", "write_merged"]

# The calibration's logger: a reader of the cache's warnings finds them under one name.
_logger = logging.getLogger("optuna_memprune.estimate.calibration")

SCHEMA = 1
#: The sections of the cache file that hold one entry per key (the rest hold one value each).
KEYED = ("stacks", "envs")


def parse(path: Path, *, warn: bool) -> dict[str, Any]:
    """The file's content if it is a cache file of this schema, its keyed sections those that are dicts;
    else ``{}`` (a missing file silently; otherwise with a warning when ``warn``: it is measured again)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        if warn and not isinstance(exc, (NotADirectoryError, PermissionError)):
            _logger.warning("The calibration cache %s is unreadable (%s): measuring again.", path, exc)
        return {}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        if warn:
            _logger.warning("The calibration cache %s is not one of schema %d: measuring again.", path, SCHEMA)
        return {}
    for section in KEYED:
        if section in data and not isinstance(data[section], dict):
            if warn:
                _logger.warning(
                    "The calibration cache %s has a malformed %r section: measuring it again.", path, section
                )
            del data[section]
    return data


def drop_stale(data: dict[str, Any], before: float, keep: tuple[str, str | None, Any] | None) -> list[str]:
    """Remove from ``data``'s stacks and envs the entries measured before ``before`` (or at no known time),
    but ``keep``'s; their keys."""
    dropped = []
    for section in KEYED:
        entries = data.get(section)
        if not isinstance(entries, dict):
            continue
        for key in sorted(entries):
            at = entries[key].get("measured_at") if isinstance(entries[key], dict) else None
            if (keep is None or (section, key) != keep[:2]) and not (isinstance(at, (int, float)) and at >= before):
                del entries[key]
                dropped.append(key)
    return dropped


def write_merged(
    path: Path,
    data: dict[str, Any],
    entry: tuple[str, str | None, Any] | None,
    *,
    replace: bool = False,
    stale_before: float | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """``data`` merged into the file at ``path`` (the file's entries win where both have a key: they are the
    newer measurements; ``replace``: ``data`` alone), with ``entry`` (section, key or None, value) set and,
    with ``stale_before``, the keyed entries measured before that time dropped (but ``entry``); written
    atomically under a lock file beside it. The merged content and the dropped keys; OSError as it comes."""
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        merged = data if replace else merge(parse(path, warn=False), data)
        if entry is not None:
            section, key, value = entry
            if key is None:
                merged[section] = value
            else:
                merged.setdefault(section, {})[key] = value
        dropped = [] if stale_before is None else drop_stale(merged, stale_before, entry)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(merged, indent=1, sort_keys=True))
            os.replace(tmp, path)  # atomic: concurrent readers never see half a file
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return merged, dropped


def merge(disk: dict[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    """``disk`` with ``mine``'s entries added where it has none (its own entries are the newer)."""
    merged = {**mine, **disk}
    for section in KEYED:
        ours, theirs = mine.get(section), disk.get(section)
        merged[section] = {**(ours if isinstance(ours, dict) else {}), **(theirs if isinstance(theirs, dict) else {})}
    return merged
