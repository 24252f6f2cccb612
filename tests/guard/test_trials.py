"""TrialRegistry and TrialGuardState: one state per trial id, the running set, unchecking."""

from __future__ import annotations

import threading

from optuna_memprune.guard import Decision
from optuna_memprune.guard._trials import TrialRegistry


def test_open_returns_one_state_per_trial_until_it_is_closed() -> None:
    trials = TrialRegistry()
    state = trials.open(7, 3)
    assert trials.open(7, 3) is state and trials.get(7) is state and (state.trial_id, state.number) == (7, 3)
    assert state.decision is Decision.UNCHECKED and not state.checked
    assert trials.close(7) is state and trials.get(7) is None and trials.close(7) is None
    assert trials.registered() == {}


def test_trials_running_at_once_are_marked_concurrent() -> None:
    trials = TrialRegistry()
    a, b = trials.open(1, 0), trials.open(2, 1)
    assert trials.enter_run(a) == 1 and not a.concurrent
    assert trials.enter_run(b) == 2 and a.concurrent and b.concurrent
    trials.exit_run(a)
    trials.exit_run(b)
    assert trials.running() == {}


def test_uncheck_drops_the_prediction_and_says_why() -> None:
    state = TrialRegistry().open(1, 0)
    state.decision, state.prediction = Decision.ADMITTED, object()  # type: ignore[assignment]
    assert state.checked
    state.uncheck("param 'x' is not in the known search space")
    assert state.decision is Decision.UNCHECKED and state.prediction is None and "'x'" in state.reason


def test_the_registry_is_thread_safe() -> None:
    trials = TrialRegistry()

    def work(base: int) -> None:
        for i in range(base, base + 500):
            trials.enter_run(trials.open(i, i))
            trials.exit_run(trials.get(i))  # type: ignore[arg-type]
            trials.close(i)

    threads = [threading.Thread(target=work, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert trials.registered() == {} and trials.running() == {}
