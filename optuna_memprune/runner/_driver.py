"""What the two drivers of a study's trials share: the local runner's loop (``_loop.py``) and the Ray
driver (``_ray.py``). Both ask and check each trial, run it elsewhere (a process of this host, a Ray task)
and tell the study how it ended.

Owns their common parts: the study's telling (``Teller``), reservations and dead runners' trials, the
base sampler and pruner a trial's process runs, entering and leaving Optuna's optimize state (a nested call
refused, ``study.stop()`` honoured, SIGTERM ended like Ctrl-C) and whether the loop may go on or ask
another trial. Knows nothing of processes, ledgers' entries or Ray.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial

from .. import _internals
from ..guard import GuardedPruner, GuardedSampler
from ._owners import DeadRunners, runner_mark
from ._reserve import Reservations
from ._signals import end_like_ctrl_c
from ._tell import Teller

if TYPE_CHECKING:
    from ..guard.backend import Guard
    from ..ledger import Ledger


class Driver:
    """The loop's common state and its start and end; ``_loop`` is the driver's own."""

    def __init__(
        self,
        study: optuna.Study,
        objective: Callable[[optuna.Trial], Any],
        guard: Guard,
        *,
        n_trials: int | None,
        timeout: float | None,
        catch: tuple[type[BaseException], ...],
        callbacks: list[Callable[[optuna.Study, FrozenTrial], None]],
        host: str,
        ledger: Ledger | None = None,
    ) -> None:
        self.study, self.objective, self.guard = study, objective, guard
        self.n_trials, self.catch = n_trials, catch
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.teller = Teller(study, guard, callbacks)
        self.policy = self.teller.policy
        self.reservations = Reservations(study, self.policy.budget, ledger)
        self.dead_runners = DeadRunners(study, ledger, self.policy.budget, host=host)
        self.mark = runner_mark(host)  # each trial names this driver from its creation on
        sampler, pruner = study.sampler, study.pruner
        self.base_sampler = sampler.base_sampler if isinstance(sampler, GuardedSampler) else sampler
        self.inner_pruner = pruner.wrapped_pruner if isinstance(pruner, GuardedPruner) else pruner
        self.asked = 0
        self.ended = 0  # trials whose run ended and whose end was told
        self.fatal: BaseException | None = None

    def run(self, on_tick: Callable[[], None] | None) -> None:
        """Run trials until ``n_trials``, the timeout or ``study.stop()``; ``on_tick()`` at every turn. A sampler
        no guard wraps is wrapped by this driver's guard meanwhile (one another guard wraps is left: its trials
        run unchecked by this one, said once), and put back after."""
        study = self.study
        if _internals.in_optimize_loop(study):
            raise RuntimeError("Nested invocation of optimize() (or Study.optimize) isn't allowed.")
        _internals.set_in_optimize_loop(study, True)  # study.stop() works in a callback
        _internals.clear_stop(study)
        previous = end_like_ctrl_c()
        sampler = study.sampler
        if not isinstance(sampler, GuardedSampler):  # a plain sampler's trials are checked too, for this call
            study.sampler = GuardedSampler(sampler, self.guard)
        try:
            self._loop(on_tick)
        finally:
            study.sampler = sampler
            _internals.set_in_optimize_loop(study, False)
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    def _loop(self, on_tick: Callable[[], None] | None) -> None:
        raise NotImplementedError

    def _may_ask(self) -> bool:
        return self._may_go_on() and (self.n_trials is None or self.asked < self.n_trials)

    def _may_go_on(self) -> bool:
        """Not after ``study.stop()``, the timeout or a fatal error."""
        return (
            self.fatal is None
            and not _internals.stop_requested(self.study)
            and (self.deadline is None or time.monotonic() < self.deadline)
        )
