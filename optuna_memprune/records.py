"""The trial record: the user attrs and constraints the guard writes on a trial, and reading them back.

The only module that knows the attr names, the constraint keys and their encoding; it knows nothing of
footprints, monitors or how a decision was reached.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from . import _internals
from .budget import soft_line
from .units import GiB

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage

PREFIX = "memprune:"
RESOURCES = ("ram", "vram", "threads")
_CONSTRAINT_PREFIX = "memprune_"
# Optuna 5.0 stores ``trial.set_constraint(key, v)`` as the system attr "constraints:<key>"
# (optuna/trial/_trial.py, Trial.set_constraint); written with the record's other attrs in one transaction.
_OPTUNA_CONSTRAINT_ATTR = "constraints:"


def _dumps(value: Any) -> str:
    """Compact JSON, keys in their order: how every JSON-valued attr is written."""
    return _ENCODER.encode(value)


# One encoder: ``json.dumps`` with separators makes a new one per call (3 us of a record's 10-20 here).
_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=False)


class Decision(str, Enum):
    """What the guard did with a trial; the values are what ``memprune:decision`` holds."""

    ADMITTED = "admitted"  # checked before launch, fits the budget, ran as sampled
    CLAMPED = "clamped"  # checked, did not fit, ran with lowered params (see clamped_from)
    REJECTED = "rejected"  # checked, did not fit, ended PRUNED before the objective's code ran
    SOFT_PRUNED = "soft_pruned"  # crossed the soft line while running; the pruner answered True
    STOPPED = "stopped"  # crossed the budget while running; interrupted and ended PRUNED
    OUT_OF_MEMORY = "out_of_memory"  # ran out of memory while running (MemoryError, CUDA OOM, the OOM killer); PRUNED
    FORECAST_STOPPED = "forecast_stopped"  # projected over the budget at its last step; stopped early, PRUNED
    UNCHECKED = "unchecked"  # could not be checked before launch; ran under the monitor only


class EnforcementMode(str, Enum):
    """What held a runner's trial to its RAM budget (``Enforcement``'s ``mode``)."""

    CGROUP_LIMIT = "cgroup_limit"  # the kernel's limit on the trial's cgroup, with polling
    CGROUP_TREE_KILL = "cgroup_tree_kill"  # a cgroup without a memory limit: the tree killed whole, the budget polled
    POLLING = "polling"  # the watchdog's polling alone


_ENFORCEMENT_TEXTS = (
    "'cgroup v1 limit', 'cgroup v2 limit', 'cgroup v1 tree kill + polling', 'cgroup v2 tree kill + polling', "
    "'polling' or 'polling (<reason>)'"
)
_CGROUP_TEXT = re.compile(r"cgroup v([12]) (limit|tree kill \+ polling)")
_POLLING, _POLLING_BECAUSE = "polling", "polling ("


@dataclass(frozen=True)
class Enforcement:
    """How the process-per-trial runner held a trial to its RAM budget (the record's ``enforcement``).

    ``mode`` is ``EnforcementMode``; ``cgroup_version`` (1 or 2) the cgroup hierarchy of the trial's
    group, with a cgroup mode only; ``reason``, with polling only, why a group made for the trial did not
    apply (``None``: no group was made, as with ``enforce="polling"``). ``str()`` gives the text the record
    stores in ``memprune:enforcement`` and ``parse`` reads it back: ``"cgroup v1 limit"`` or
    ``"cgroup v2 limit"``, ``"cgroup v1 tree kill + polling"`` or ``"cgroup v2 tree kill + polling"``,
    ``"polling"``, or ``"polling (<reason>)"``.

    Raises:
        ValueError: a mode that is none of ``EnforcementMode``'s, a cgroup mode without a version 1 or
            2 or with a reason, polling with a version, or a reason that is not a non-empty str.

    Examples:
        >>> str(Enforcement(EnforcementMode.CGROUP_LIMIT, cgroup_version=2))
        'cgroup v2 limit'
        >>> Enforcement.parse("polling (no process of the trial ran in its cgroup)").reason
        'no process of the trial ran in its cgroup'
    """

    mode: EnforcementMode
    cgroup_version: int | None = None
    reason: str | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", EnforcementMode(self.mode))
        except ValueError:
            modes = ", ".join(repr(m.value) for m in EnforcementMode)
            raise ValueError(f"Enforcement.mode must be an EnforcementMode ({modes}), but got {self.mode!r}.") from None
        version, reason = self.cgroup_version, self.reason
        if self.mode is EnforcementMode.POLLING:
            if version is not None:
                raise ValueError(f"Enforcement.cgroup_version must be None with polling, but got {version!r}.")
            if reason is not None and (not isinstance(reason, str) or not reason):
                raise ValueError(f"Enforcement.reason must be None or a non-empty str, but got {reason!r}.")
            return
        if isinstance(version, bool) or version not in (1, 2):
            raise ValueError(f"Enforcement.cgroup_version must be 1 or 2 with {self.mode.value}, but got {version!r}.")
        if reason is not None:
            raise ValueError(f"Enforcement.reason must be None with {self.mode.value}, but got {reason!r}.")

    def __str__(self) -> str:
        if self.mode is EnforcementMode.CGROUP_LIMIT:
            return f"cgroup v{self.cgroup_version} limit"
        if self.mode is EnforcementMode.CGROUP_TREE_KILL:
            return f"cgroup v{self.cgroup_version} tree kill + polling"
        return _POLLING if self.reason is None else f"{_POLLING_BECAUSE}{self.reason})"

    @classmethod
    def parse(cls, text: str) -> Enforcement:
        """The enforcement a record's text names (``str()`` of one, as stored); ValueError naming the texts
        expected otherwise."""
        if isinstance(text, str):
            if text == _POLLING:
                return cls(EnforcementMode.POLLING)
            if text.startswith(_POLLING_BECAUSE) and text.endswith(")") and len(text) > len(_POLLING_BECAUSE) + 1:
                return cls(EnforcementMode.POLLING, reason=text[len(_POLLING_BECAUSE) : -1])
            match = _CGROUP_TEXT.fullmatch(text)
            if match is not None:
                mode = EnforcementMode.CGROUP_LIMIT if match[2] == "limit" else EnforcementMode.CGROUP_TREE_KILL
                return cls(mode, cgroup_version=int(match[1]))
        raise ValueError(f"an enforcement must read {_ENFORCEMENT_TEXTS}, but got {text!r}.")


@dataclass(frozen=True)
class TrialRecord:
    """Everything the guard writes on one trial. Bytes are ints; ``None`` means unknown or unlimited.

    ``pred_*`` is the footprint of the params that ran (for unchecked trials it is computed after the run),
    ``peak_*`` the highest reading of the whole process while the trial ran, ``budget_*`` the limits
    (``None``: not budgeted). ``clamped_from`` maps each lowered param to its sampled value, ``timeline``
    is a downsampled list of ``(t_s, rss, threads, vram)``, ``breakdown`` the footprint's ``to_dict()``,
    ``breach`` the reading that crossed the soft line or the budget. The process-per-trial runner adds
    ``margin`` (the learned factor its host reservation applied per resource), ``host``, ``gpu`` and
    ``enforcement`` (an ``Enforcement``: the kernel's limit on the trial's cgroup, a cgroup's tree kill
    with polling, or polling alone with the reason a group made for the trial did not apply; stored as its
    text, ``"cgroup v1 limit"``, ``"polling"``, ...).
    ``forecast`` is set on a trial stopped on the forecast (``FORECAST_STOPPED``): the step it reached, the
    last step (``horizon``), the fitted RSS at the step (``level``, bytes), ``slope`` (bytes a step) and its
    lower bound, ``projected`` RSS at the last step, the ``limit`` and ``elapsed_s`` at the stop; its RAM
    constraint counts the projection.
    ``learned`` (empty unless the guard learns footprints) says how ``pred_*`` was learned: ``mode``
    (``"learned"``: the bound of the study's own trials; ``"corrected"``: the footprint function's figures
    corrected by the learned ratio), ``phase`` (``"warm-up"``, ``"bound"``, or ``"explore"``: run unchecked
    below every observed trial), ``n`` (trials observed to the end), ``warmup``, ``miss_rate``,
    ``quantile_ram``, ``base_ram`` and, for increments in a shared process, ``level_ram`` (the bound is
    the fit plus ``quantile_ram`` x (the fit above ``base_ram`` + 2% of (``base_ram`` + ``level_ram``))),
    ``raw`` (the footprint function's own figures, corrected mode), and after the warm-up ``center`` (the
    fit, which ``pred_*`` then holds) and ``bound`` (the upper bound the guard admitted, clamped or
    rejected on; the constraints use it).
    A trial that ran out of memory has the peak of the resource that ran out raised to the least it needed
    (more than its budget, where it has one): its constraint is positive even when it shared its process.
    In a shared process (the in-process objective) ``start_*`` is the process's usage at the trial's start,
    read after the guard gave back what it could (garbage collected, glibc's free heap trimmed, torch's
    CUDA cache emptied); the trial's own increment is ``peak_* - start_*``. ``None`` where the trial had its
    own process (the process-per-trial runner) or on records written before the field existed.
    ``leftover`` is what earlier trials left in the process (its level at the last start with no trial
    running, above the first trial's start), per resource where it made the budget unreachable or the trial
    would not have fit beside it: the trial was checked without it, its soft line and budget were raised by
    it, and the constraints count its peak less it. ``kept``, on the first trial of a shared process, is
    what the process still held above that trial's start once it
    ended and the guard gave back what it could: its one-time costs (imports, a worker pool, a cache, a CUDA
    context), which later trials find in the process; a learned footprint takes them off its increment. ``need`` is
    what admission compared with the soft line, where it compared more than the prediction (a learned
    increment plus the usage it starts from).
    """

    decision: Decision
    reason: str = ""
    pred_ram: int | None = None
    pred_vram: int | None = None
    pred_threads: int | None = None
    peak_ram: int | None = None
    peak_vram: int | None = None
    peak_threads: int | None = None
    start_ram: int | None = None
    start_vram: int | None = None
    start_threads: int | None = None
    budget_ram: int | None = None
    budget_vram: int | None = None
    budget_threads: int | None = None
    clamped_from: dict[str, Any] = field(default_factory=dict)
    timeline: list[tuple[float, int, int, int | None]] = field(default_factory=list)
    breakdown: dict[str, Any] = field(default_factory=dict)
    breach: dict[str, Any] = field(default_factory=dict)
    soft: float = 1.0  # the soft line as a fraction of the budget: what the constraints measure against
    concurrent: bool = False  # other trials shared the process: peaks are the process's (not written)
    margin: dict[str, float] = field(default_factory=dict)  # reservation = prediction x margin (per resource)
    host: str | None = None  # the host id of the process-per-trial runner that ran the trial
    gpu: int | None = None  # the GPU index the runner placed the trial on
    enforcement: Enforcement | None = None  # how the runner held the trial to its RAM budget (above)
    forecast: dict[str, Any] = field(default_factory=dict)  # a forecast stop's fit and projection (below)
    learned: dict[str, Any] = field(default_factory=dict)  # a learned prediction: mode, phase, n, raw (see below)
    leftover: dict[str, int] = field(default_factory=dict)  # what earlier trials left in the process (above)
    kept: dict[str, int] = field(default_factory=dict)  # what a process's first trial kept after it (above)
    need: dict[str, int] = field(default_factory=dict)  # what admission compared with the soft line (above)

    def constraints(self) -> dict[str, float]:
        """``{"memprune_ram": GiB over the soft line, ...}`` per budgeted resource; <= 0 is feasible.

        The figure is the larger of the prediction (and a learned prediction's bound, and what admission
        compared), and, when the trial ran alone in its process or ran out of memory, the peak less what
        earlier trials left in the process; the line is ``soft`` x budget (for a learned increment, the
        process's usage at the start, less what earlier trials left, plus ``soft`` of the budget above it,
        as admission drew it: ``Policy.line``); RAM and VRAM are in GiB, threads
        in threads. Never NaN: a resource with neither figure known counts as 0.0 (feasible).
        """
        out = {}
        for r in RESOURCES:
            budget = getattr(self, f"budget_{r}")
            if budget is None:
                continue
            figures = [getattr(self, f"pred_{r}"), (self.learned.get("bound") or {}).get(r), self.need.get(r)]
            peak = getattr(self, f"peak_{r}")
            if peak is not None and (not self.concurrent or self.decision is Decision.OUT_OF_MEMORY):
                figures.append(peak - self.leftover.get(r, 0) if self.decision is not Decision.OUT_OF_MEMORY else peak)
            if r == "ram" and self.decision is Decision.FORECAST_STOPPED:
                figures.append(self.forecast.get("projected"))
            known = [f for f in figures if f is not None]
            charged = 0
            if r in self.need and getattr(self, f"start_{r}") is not None:  # an increment: the line above the start
                charged = getattr(self, f"start_{r}") - self.leftover.get(r, 0)
            limit = soft_line(budget, self.soft, charged)
            over = float(max(known) - limit) if known else 0.0
            value = over / GiB if r != "threads" else over
            out[_CONSTRAINT_PREFIX + r] = value if math.isfinite(value) else 0.0
        return out

    def attrs(self) -> dict[str, Any]:
        """The flat user attrs, names and encodings as written on the trial. An unknown or unlimited
        figure (``None``) is left out rather than written as null, so that every ``memprune:*`` column
        optuna-dashboard shows holds numbers and sorts; ``read`` gives ``None`` back for it."""
        out: dict[str, Any] = {"decision": self.decision.value, "reason": self.reason}
        for kind in ("pred", "peak", "start", "budget"):
            for r in RESOURCES:
                value = getattr(self, f"{kind}_{r}")
                if value is not None:  # absent, not null: optuna-dashboard sorts only all-number columns
                    out[f"{kind}_{r}"] = int(value)
        out["clamped_from"] = _dumps(self.clamped_from)
        out["timeline"] = _dumps([_row(p) for p in self.timeline])
        out["breakdown"] = _dumps(self.breakdown)
        out["breach"] = _dumps(self.breach)
        out["soft"] = float(self.soft)
        for r in RESOURCES:
            if r in self.margin:
                out[f"margin_{r}"] = float(self.margin[r])
            for name in ("leftover", "need", "kept"):
                if r in getattr(self, name):
                    out[f"{name}_{r}"] = int(getattr(self, name)[r])
        if self.host is not None:
            out["host"] = self.host
        if self.gpu is not None:
            out["gpu"] = int(self.gpu)
        if self.enforcement is not None:
            out["enforcement"] = str(self.enforcement)
        if self.forecast:
            out["forecast"] = _dumps(self.forecast)
        if self.learned:
            out["learned"] = _dumps(self.learned)
        return {PREFIX + k: v for k, v in out.items()}


def _row(point: Iterable[Any]) -> list[Any]:
    t, rss, threads, vram = point
    return [round(float(t), 3), int(rss), int(threads), None if vram is None else int(vram)]


def constraint_keys(resources: Iterable[str]) -> list[str]:
    """The constraint keys written for these budgeted resources (the same on every trial)."""
    return [_CONSTRAINT_PREFIX + r for r in resources]


def write(trial: optuna.Trial, record: TrialRecord) -> None:
    """Write the record and its constraints on a running trial: the attrs ``Trial.set_user_attr`` and
    ``Trial.set_constraint`` write, in one transaction on a database storage (``_internals.set_trial_attrs``).
    A constraint already set is left as it was, with Optuna's warning (nothing else sets memprune_* keys)."""
    import optuna

    if not isinstance(trial, optuna.Trial):  # a FixedTrial (a user's test of the objective): its own setters
        for key, value in record.attrs().items():
            trial.set_user_attr(key, value)
        for key, value in record.constraints().items():
            trial.set_constraint(key, value)
        return
    trial_id = _internals.trial_id(trial)
    attrs, constraints = record.attrs(), _new_constraints(trial.storage, trial_id, record, warn=True)
    _internals.set_trial_attrs(trial.storage, trial_id, attrs, constraints)
    _internals.note_trial_attrs(trial, attrs, constraints)


def write_frozen(study: optuna.Study, trial_id: int, record: TrialRecord) -> None:
    """Write the record on a trial known only as a FrozenTrial (from ``sampler.after_trial``), as ``write``.

    The trial is still RUNNING there, so the storage accepts the writes; the storage handle comes from
    ``_internals``, the package's one audited reader of Optuna's private names.
    """
    storage = _internals.storage_of(study)
    constraints = _new_constraints(storage, trial_id, record, warn=False)
    _internals.set_trial_attrs(storage, trial_id, record.attrs(), constraints)


def _new_constraints(storage: BaseStorage, trial_id: int, record: TrialRecord, *, warn: bool) -> dict[str, float]:
    """The record's constraints as the system attrs ``Trial.set_constraint`` writes, but those already set."""
    done = storage.get_trial_system_attrs(trial_id)
    out = {}
    for key, value in record.constraints().items():
        if _OPTUNA_CONSTRAINT_ATTR + key in done:
            if warn:  # Optuna's own words where Trial.set_constraint ignores a second value
                warnings.warn(
                    f"The constraint value is ignored because this constraint `{key=}` is already set.",
                    stacklevel=3,
                )
            continue
        out[_OPTUNA_CONSTRAINT_ATTR + key] = float(value)
    return out


def is_written(user_attrs: Mapping[str, Any]) -> bool:
    """Whether a record was already written on a trial with these user attrs."""
    return PREFIX + "decision" in user_attrs


def read(user_attrs: Mapping[str, Any]) -> TrialRecord | None:
    """The record written on a trial, from its ``user_attrs``; ``None`` when the guard wrote none."""
    if not is_written(user_attrs):
        return None

    def get(name: str, default: Any = None) -> Any:
        return user_attrs.get(PREFIX + name, default)

    def loads(name: str, default: Any) -> Any:
        text = get(name)
        return json.loads(text) if isinstance(text, str) and text else default

    figures = {f"{kind}_{r}": get(f"{kind}_{r}") for kind in ("pred", "peak", "start", "budget") for r in RESOURCES}
    return TrialRecord(
        decision=Decision(get("decision")),
        reason=get("reason", ""),
        **figures,
        clamped_from=loads("clamped_from", {}),
        timeline=[tuple(p) for p in loads("timeline", [])],
        breakdown=loads("breakdown", {}),
        breach=loads("breach", {}),
        soft=float(get("soft", 1.0)),
        margin={r: float(get(f"margin_{r}")) for r in RESOURCES if get(f"margin_{r}") is not None},
        host=get("host"),
        gpu=get("gpu"),
        enforcement=None if get("enforcement") is None else Enforcement.parse(get("enforcement")),
        forecast=loads("forecast", {}),
        learned=loads("learned", {}),
        leftover={r: int(get(f"leftover_{r}")) for r in RESOURCES if get(f"leftover_{r}") is not None},
        need={r: int(get(f"need_{r}")) for r in RESOURCES if get(f"need_{r}") is not None},
        kept={r: int(get(f"kept_{r}")) for r in RESOURCES if get(f"kept_{r}") is not None},
    )


#: The user attr of a fixed hyperparameter ``memprune run --clamp-fixed`` lowered for the trial:
#: JSON ``{name: [the program's value, the value that ran]}``.
OVERRIDES = PREFIX + "overrides"


def write_overrides(study: optuna.Study, trial_id: int, overrides: Mapping[str, tuple[Any, Any]]) -> None:
    """Write the fixed hyperparameters lowered for a trial (``{name: (was, ran)}``) on it, by its id."""
    value = _dumps({k: [v[0], v[1]] for k, v in overrides.items()})
    _internals.storage_of(study).set_trial_user_attr(trial_id, OVERRIDES, value)


def read_overrides(user_attrs: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The fixed hyperparameters lowered for a trial, ``{name: (was, ran)}``; empty where none were."""
    text = user_attrs.get(OVERRIDES)
    if not isinstance(text, str) or not text:
        return {}
    return {k: (v[0], v[1]) for k, v in json.loads(text).items()}
