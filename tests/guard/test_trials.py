"""TrialRegistry and TrialGuardState: one state per trial id, the running set, unchecking."""

from __future__ import annotations

import sys
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


def test_threads_opening_the_same_trials_at_once_share_one_state_per_trial() -> None:
    # The threads open the same ids at the same moment, with thread switches forced every microsecond: an
    # unlocked check-then-create hands some ids two states (about 40 of 2,000 seen with the lock removed).
    trials, n, k = TrialRegistry(), 2000, 8
    got: list[list[object]] = [[None] * n for _ in range(k)]
    barrier = threading.Barrier(k)

    def work(j: int) -> None:
        barrier.wait()
        for i in range(n):
            got[j][i] = trials.open(i, i)
            trials.enter_run(trials.open(i, i))
            trials.exit_run(trials.open(i, i))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(j,)) for j in range(k)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    split = [i for i in range(n) if len({id(got[j][i]) for j in range(k)}) > 1]
    assert split == [] and len(trials.registered()) == n and trials.running() == {}
    assert all(got[0][i] is trials.get(i) for i in range(n))
