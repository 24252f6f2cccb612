"""What a trial reserves on the host's ledger (or asks of Ray, ``_ray_nodes``): its prediction times the
study's learned margin, capped by the per-trial budget; and how often a trial waiting for it tries the
ledger again. A learned footprint's prediction is already its bound at the stated miss rate: it is reserved
as it is (margin 1.0), so its error is not counted twice.

Owns reading the (observed, predicted) pairs from the study's finished records; knows nothing of how
the ledger admits a reservation or how trials are launched.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from optuna.trial import TrialState

from .. import _internals, records
from ..guard.backend import learned_margin
from ..records import RESOURCES, Decision

if TYPE_CHECKING:
    import optuna

    from ..budget import Budget
    from ..estimate.footprint import Footprint
    from ..ledger import Ledger, Request


def next_try(waited: float) -> float:
    """Seconds until a trial that has waited ``waited`` seconds for its reservation tries the ledger again:
    0.05 for its first half second (a reservation released now is taken at once), then 0.25-0.75 at random
    (runners of one host do not try in step). A refused try costs about 2 ms of CPU on a PostgreSQL ledger
    (7 ms when each was a locking transaction); 48 runners trying every 50 ms kept a 2-core host busy with
    admissions alone."""
    return 0.05 if waited < 0.5 else random.uniform(0.25, 0.75)


class Reservations:
    """The reservations of one study's trials: on one host's ledger, or (``ledger=None``) as the Ray
    backend's resources of each task."""

    def __init__(self, study: optuna.Study, budget: Budget, ledger: Ledger | None = None) -> None:
        self._study, self._budget, self._ledger = study, budget, ledger
        self._pairs: dict[int, dict[str, tuple[int, int]]] = {}  # finished trial -> (peak, pred) per resource
        self._learned = False  # a finished record's prediction was learned: reserved as it is

    def margins(self) -> dict[str, float]:
        """The study's learned margin per resource, from the trials that ran to the end alone; 1.0 once a
        finished record says its prediction was learned (the bound at the stated miss rate, reserved as is).

        A finished trial's record never changes, so each is read once (its timeline JSON included), not
        at every launch. The trials are those the trial's ask read (the per-trial list the samplers read): a
        query of the running trials' attrs of its own took 15 ms of CPU a trial in the fault drill."""
        for t in _internals.cached_trials(self._study):
            if t.state not in (TrialState.COMPLETE, TrialState.PRUNED) or _internals.trial_id(t) in self._pairs:
                continue
            record = records.read(t.user_attrs)
            if record is not None and record.learned:
                self._learned = True
            ran = (
                record is not None
                and not record.concurrent
                and not record.learned
                and t.state == TrialState.COMPLETE
                and record.decision in (Decision.ADMITTED, Decision.CLAMPED)
            )
            self._pairs[_internals.trial_id(t)] = {
                r: (getattr(record, f"peak_{r}"), getattr(record, f"pred_{r}"))
                for r in RESOURCES
                if ran and getattr(record, f"pred_{r}") and getattr(record, f"peak_{r}") is not None
            }
        if self._learned:
            return {r: 1.0 for r in RESOURCES}
        return {r: learned_margin(p[r] for p in self._pairs.values() if r in p) for r in RESOURCES}

    def figures(self, prediction: Footprint | None, margins: dict[str, float]) -> dict[str, int]:
        """What a trial reserves of each resource wherever it runs (``figures``)."""
        return figures(self._budget, prediction, margins)

    def request(self, prediction: Footprint | None, margins: dict[str, float]) -> Request:
        """What a trial reserves on this host's ledger: its ``figures``, no GPU memory on a host without
        GPUs, and an unchecked trial's capped at the host's capacity."""
        from ..ledger import Request

        if self._ledger is None:
            raise ValueError("Reservations.request needs the host's ledger: give it one.")
        figures = self.figures(prediction, margins)
        cap = self._ledger.capacity
        if not cap.gpus:
            figures["vram"] = 0  # a host without GPUs runs the trial on its CPU
        if prediction is None:  # never more than the host may reserve: the trial runs alone (see check_budget_fits)
            figures["ram"] = figures["ram"] if cap.ram is None else min(figures["ram"], cap.ram)
            figures["threads"] = figures["threads"] if cap.threads is None else min(figures["threads"], cap.threads)
            figures["vram"] = min(figures["vram"], max(cap.gpus, default=0))
        return Request(ram=figures["ram"], vram=figures["vram"], threads=figures["threads"])


def figures(budget: Budget, prediction: Footprint | None, margins: dict[str, float]) -> dict[str, int]:
    """What a trial reserves of each resource wherever it runs: prediction x margin, never more than the
    per-trial budget (the watchdog stops a tree that crosses it), and the budget itself when unchecked (no
    prediction; 0 for a resource without one)."""
    out = {}
    for r in RESOURCES:
        limit = getattr(budget, r)
        if prediction is not None:
            out[r] = math.ceil(getattr(prediction, r) * margins.get(r, 1.0))
            if limit is not None:
                out[r] = min(out[r], limit)
        else:
            out[r] = limit or 0
    return out


def check_budget_fits(budget: Budget, ledger: Ledger) -> str:
    """ValueError when the per-trial RAM budget is more than this machine has; else the warning to give
    (``""`` for none) when the budget is more than the host's capacity in the ledger.

    A trial unchecked at launch reserves its whole budget: over the host's capacity it would be rejected
    ("can never fit"), every unchecked trial alike, so the search space would never be learned. A budget
    over the machine's RAM was meant for another machine (the kernel's OOM killer would act before the
    watchdog), which only the user can fix. A budget within the machine but over the capacity the ledger
    was given is capped: an unchecked trial reserves the whole capacity (it runs alone), and the warning
    says so.
    """
    from ..ledger import Request, physical_ram
    from ..units import format_bytes

    total, source = physical_ram()
    if budget.ram is not None and budget.ram > total:
        capacity = "unlimited" if ledger.capacity.ram is None else format_bytes(ledger.capacity.ram)
        raise ValueError(
            f"the per-trial {budget} is more than this machine has: RAM {format_bytes(budget.ram)} > "
            f"{format_bytes(total)} in all ({'' if source == 'physical memory' else source + '; '}host "
            f"{ledger.host!r} may reserve {capacity} for all its trials); lower the budget (one meant for a bigger "
            "machine?)."
        )
    whole = Request(
        ram=budget.ram or 0, vram=(budget.vram or 0) if ledger.capacity.gpus else 0, threads=budget.threads or 0
    )
    misfit = ledger.misfit(whole)
    if not misfit:
        return ""
    return (
        f"The per-trial {budget} is more than host {ledger.host!r} may reserve for all its trials ({misfit}): "
        "a trial unchecked at launch reserves the host's whole capacity instead (it runs alone) and is still "
        "stopped at its budget. Give the host's real capacity (host=HostBudget(...); memprune worker "
        "--host-ram, --host-threads, --host-gpus) or lower the budget."
    )
