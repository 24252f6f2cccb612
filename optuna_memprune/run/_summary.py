"""``memprune run``'s summary line of one guarded study at the program's exit, and where its records are.

Knows nothing of the hook's patches; reads the study's trials and their records.
"""

from __future__ import annotations

from typing import Any

from ..records import Decision, read
from ..storages import shown


def study_line(study: Any, numbers: set[int], choice: Any, on_storage: bool) -> str:
    """The line of ``study`` (its trials ``numbers`` ran in the program): decisions, the footprint where it
    is learned or none, and where the records are (``on_storage``: a study the program made in memory, put
    on ``--storage``)."""
    counts = {d: 0 for d in Decision}
    guarded = 0
    for trial in study.get_trials(deepcopy=False):
        if trial.number not in numbers:
            continue
        record = read(trial.user_attrs)
        if record is not None:
            guarded += 1
            counts[record.decision] += 1
    named = [Decision.ADMITTED, Decision.CLAMPED, Decision.REJECTED, Decision.STOPPED]
    named += [d for d in Decision if d not in named and counts[d]]
    parts = ", ".join(f"{d.value.replace('_', ' ')} {counts[d]}" for d in named)
    line = f"{guarded} trials guarded in study {study.study_name!r} ({parts})"
    if len(numbers) != guarded:
        line += f"; {len(numbers) - guarded} of the {len(numbers)} trials run have no record"
    if choice is not None and (not choice.checked or choice.footprint is None):
        line += f"; footprint: {choice.label}"  # the monitor alone, or learned
    where = location(study)
    if where is None:
        return (
            line + "; the study was in memory, so the records ended with the program (memprune run "
            "--storage URL keeps them for memprune report)"
        )
    if on_storage:
        line += f"; the program made it in memory: its records are on --storage {shown(where)}"
    return line + f"; memprune report {shown(where)} --study-name {study.study_name}"


def location(study: Any) -> str | None:
    """Where ``study``'s records are, written as ``memprune report`` takes it; None for an in-memory study."""
    from .. import _internals

    where = _internals.storage_location(study)
    if where is None:
        return None
    if "://" in where:
        return where
    return where if where.endswith(".log") else f"journal:{where}"
