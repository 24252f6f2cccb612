"""The forecast stop: a trial's length (its horizon), the steps it reported, and the stop when its RSS is
projected over the budget at its last step.

Owns the ``horizon=`` argument (checked here), resolving it per trial from its params, polling the steps the
objective reported, and the wording and record of a forecast stop; knows nothing of how the trial is
stopped (the objective's interrupt, the runner's signal) nor of how the fit is made (``monitor.forecast``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..monitor import Forecast, forecast
from ..units import format_bytes, is_int
from ._core import policy_of

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

    from ._core import Guard
    from ._trials import TrialGuardState

_logger = logging.getLogger("optuna_memprune.guard")

#: Params whose value is a trial's length in steps, used when ``horizon=None``: SB3's ``learn`` and
#: rl-zoo3's ``n_timesteps`` (a recipe's params name them so).
AUTO_PARAMS = ("n_timesteps", "total_timesteps")
_MAX_POINTS = 1024  # readings one trial's forecast keeps (halved by dropping every other when full)
_POLL_SHARE = 1 / 200  # the steps are read about 200 times over the trial's elapsed time ...
_POLL_MAX_S = 10.0  # ... but at least this often ...
#: ... and no sooner than this many times the CPU of the cheaper of the last two reads after it (reads take at
#: most 2% of a core): a trial's read from an RDB storage is a query per table of it, 5-10 ms of CPU, and at one
#: read per monitor reading (every 0.1 s) for the first 20 s of each trial it was the runners' largest use of
#: CPU in the fault drill (64 runners, 2 cores; ``scripts/bench_faults.py``); an in-memory read costs
#: microseconds and is made at every reading. A fixed floor of 0.5 s instead held every forecast stop of
#: ``scripts/bench_forecast.py`` (breaches 1.9 s in) to 1.0 s: ``stop_time_ratio`` 0.13 -> 0.54 against its
#: target of 0.25. The cheaper of two (the first read's cost holds back no other): one costly read (a garbage
#: collection, a new storage's first query) put the next one 50 times its CPU later, and a first read that
#: burnt 80 ms stopped a trial growing 2 MiB a step at step 291 of 400 instead of 40.
_POLL_COST_X = 50
#: While no horizon is known (``horizon=None`` and no step-count param suggested yet), a read serves only to
#: find one, which appears only when the objective suggests that param: the next read waits this many times
#: the last one's CPU (at most ``_POLL_MAX_S``): still every reading in memory, 5 to 10 s on a database,
#: where a trial without a step-count param (most studies) was read every 0.25-0.5 s for its whole life. The
#: last one's alone: a look for a horizon that a costly read delays costs little, and with the cheaper of
#: two every such trial was read twice (one more read per trial, about 500 a fault drill).
_POLL_COST_UNKNOWN_X = 1000


def check_horizon(horizon: Any, name: str = "horizon") -> Any:
    """``horizon`` if valid, else ``ValueError`` naming ``name``: ``None`` (the trial's own ``n_timesteps`` or
    ``total_timesteps`` param, where it has one), ``False`` (no forecast), a positive int (the last step the
    objective reports with ``trial.report``), a param name (``str``) whose value is that step, or a callable
    ``params -> int``.

    Examples:
        >>> check_horizon(1_000_000)
        1000000
        >>> check_horizon(0)
        Traceback (most recent call last):
        ...
        ValueError: horizon must be None, False, a positive int (the trial's last step), a param name or a
        callable params -> int, but got 0.
    """
    if horizon is None or horizon is False or callable(horizon) or (isinstance(horizon, str) and horizon):
        return horizon
    if is_int(horizon) and horizon > 0:
        return horizon
    raise ValueError(
        f"{name} must be None, False, a positive int (the trial's last step), a param name or a "
        f"callable params -> int, but got {horizon!r}."
    )


def resolve_horizon(horizon: Any, params: Mapping[str, Any], *, quiet: bool = False) -> int | None:
    """The trial's last step for these params, or ``None`` (no forecast for it: none declared, or the
    param or callable gave no positive int, which is logged unless ``quiet``: a param not suggested yet).

    Examples:
        >>> resolve_horizon(None, {"n_timesteps": 5e4, "lr": 0.1}), resolve_horizon("steps", {"steps": 10})
        (50000, 10)
    """
    if horizon is False:
        return None
    if is_int(horizon):
        return int(horizon)
    if horizon is None:
        found = [_steps(params.get(k)) for k in AUTO_PARAMS if _steps(params.get(k)) is not None]
        return found[0] if found else None
    try:
        value = params.get(horizon) if isinstance(horizon, str) else horizon(dict(params))
    except Exception as exc:  # noqa: BLE001 - a trial without a horizon runs without the forecast
        if quiet:
            return None
        _logger.warning("horizon(params) raised %s: %s; the trial runs without the forecast.", type(exc).__name__, exc)
        return None
    if _steps(value) is not None:
        return _steps(value)
    if value is None and quiet:
        return None
    _logger.warning(
        "horizon %r gave %r for this trial, not a positive int; it runs without the forecast.", horizon, value
    )
    return None


def _steps(value: Any) -> int | None:
    """A positive whole number of steps (``1e6`` as rl-zoo3's yml files write it included), else None."""
    if is_int(value) and value > 0:
        return int(value)
    if isinstance(value, float) and value.is_integer() and 0 < value < 2**63:
        return int(value)
    return None


def describe(f: Forecast, limit: int) -> str:
    """The reason of a forecast stop.

    Examples:
        >>> f = Forecast(120_000, 1_000_000, 2**30, 7208.0, 7000.0, int(7.9 * 2**30), 7 * 2**30, True, "", 60_000)
        >>> describe(f, 6 * 2**30)
        'stopped on the forecast: projected 7.90 GiB at step 1,000,000 > 6.00 GiB; at step 120,000 now
        (RSS 1.00 GiB, +7.04 KiB a step)'
    """
    return (
        f"stopped on the forecast: projected {format_bytes(f.projected)} at step {f.horizon:,} > "
        f"{format_bytes(limit)}; at step {f.step:,} now (RSS {format_bytes(f.level)}, "
        f"+{format_bytes(f.slope)} a step)"
    )


def as_record(f: Forecast, limit: int, elapsed_s: float) -> dict[str, Any]:
    """The record's ``forecast`` field: the fitted line (step, RSS at step; slope), its projection and the
    limit, with the trial's elapsed seconds at the stop."""
    return {
        "step": f.step,
        "horizon": f.horizon,
        "level": f.level,
        "slope": round(f.slope, 6),
        "slope_low": round(f.slope_low, 6),
        "projected": f.projected,
        "projected_low": f.projected_low,
        "limit": int(limit),
        "first": f.first,
        "elapsed_s": round(elapsed_s, 3),
    }


class StepForecast:
    """One running trial's forecast: fed every reading, it reads the trial now and then (``read()``, a
    storage read) and returns the ``Forecast`` that stops the trial, once.

    Args:
        limit: the budget's RAM, bytes.
        horizon: the guard's ``horizon=`` (checked), resolved from the trial's params at each read until it
            gives the trial's last step.
        read: returns ``(last step the objective reported or None, the trial's params)``; called from the
            monitor's thread about 200 times over the trial's elapsed time (at least every 10 s, at most
            once a reading and no sooner than 50 times the last read's CPU after it; while no horizon is
            known, no sooner than 1000 times it).
        params: the params known at launch (the checked assignment), which may give the horizon at once.
    """

    def __init__(
        self,
        limit: int,
        horizon: Any,
        read: Callable[[], tuple[int | None, Mapping[str, Any]]],
        params: Mapping[str, Any] | None = None,
    ) -> None:
        self.limit, self._horizon_arg, self._read = int(limit), horizon, read
        self.horizon: int | None = horizon if is_int(horizon) else None
        if self.horizon is None and horizon is not False and params:
            self.horizon = resolve_horizon(horizon, params, quiet=True)
        self.start = time.monotonic()
        self._points: list[tuple[float, int]] = []
        self._marks: list[tuple[float, int]] = []
        self._next_poll = self.start
        self._last_cpu = 0.0  # the CPU of the last read (none yet: the first read's cost holds back no other)
        self.fired: Forecast | None = None
        self.failed = 0

    @property
    def elapsed_s(self) -> float:
        """Seconds from the trial's start to the stop (or to now)."""
        return (self._marks[-1][0] if self.fired is not None else time.monotonic()) - self.start

    def reason(self) -> str | None:
        """The reason of the stop (``describe``), ``None`` before one."""
        return None if self.fired is None else describe(self.fired, self.limit)

    def record(self) -> dict[str, Any]:
        """The record's ``forecast`` field (``as_record``), empty before a stop."""
        return {} if self.fired is None else as_record(self.fired, self.limit, self.elapsed_s)

    def on_reading(self, t: float, rss: int) -> Forecast | None:
        """The forecast that stops the trial, the first time one says so; ``None`` otherwise."""
        if self.fired is not None or t < self.start:
            return None
        self._points.append((t, rss))
        if len(self._points) >= _MAX_POINTS:
            self._points = self._points[::2]
        if t < self._next_poll:
            return None
        began = time.thread_time()
        try:
            step, params = self._read()
        except Exception as exc:  # noqa: BLE001 - a storage hiccup: try again at the next poll
            self.failed += 1
            _logger.debug("reading the trial's step failed: %s", exc)
            return None
        finally:
            spent = time.thread_time() - began
            cheaper, self._last_cpu = min(spent, self._last_cpu), spent
            self._next_poll = t + min(max((t - self.start) * _POLL_SHARE, cheaper * _POLL_COST_X), _POLL_MAX_S)
        if self.horizon is None and self._horizon_arg is not False:
            self.horizon = resolve_horizon(self._horizon_arg, params, quiet=True)
            if self.horizon is None and isinstance(self._horizon_arg, str) and self._horizon_arg in params:
                self._horizon_arg = False  # the param is there and no step count (said once): no forecast
                self._next_poll = math.inf  # nothing left to read for
            elif self.horizon is None:  # only a param suggested later can give one: look again much later
                self._next_poll = max(self._next_poll, t + min(spent * _POLL_COST_UNKNOWN_X, _POLL_MAX_S))
        # a mark per new step (its time: when it was first seen); readings are placed between marks
        if self.horizon is None or step is None or (self._marks and step <= self._marks[-1][1]):
            return None
        self._marks.append((t, int(step)))
        if len(self._marks) >= _MAX_POINTS:
            self._marks = self._marks[:1] + self._marks[1:-1:2] + self._marks[-1:]
        f = forecast(self._points, self._marks, self.horizon, self.limit)
        if f is not None and f.over:
            self.fired = f
            return f
        return None


def trial_forecast(guard: Guard, storage: BaseStorage, state: TrialGuardState) -> StepForecast | None:
    """The forecast of one trial, reading its step and params from ``storage`` (the trial's own in process,
    the study's in the runner's parent); ``None`` when there is none to make (no RAM budget,
    ``horizon=False``)."""
    horizon, limit = getattr(guard, "horizon", None), policy_of(guard).budget.ram
    if limit is None or horizon is False:
        return None

    def read() -> tuple[int | None, dict[str, Any]]:
        frozen = storage.get_trial(state.trial_id)
        return frozen.last_step, {**state.assignment, **frozen.params}

    return StepForecast(limit, horizon, read, state.assignment)
