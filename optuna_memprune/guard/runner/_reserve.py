"""What a trial reserves on the host's ledger: its prediction times the study's learned margin, capped by
the per-trial budget.

Owns reading the (observed, predicted) pairs from the study's finished records; knows nothing of how
the ledger admits a reservation or how trials are launched.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from optuna.trial import TrialState

from ... import _internals, records
from ...records import RESOURCES, Decision
from .._margin import margin as learned_margin

if TYPE_CHECKING:
    import optuna

    from ...budget import Budget
    from ...estimate.footprint import Footprint
    from ...ledger import Ledger, Request


class Reservations:
    """The reservations of one study's trials on one host's ledger."""

    def __init__(self, study: "optuna.Study", budget: "Budget", ledger: "Ledger") -> None:
        self._study, self._budget, self._ledger = study, budget, ledger
        self._pairs: dict[int, dict[str, tuple[int, int]]] = {}  # finished trial -> (peak, pred) per resource

    def margins(self) -> dict[str, float]:
        """The study's learned margin per resource, from the trials that ran to the end alone.

        A finished trial's record never changes, so each is read once (its timeline JSON included), not
        at every launch."""
        for t in self._study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if _internals.trial_id(t) in self._pairs:
                continue
            record = records.read(t.user_attrs)
            ran = record is not None and not record.concurrent and record.decision in (Decision.ADMITTED,
                                                                                        Decision.CLAMPED)
            self._pairs[_internals.trial_id(t)] = {
                r: (getattr(record, f"peak_{r}"), getattr(record, f"pred_{r}")) for r in RESOURCES
                if ran and getattr(record, f"pred_{r}") and getattr(record, f"peak_{r}") is not None}
        return {r: learned_margin(p[r] for p in self._pairs.values() if r in p) for r in RESOURCES}

    def request(self, prediction: "Footprint | None", margins: dict[str, float]) -> "Request":
        """What a trial reserves: prediction x margin, never more than the per-trial budget (the
        watchdog stops a tree that crosses it), and the budget itself when unchecked (no prediction)."""
        from ...ledger import Request

        figures = {}
        for r in RESOURCES:
            limit = getattr(self._budget, r)
            if prediction is not None:
                figures[r] = math.ceil(getattr(prediction, r) * margins.get(r, 1.0))
                if limit is not None:
                    figures[r] = min(figures[r], limit)
            else:
                figures[r] = limit or 0
        if not self._ledger.capacity.gpus:
            figures["vram"] = 0  # a host without GPUs runs the trial on its CPU
        return Request(ram=figures["ram"], vram=figures["vram"], threads=figures["threads"])


def check_budget_fits(budget: "Budget", ledger: "Ledger") -> None:
    """ValueError when the per-trial budget can never fit the host's capacity.

    A trial unchecked at launch reserves its whole budget, and a checked one at most that: a budget over
    the host's capacity would reject every unchecked trial, and so never learn the search space, while a
    watchdog that stops trials only at the budget would leave them to the kernel's OOM killer. The user
    meant another machine (or another host capacity), which only they can say.
    """
    request = Reservations(None, budget, ledger).request(None, {})  # type: ignore[arg-type]
    misfit = ledger.misfit(request)
    if misfit:
        raise ValueError(
            f"the per-trial {budget} can never fit host {ledger.host!r}: {misfit} (what all its trials may "
            "reserve; by default 90% of the memory available at the start); lower the budget, or give the "
            "host's real capacity with host=HostBudget(ram=...) (memprune worker --host-ram)."
        )
