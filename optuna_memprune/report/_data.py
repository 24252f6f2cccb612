"""Study -> ReportData: the plain data every report renderer draws (counts, trials, prediction quality).

Reads trials through Optuna's public API, records through ``records.read`` only and the runners of
RUNNING trials through ``runner.runner_states`` (this host's ledger, read only); knows nothing of
tables, HTML or plots, and prints nothing.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..exceptions import MemPruneError
from ..records import RESOURCES, Decision, TrialRecord, read, read_overrides
from ..storages import StorageError, open_storage, shown
from ._stops import forecast_stops

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

SCHEMA = "memprune-report/1"
NOTABLE = (
    Decision.REJECTED,
    Decision.CLAMPED,
    Decision.SOFT_PRUNED,
    Decision.STOPPED,
    Decision.OUT_OF_MEMORY,
    Decision.FORECAST_STOPPED,
)
TIMELINE_ADMITTED = 3  # admitted trials drawn beside the stopped ones: the highest peaks
TIMELINE_STOPPED = 8  # at most this many stopped trials in the timeline plot (the last ones)


class ReportError(MemPruneError):
    """The study cannot be reported: a broken storage URL, an unknown study, no guarded trials."""


@dataclass(frozen=True)
class GuardedTrial:
    """One trial that carries a record: Optuna's view of it (state, values, params) and the record."""

    number: int
    state: str
    values: list[float] | None
    params: dict[str, Any]
    record: TrialRecord
    overrides: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # fixed hyperparameters lowered

    @property
    def decision(self) -> Decision:
        return self.record.decision

    def figure(self, kind: str, resource: str) -> int | None:
        """``figure("pred", "ram")`` -> ``record.pred_ram``."""
        value: int | None = getattr(self.record, f"{kind}_{resource}")  # every pred_/peak_/start_/budget_ field
        return value

    @property
    def increment(self) -> bool:
        """Whether the prediction is the trial's own increment over its process's usage at its start (a
        footprint learned without a function, the trial in a shared process), not a whole process's peak."""
        return self.record.learned.get("mode") == "learned" and self.record.start_ram is not None

    def predicted_level(self, resource: str) -> int | None:
        """The prediction as the process's level it stands for, comparable with the peak: an increment
        plus the usage at the trial's start (as admission compared them), else the prediction itself."""
        pred, start = self.figure("pred", resource), self.figure("start", resource)
        return pred + start if pred is not None and start is not None and self.increment else pred

    def shown(self, kind: str, resource: str) -> int | None:
        """A figure as the report shows it beside the others: the prediction as ``predicted_level``."""
        return self.predicted_level(resource) if kind == "pred" else self.figure(kind, resource)

    def to_json_dict(self) -> dict[str, Any]:
        r = self.record
        return {
            "number": self.number,
            "state": self.state,
            "decision": r.decision.value,
            "reason": r.reason,
            "values": self.values,
            "params": self.params,
            "pred": {res: self.figure("pred", res) for res in RESOURCES},
            "peak": {res: self.figure("peak", res) for res in RESOURCES},
            "budget": {res: self.figure("budget", res) for res in RESOURCES},
            "soft": r.soft,
            "clamped_from": r.clamped_from,
            "breach": r.breach,
            "margin": r.margin or None,
            "host": r.host,
            "gpu": r.gpu,
            "overrides": {k: list(v) for k, v in self.overrides.items()},
        }


@dataclass(frozen=True)
class RunningTrial:
    """A trial still RUNNING in the storage, and what this host's ledger says of its runner.

    ``runner_alive`` is None when no runner in this host's ledger holds the trial (it runs in process, on
    another host or under another ledger), False when its runner died and no runner of its storage has
    failed it yet; ``note`` says so in words.
    """

    number: int
    params: dict[str, Any]
    runner_pid: int | None
    runner_host: str | None
    runner_alive: bool | None
    note: str

    def to_json_dict(self) -> dict[str, Any]:
        runner = (
            None
            if self.runner_pid is None
            else {"pid": self.runner_pid, "host": self.runner_host, "alive": self.runner_alive}
        )
        return {"number": self.number, "state": "RUNNING", "params": self.params, "runner": runner, "note": self.note}


