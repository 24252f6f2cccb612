"""optuna-dashboard notes: a short markdown summary of the guard's decision, written on each guarded trial.

The one module of report/ that writes to a storage, and the one that reaches into Optuna's private ids
(optuna-dashboard's ``save_note`` takes a live ``optuna.Trial``; a finished trial is named by its id).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

from .. import _internals
from ..records import Decision
from . import _format as fmt
from ._data import GuardedTrial, ReportError, build

if TYPE_CHECKING:
    import optuna


def trial_note(t: GuardedTrial) -> str:
    """The markdown note for one guarded trial: decision, reason, predicted / peak / budget, what moved."""
    r = t.record
    shown = fmt.resources(t)
    lines = [
        f"### memprune: {r.decision.value}",
        "",
        fmt.reason(t) or "(no reason recorded)",
        "",
        "| | " + " | ".join(fmt.LABELS[x] for x in shown) + " |",
        "|---|" + "---:|" * len(shown),
    ]
    for kind, label in (("pred", "predicted"), ("peak", "observed peak"), ("budget", "budget")):
        lines.append(f"| {label} | " + " | ".join(fmt.figure(x, t.shown(kind, x)) for x in shown) + " |")
    if r.clamped_from and r.decision is Decision.CLAMPED:
        lines += ["", f"clamped: {fmt.clamped(r.clamped_from, t.params)}"]
    if r.margin:
        lines += ["", "learned margin: " + ", ".join(f"{fmt.LABELS.get(k, k)} x{v:.3f}" for k, v in r.margin.items())]
    if r.host is not None or r.gpu is not None:
        lines += ["", f"ran on host {r.host or '-'}" + ("" if r.gpu is None else f", GPU {r.gpu}")]
    return "\n".join(lines) + "\n"


def save_notes(study: optuna.Study) -> int:
    """Write (or refresh) an optuna-dashboard note on every guarded trial of ``study``; returns how many
    notes changed. A note already up to date is left alone, so running it twice writes nothing new.

    Needs ``optuna-dashboard``. The note replaces any note the trial had (the dashboard keeps one per trial).

    Examples:
        >>> from optuna_memprune import report
        >>> report.save_notes(optuna.load_study(study_name="demo", storage=url))  # doctest: +SKIP
    """
    try:
        import optuna_dashboard
    except ImportError:
        raise ReportError(
            'dashboard notes need optuna-dashboard, which is not installed: pip install "optuna-memprune[dashboard]"'
        ) from None
    ids = {t.number: _internals.trial_id(t) for t in study.get_trials(deepcopy=False)}
    changed = 0
    for t in build(study).trials:
        ref = SimpleNamespace(study=study, storage=_internals.storage_of(study), _trial_id=ids[t.number])
        body = trial_note(t)
        if optuna_dashboard.get_note(ref) != body:
            optuna_dashboard.save_note(ref, body)
            changed += 1
    return changed
