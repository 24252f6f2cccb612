"""How a buffer's RSS grows with the transitions added: Growth parts, the FillCurve, SB3's replay curve.

Owns the fill model (pages touched row by row, huge-page slack, the curve's inverse); knows nothing of
Footprints, minibatch copies, the deque's object sizes, gymnasium, torch, psutil or Optuna.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ...exceptions import EstimateError
from .layouts import PAGE_SIZE, Field, check_count, round_up, sb3_dict_replay_layout, sb3_replay_layout

__all__ = [
    "Growth",
    "FillCurve",
    "replay_fill_curve",
    "replay_parts",
    "replay_curve",
    "HUGE_PAGE_SIZE",
    "NUMPY_HUGEPAGE_MIN",
]

# A PMD-sized transparent huge page on x86-64 (linux Documentation/admin-guide/mm/transhuge.rst).
HUGE_PAGE_SIZE = 2 * 1024 * 1024
# numpy/_core/src/multiarray/alloc.c: data of at least 1 << 22 bytes gets madvise(MADV_HUGEPAGE).
NUMPY_HUGEPAGE_MIN = 1 << 22


class Growth(NamedTuple):
    """How one part of a buffer grows as transitions are added. All numbers are bytes except counts.

    After ``steps`` transitions, ``min(rows, ceil((steps + lead_steps) / steps_per_row))`` rows of
    ``row_bytes`` are touched; RSS is that rounded up to ``granule``, plus ``slack`` once anything is
    touched, capped at ``full``.
    """

    name: str
    row_bytes: int
    rows: int
    full: int
    steps_per_row: int = 1
    lead_steps: int = 0
    granule: int = 1
    slack: int = 0

    def ram(self, steps: int) -> int:
        if steps + self.lead_steps <= 0 or self.row_bytes == 0:
            return 0
        rows = min(self.rows, -(-(steps + self.lead_steps) // self.steps_per_row))
        return min(self.full, round_up(rows * self.row_bytes, self.granule) + self.slack)


@dataclass(frozen=True)
class FillCurve:
    """RSS of a buffer as a function of the transitions added to it (all envs together). Bytes.

    Plain data: ``parts`` say how each array grows; ``ram(steps)`` evaluates them, ``full`` is the RSS once
    every part is full and ``steps_for(ram)`` inverts the curve for a monitor's forecast.

    Examples:
        >>> curve = replay_fill_curve((4, 84, 84), "uint8", (), "int64", buffer_size=20_000)
        >>> curve.ram(0), curve.steps_to_full
        (0, 20000)
    """

    name: str
    parts: tuple[Growth, ...]
    steps_to_full: int

    def ram(self, steps: int | None = None) -> int:
        """RSS after ``steps`` transitions (``None``: full)."""
        steps = self.steps_to_full if steps is None else check_count(steps, "steps", minimum=0)
        return sum(part.ram(steps) for part in self.parts)

    @property
    def full(self) -> int:
        return sum(part.full for part in self.parts)

    def steps_for(self, ram: int) -> int | None:
        """The fewest transitions after which the buffer holds at least ``ram`` bytes; None if never."""
        if ram > self.full:
            return None
        lo, hi = 0, self.steps_to_full
        while lo < hi:
            mid = (lo + hi) // 2
            if self.ram(mid) >= ram:
                hi = mid
            else:
                lo = mid + 1
        return lo


def _array_growth(
    field: Field, *, steps_per_row: int, lead_steps: int = 0, written: bool = True, huge_pages: bool = False
) -> Growth:
    """A ring-buffer array filled row by row along axis 0, pages mapped on first write.

    With huge pages the array's offset within 2 MiB regions is unknown: the pages before its first
    2 MiB boundary are small, every region after it is faulted in whole. RSS is then below
    ``touched + 2 MiB``; ``slack`` adds that bound (an over-estimate of at most 2 MiB per array).
    """
    full = round_up(field.nbytes, PAGE_SIZE)
    slack = HUGE_PAGE_SIZE - PAGE_SIZE if huge_pages and field.nbytes >= NUMPY_HUGEPAGE_MIN else 0
    row_bytes = field.nbytes // field.shape[0] if written else 0
    return Growth(
        field.name, row_bytes, field.shape[0], full if written else 0, steps_per_row, lead_steps, PAGE_SIZE, slack
    )


def replay_parts(
    obs_shape: Any,
    obs_dtype: Any,
    action_shape: Any,
    action_dtype: Any,
    *,
    buffer_size: Any,
    n_envs: Any,
    optimize_memory_usage: bool,
    handle_timeout_termination: bool,
    dict_obs: Mapping[str, Any] | None,
) -> tuple[list[Field], int, int]:
    """(fields, rows, n_envs) of a replay buffer, plain or Dict, with its arguments checked."""
    if dict_obs is not None:
        if obs_shape is not None or obs_dtype is not None:
            raise EstimateError(
                f"obs_shape and obs_dtype must be None when dict_obs is given, but got {obs_shape!r} and {obs_dtype!r}."
            )
        fields = sb3_dict_replay_layout(
            dict_obs,
            action_shape,
            action_dtype,
            buffer_size=buffer_size,
            n_envs=n_envs,
            optimize_memory_usage=optimize_memory_usage,
            handle_timeout_termination=handle_timeout_termination,
        )
    else:
        fields = sb3_replay_layout(
            obs_shape,
            obs_dtype,
            action_shape,
            action_dtype,
            buffer_size=buffer_size,
            n_envs=n_envs,
            optimize_memory_usage=optimize_memory_usage,
            handle_timeout_termination=handle_timeout_termination,
        )
    n_envs = check_count(n_envs, "n_envs", kind="processes")
    return fields, fields[0].shape[0], n_envs


def replay_curve(
    fields: list[Field],
    rows: int,
    n_envs: int,
    *,
    optimize_memory_usage: bool,
    handle_timeout_termination: bool,
    huge_pages: bool,
    name: str,
) -> FillCurve:
    """The fill curve of the layout ``replay_parts`` returned (one Growth per array)."""
    parts = []
    for field in fields:
        # optimize_memory_usage: add() also writes next_obs into the following row of `observations`.
        lead = n_envs if optimize_memory_usage and field.name == "observations" else 0
        # `timeouts` is written only when handle_timeout_termination; never-written zero pages cost no RSS.
        written = field.name != "timeouts" or handle_timeout_termination
        parts.append(
            _array_growth(field, steps_per_row=n_envs, lead_steps=lead, written=written, huge_pages=huge_pages)
        )
    return FillCurve(name, tuple(parts), rows * n_envs)


def replay_fill_curve(
    obs_shape: Sequence[int] | None,
    obs_dtype: Any,
    action_shape: Sequence[int],
    action_dtype: Any,
    *,
    buffer_size: int,
    n_envs: int = 1,
    optimize_memory_usage: bool = False,
    handle_timeout_termination: bool = True,
    dict_obs: Mapping[str, tuple[Sequence[int], Any]] | None = None,
    huge_pages: bool = False,
    name: str = "replay buffer",
) -> FillCurve:
    """RSS of an SB3 replay buffer as a function of the transitions added (all envs together).

    ``np.zeros`` maps pages lazily: after ``steps`` transitions each array holds ``ceil(steps / n_envs)``
    rows (one more of ``observations`` with ``optimize_memory_usage``), contiguous along axis 0, rounded up
    to pages. Args as ``replay_buffer``.

    Where transparent huge pages are on ("always" or "madvise"), numpy advises ``MADV_HUGEPAGE`` for
    arrays of 4 MiB or more, so such an array fills in 2 MiB steps: pass ``huge_pages=True`` there to
    get an upper bound (up to 2 MiB more per array while filling; the full size is the same).
    """
    fields, rows, n_envs = replay_parts(
        obs_shape,
        obs_dtype,
        action_shape,
        action_dtype,
        buffer_size=buffer_size,
        n_envs=n_envs,
        optimize_memory_usage=optimize_memory_usage,
        handle_timeout_termination=handle_timeout_termination,
        dict_obs=dict_obs,
    )
    return replay_curve(
        fields,
        rows,
        n_envs,
        optimize_memory_usage=optimize_memory_usage,
        handle_timeout_termination=handle_timeout_termination,
        huge_pages=huge_pages,
        name=name,
    )