@dataclass(frozen=True)
class Quality:
    """How one resource's predictions compared with the peaks of the trials that ran to the end.

    Relative error is ``(peak - pred) / peak``: positive means the prediction was low (under-prediction).
    """

    resource: str
    n: int
    median_rel_error: float | None
    worst_rel_error: float | None  # the error of largest magnitude, signed
    worst_trial: int | None
    under_predicted: int  # trials with peak > pred

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "median_rel_error": self.median_rel_error,
            "worst_rel_error": self.worst_rel_error,
            "worst_trial": self.worst_trial,
            "under_predicted": self.under_predicted,
        }


@dataclass(frozen=True)
class Margin:
    """The learned reservation margin (reservation = prediction x factor) on the last trial that has one."""

    trial: int
    factors: dict[str, float]


@dataclass(frozen=True)
class ReportData:
    """Everything a report shows, from one study. Bytes are ints; counts are ints.

    ``trials`` are the guarded trials in number order; ``timeline_trials`` the numbers of those whose
    memory timelines the HTML draws (the stopped ones, then the admitted ones with the highest peaks);
    ``largest_admitted`` the admitted trial with the largest predicted RAM (its footprint is broken down);
    ``running`` every trial still RUNNING (guarded or not) with what this host's ledger says of its runner.
    """

    study_name: str
    directions: list[str]
    n_trials: int
    trials: list[GuardedTrial]
    counts: dict[str, int]
    quality: dict[str, Quality]
    margin: Margin | None
    budget: dict[str, int | None]
    soft: float
    timeline_trials: list[int] = field(default_factory=list)
    largest_admitted: int | None = None
    running: list[RunningTrial] = field(default_factory=list)

    @property
    def notable(self) -> list[GuardedTrial]:
        """The rejected, clamped, soft-pruned, stopped and out-of-memory trials, in number order."""
        return [t for t in self.trials if t.decision in NOTABLE]

    @property
    def overrides(self) -> dict[tuple[str, Any, Any], int]:
        """``{(name, was, ran): trials}``: the fixed hyperparameters ``memprune run --clamp-fixed`` lowered."""
        out: dict[tuple[str, Any, Any], int] = {}
        for t in self.trials:
            for name, (was, ran) in t.overrides.items():
                out[(name, was, ran)] = out.get((name, was, ran), 0) + 1
        return out

    def trial(self, number: int) -> GuardedTrial:
        return next(t for t in self.trials if t.number == number)

    def to_json_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data with stable keys (docs/report.md)."""
        largest = None
        if self.largest_admitted is not None:
            t = self.trial(self.largest_admitted)
            largest = {"trial": t.number, "breakdown": t.record.breakdown}
        out = {
            "schema": SCHEMA,
            "study": {
                "name": self.study_name,
                "directions": self.directions,
                "n_trials": self.n_trials,
                "n_guarded": len(self.trials),
            },
            "budget": {**self.budget, "soft": self.soft},
            "counts": self.counts,
            "trials": [t.to_json_dict() for t in self.trials],
            "quality": {r: q.to_json_dict() for r, q in self.quality.items()},
            "margin": None if self.margin is None else {"trial": self.margin.trial, **self.margin.factors},
            "timelines": {str(n): [list(p) for p in self.trial(n).record.timeline] for n in self.timeline_trials},
            "largest_admitted": largest,
        }
        if self.running:  # the key is there only when some trial is RUNNING
            out["running"] = [t.to_json_dict() for t in self.running]
        stops = forecast_stops(self.trials)
        if stops:  # the key is there only when some trial was stopped on the forecast
            out["forecast_stops"] = [s.to_json_dict() for s in stops]
        return {key: _finite(value) for key, value in out.items()}


def load(url: str, study_name: str | None = None) -> optuna.Study:
    """The study ``study_name`` in the storage at ``url`` (may be omitted when the storage holds one study).

    ``url`` is an RDB URL or a Journal file (``PATH.log``, ``journal:PATH``). Opens the storage read-only in
    spirit: a missing file is an error, not a new empty file, and no tables are created. Every failure is a
    ``ReportError`` with one line that names what was wrong.
    """
    import optuna

    try:
        storage = open_storage(url, existing=True)
    except StorageError as exc:
        raise ReportError(str(exc)) from None
    names = optuna.get_all_study_names(storage)
    where = shown(url)
    if not names:
        raise ReportError(f"the storage at {where} holds no studies")
    if study_name is None:
        if len(names) > 1:
            raise ReportError(
                f"the storage at {where} holds {len(names)} studies; name one with --study: " + ", ".join(sorted(names))
            )
        study_name = names[0]
    elif study_name not in names:
        raise ReportError(f"no study {study_name!r} in {where}; it holds: " + ", ".join(sorted(names)))
    return optuna.load_study(study_name=study_name, storage=storage)


def build(study: optuna.Study) -> ReportData:
    """The report data of a study; raises ``ReportError`` when no trial of it carries a record."""
    from optuna.trial import TrialState

    frozen = study.get_trials(deepcopy=False)
    trials = []
    for t in sorted(frozen, key=lambda t: t.number):
        record = read(t.user_attrs)
        if record is not None:
            trials.append(
                GuardedTrial(
                    t.number,
                    t.state.name,
                    None if t.values is None else list(t.values),
                    dict(t.params),
                    record,
                    read_overrides(t.user_attrs),
                )
            )
    running = _running(study, sorted((t for t in frozen if t.state is TrialState.RUNNING), key=lambda t: t.number))
    if not trials:
        still = "; RUNNING: " + "; ".join(f"#{t.number} ({t.note})" for t in running) if running else ""
        raise ReportError(
            f"study {study.study_name!r} has no guarded trials ({len(frozen)} trials, none with "
            f"a memprune record{still}): run it with MemoryGuard's wrappers first"
        )
    last = trials[-1].record
    return ReportData(
        study_name=study.study_name,
        directions=[d.name.lower() for d in study.directions],
        n_trials=len(frozen),
        trials=trials,
        counts={d.value: sum(t.decision is d for t in trials) for d in Decision},
        quality={r: _quality(trials, r) for r in RESOURCES},
        margin=next((Margin(t.number, dict(t.record.margin)) for t in reversed(trials) if t.record.margin), None),
        budget={r: getattr(last, f"budget_{r}") for r in RESOURCES},
        soft=last.soft,
        timeline_trials=_timeline_trials(trials),
        largest_admitted=_largest_admitted(trials),
        running=running,
    )


def _running(study: optuna.Study, frozen: list[FrozenTrial]) -> list[RunningTrial]:
    """The RUNNING trials, with what this host's ledger says of their runners."""
    if not frozen:
        return []
    from ..ledger import LedgerError
    from ..runner import runner_states

    try:
        states, unread = runner_states(study), ""
    except LedgerError as exc:
        states, unread = {}, f"this host's ledger could not be read: {exc}"
    out = []
    for t in frozen:
        state = states.get(t.number)
        if state is None:
            out.append(
                RunningTrial(
                    t.number,
                    dict(t.params),
                    None,
                    None,
                    None,
                    unread
                    or (
                        "no runner of this host's ledger holds it (it runs in process, on another host or under "
                        "another ledger)"
                    ),
                )
            )
        else:
            out.append(RunningTrial(t.number, dict(t.params), state.pid, state.host, state.alive, state.note))
    return out


def rel_error(pred: int, peak: int) -> float:
    """``(peak - pred) / peak``: positive when the prediction was low."""
    return (peak - pred) / peak


def _quality(trials: list[GuardedTrial], resource: str) -> Quality:
    pairs = [
        (t.number, t.predicted_level(resource), t.figure("peak", resource)) for t in trials if t.state == "COMPLETE"
    ]
    errors = [(n, rel_error(pred, peak)) for n, pred, peak in pairs if pred is not None and peak]
    if not errors:
        return Quality(resource, 0, None, None, None, 0)
    worst_n, worst = max(errors, key=lambda e: abs(e[1]))
    return Quality(
        resource, len(errors), statistics.median(e for _, e in errors), worst, worst_n, sum(e > 0 for _, e in errors)
    )


def _timeline_trials(trials: list[GuardedTrial]) -> list[int]:
    stopped = [t.number for t in trials if t.decision is Decision.STOPPED and t.record.timeline]
    admitted = [t for t in trials if t.decision is Decision.ADMITTED and t.state == "COMPLETE" and t.record.timeline]
    admitted.sort(key=lambda t: -(t.record.peak_ram or 0))
    return stopped[-TIMELINE_STOPPED:] + sorted(t.number for t in admitted[:TIMELINE_ADMITTED])


def _largest_admitted(trials: list[GuardedTrial]) -> int | None:
    admitted = [t for t in trials if t.decision is Decision.ADMITTED and t.record.breakdown]
    return max(admitted, key=lambda t: t.record.pred_ram or 0).number if admitted else None


def _finite(value: Any) -> Any:
    """NaN and infinities (an objective may return them) become ``None``: the JSON stays standard."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
