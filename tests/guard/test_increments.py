"""Each trial's own memory in a shared process: the start level read after the give-back, the trial's own
increment, what earlier trials left, admission on usage now plus a learned increment, and the fallback that
keeps a small trial after a large one from being stopped for memory it did not take.

Real allocations (numpy pages written) in this process, real Optuna studies.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import time
import warnings

import numpy as np
import optuna
import psutil
import pytest
from _levels import start_rss as _rss
from optuna.distributions import IntDistribution
from optuna.trial import TrialState

import optuna_memprune as omp
from optuna_memprune.estimate.learn import learned
from optuna_memprune.guard import Decision, MemoryGuard, read_record
from optuna_memprune.guard._learning import Learning
from optuna_memprune.guard._policy import Policy
from optuna_memprune.guard._start import ProcessLevels, Start, allowance, charged, give_back
from optuna_memprune.guard._trials import TrialGuardState
from optuna_memprune.guard._watch import watch_of
from optuna_memprune.records import TrialRecord, read, write

MiB = 2**20
optuna.logging.set_verbosity(optuna.logging.WARNING)
_KEPT: list[np.ndarray] = []  # what a trial leaves behind on purpose: held at module level, as a cache would be


@pytest.fixture(autouse=True)
def _release_kept():
    yield
    _KEPT.clear()
    give_back()


def _garbage(mb: int) -> None:
    """``mb`` MiB written and left in a reference cycle: freed only by a garbage collection."""
    cycle: list = [np.ones(mb * MiB, dtype=np.uint8)]
    cycle.append(cycle)


def test_the_give_back_comes_before_the_start_level_is_read() -> None:
    # The order matters: read before the give-back, a cycle's 200 MiB counts as the process's usage.
    collections: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            collections.append(1)

    gc.disable()  # no automatic collection may free the cycle by chance between the two readings
    gc.callbacks.append(count)
    try:
        levels = ProcessLevels()
        start = levels.start(alone=True).level
        assert len(collections) == 1  # the first start gives back
        levels.ended(start)
        levels.start(alone=True)
        assert len(collections) == 1  # a trial that left nothing costs the next one no collection
        _garbage(200)
        before = psutil.Process().memory_info().rss  # the garbage still held
        levels.ended(start)
        after = levels.start(alone=True).level["ram"]
        assert len(collections) == 2
    finally:
        gc.callbacks.remove(count)
        gc.enable()
    assert before - after >= 150 * MiB, (before / MiB, after / MiB)
    # the least a trial that ran to the end needed: the smallest increment seen
    levels.ended(start, {"ram": 30 * MiB, "threads": 2})
    levels.ended(start, {"ram": 50 * MiB, "threads": 0})
    assert levels.start(alone=True).least == {"ram": 30 * MiB, "threads": 0}


def test_a_trial_garbage_is_collected_before_the_next_trial_starts() -> None:
    guard = MemoryGuard(None, omp.Budget(ram=_rss() + 2048 * MiB))

    def objective(trial: optuna.Trial) -> float:
        if trial.suggest_int("mb", 0, 200) > 0:
            _garbage(200)
        time.sleep(0.25)  # readings: the trial grew
        return 0.0

    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)))
    study.enqueue_trial({"mb": 200})
    study.enqueue_trial({"mb": 0})
    gc.disable()
    try:
        study.optimize(guard.wrap_objective(objective), n_trials=2)
    finally:
        gc.enable()
    first, second = (read_record(t.user_attrs) for t in study.trials)
    assert first.peak_ram - first.start_ram >= 190 * MiB
    assert second.start_ram - first.start_ram < 50 * MiB, (first.start_ram / MiB, second.start_ram / MiB)


def test_a_trial_after_a_large_one_is_recorded_with_its_start_level_and_its_own_increment() -> None:
    guard = MemoryGuard(None, omp.Budget(ram=_rss() + 2048 * MiB))

    def objective(trial: optuna.Trial) -> float:
        mb = trial.suggest_int("mb", 8, 300)
        block = np.ones(mb * MiB, dtype=np.uint8)
        if mb == 300:
            _KEPT.append(block)  # left behind: the process holds it after the trial
        time.sleep(0.3)
        return float(block[::4096].sum())

    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)))
    study.enqueue_trial({"mb": 300})
    study.enqueue_trial({"mb": 40})
    study.optimize(guard.wrap_objective(objective), n_trials=2)
    large, small = (read_record(t.user_attrs) for t in study.trials)
    assert all(t.state is TrialState.COMPLETE for t in study.trials)
    assert small.start_ram - large.start_ram >= 290 * MiB
    # what the first trial kept is its one-time cost (a cache), which a fresh process pays too: not left
    assert large.kept["ram"] >= 290 * MiB and small.leftover == {}
    increment = small.peak_ram - small.start_ram
    assert 38 * MiB <= increment <= 48 * MiB, increment / MiB  # what it allocated, within a few MiB
    assert small.peak_ram > large.peak_ram - 20 * MiB  # the process's peak: the large trial's memory is in it
    assert small.start_threads is not None and small.start_vram is None  # no GPU here: not read


def test_a_small_trial_after_one_that_crossed_the_budget_completes() -> None:
    budget = omp.Budget(ram=_rss() + 150 * MiB)
    guard = MemoryGuard(None, budget, monitor_interval=0.05)

    def objective(trial: optuna.Trial) -> float:
        if trial.suggest_int("mb", 10, 400) == 400:
            try:  # 400 MiB kept at module level, so the process stays over budget
                while len(_KEPT) < 50:
                    _KEPT.append(np.ones(8 * MiB, dtype=np.uint8))
            finally:  # the stop interrupts the loop about at the budget: what it keeps is made 400 MiB, well over
                _KEPT.extend(np.ones(8 * MiB, dtype=np.uint8) for _ in range(50 - len(_KEPT)))
        block = np.ones(10 * MiB, dtype=np.uint8)
        time.sleep(0.4)
        return float(block[::4096].sum())

    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)))
    study.enqueue_trial({"mb": 400})
    study.enqueue_trial({"mb": 10})
    study.enqueue_trial({"mb": 10})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study.optimize(guard.wrap_objective(objective), n_trials=3)
    large, *small = study.trials
    assert large.state is TrialState.PRUNED and read_record(large.user_attrs).decision is Decision.STOPPED
    for t in small:
        record = read_record(t.user_attrs)
        assert t.state is TrialState.COMPLETE, record.reason
        assert record.start_ram > budget.ram and record.peak_ram > budget.ram  # the process stayed over
        assert record.leftover["ram"] > 100 * MiB and "left by earlier trials" in record.reason
        assert record.constraints()["memprune_ram"] <= 0  # its own memory fit: the sampler is told so
    assert len([w for w in caught if "left by earlier trials" in str(w.message)]) == 1


def _alloc_study(
    guard: MemoryGuard, sizes: tuple[int, ...], *, left_mb: int, after: int, seconds: float = 0.3, high: int = 300
) -> tuple[optuna.Study, list[warnings.WarningMessage]]:
    """A study whose trials write ``mb`` MiB (enqueued: ``sizes``) and hold it ``seconds``; once trial ``after``
    ended, ``left_mb`` MiB are kept at module level (what it left behind). The study and the warnings."""

    def objective(trial: optuna.Trial) -> float:
        block = np.ones(trial.suggest_int("mb", 8, high) * MiB, dtype=np.uint8)
        time.sleep(seconds)
        return float(block[::4096].sum())

    def leave(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.number == after:
            _KEPT.append(np.ones(left_mb * MiB, dtype=np.uint8))

    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)))
    for mb in sizes:
        study.enqueue_trial({"mb": mb})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study.optimize(guard.wrap_objective(objective), n_trials=len(sizes), callbacks=[leave])
    return study, caught


def test_a_trial_that_fits_only_without_what_earlier_trials_left_is_admitted_not_rejected() -> None:
    # What was left (150 MiB, between two trials) puts the process 45 MiB under the soft line: the budget is
    # still reachable (the least trial here needed 20 MiB), but a 60 MiB trial does not fit beside it. It
    # would fit without it, so it is not rejected for it: admitted, held to the budget on its own memory. A
    # Lightning study in process (bench_clients) so had its last 9 trials rejected, each predicted 6-16 MiB
    # with the process 0.09 MiB under the line.
    budget = omp.Budget(ram=_rss() + 200 * MiB)
    guard = MemoryGuard(None, budget, monitor_interval=0.05)
    study, caught = _alloc_study(guard, (20, 40, 60, 80, 60), left_mb=150, after=3, seconds=0.2, high=150)
    records = [read_record(t.user_attrs) for t in study.trials]
    assert [r.decision for r in records[:4]] == [Decision.UNCHECKED] * 4, [r.reason for r in records]
    trial, record = study.trials[4], records[4]
    assert trial.state is TrialState.COMPLETE and record.decision is Decision.ADMITTED, record.reason
    assert 140 * MiB < record.leftover["ram"] < 170 * MiB
    assert "not charged to this trial (it would not fit beside it)" in record.reason
    assert record.peak_ram > budget.ram  # the process went over the budget, the trial's own memory did not
    assert record.constraints()["memprune_ram"] <= 0
    assert len([w for w in caught if "left by earlier trials" in str(w.message)]) == 1


def test_a_trial_run_unchecked_is_held_to_the_budget_on_its_own_memory_not_beside_what_was_left() -> None:
    # In the warm-up nothing predicts whether a trial fits beside what earlier trials left, so none is charged
    # it: the second trial (120 MiB of its own, 120 MiB left before it, a 200 MiB budget over the process)
    # completes, where the whole process's budget stopped it; one over the budget on its own is still stopped.
    budget = omp.Budget(ram=_rss() + 200 * MiB)
    guard = MemoryGuard(None, budget, monitor_interval=0.05)
    study, _ = _alloc_study(guard, (20, 120, 280), left_mb=120, after=0)
    first, second, third = study.trials
    record = read_record(second.user_attrs)
    assert second.state is TrialState.COMPLETE and record.decision is Decision.UNCHECKED, record.reason
    assert 110 * MiB < record.leftover["ram"] < 140 * MiB
    assert "not charged to this trial (nothing predicted it to fit beside it" in record.reason
    assert record.peak_ram > budget.ram  # the process went over the budget, the trial's own memory did not
    assert read_record(third.user_attrs).decision is Decision.STOPPED and third.state is TrialState.PRUNED


def test_a_footprint_functions_trial_is_held_to_the_budget_on_its_own_memory_in_a_shared_process() -> None:
    # A footprint function predicts a fresh process: a trial it admits is not stopped for what earlier trials
    # left (the demo soft-pruned a clamped trial at 693 MiB of a 691 MiB line, 30 MiB of it left before it).
    base = _rss()
    budget = omp.Budget(ram=base + 200 * MiB)
    guard = MemoryGuard(lambda p: omp.Footprint.of(ram=base + p["mb"] * MiB), budget, monitor_interval=0.05)
    study, _ = _alloc_study(guard, (10, 60), left_mb=150, after=0)
    trial = study.trials[1]
    record = read_record(trial.user_attrs)
    assert trial.state is TrialState.COMPLETE and record.decision is Decision.ADMITTED, record.reason
    assert 120 * MiB < record.leftover["ram"] < 180 * MiB
    assert "not charged to this trial (its footprint is a fresh process's)" in record.reason
    assert record.peak_ram > budget.ram  # the process went over the budget, the trial's own memory did not


def test_a_first_trial_pruned_by_the_study_keeps_its_one_time_costs_apart_too() -> None:
    # The demo's first trial is soft-pruned; what it kept (88 MiB: torch's first training step) was counted as
    # left by earlier trials, and every later trial was held to the budget plus that much.
    guard = MemoryGuard(None, omp.Budget(ram=_rss() + 1024 * MiB))

    def objective(trial: optuna.Trial) -> float:
        mb = trial.suggest_int("mb", 8, 300)
        if trial.number == 0:
            _KEPT.append(np.ones(100 * MiB, dtype=np.uint8))  # a cache the first trial starts
            raise optuna.TrialPruned("pruned by the study's pruner")
        return float(np.ones(mb * MiB, dtype=np.uint8)[::4096].sum())

    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)))
    study.enqueue_trial({"mb": 10})
    study.enqueue_trial({"mb": 10})
    study.optimize(guard.wrap_objective(objective), n_trials=2)
    first, second = (read_record(t.user_attrs) for t in study.trials)
    assert study.trials[0].state is TrialState.PRUNED and first.kept["ram"] >= 90 * MiB
    assert second.leftover == {} and "left by earlier trials" not in second.reason, second.reason


def test_a_process_that_holds_its_whole_budget_before_the_first_trial_is_told_so_once() -> None:
    # A budget set from the program's runs elsewhere sat at what its process held before any trial: every
    # trial was rejected or stopped and the program ended on "No feasible trials", nothing saying why.
    budget = omp.Budget(ram=_rss() - 4 * MiB)  # no room beyond noise (1% of the budget) in a small process
    guard = MemoryGuard(None, budget, monitor_interval=0.05)

    def objective(trial: optuna.Trial) -> float:
        return float(trial.suggest_int("mb", 8, 64))

    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study.optimize(guard.wrap_objective(objective), n_trials=2)
    told = [str(w.message) for w in caught if "before its first trial" in str(w.message)]
    assert len(told) == 1 and "of its " in told[0] and "Raise the budget" in told[0], told


def test_a_process_holding_most_of_the_budget_before_any_trial_still_completes_the_trials_that_fit() -> None:
    # a program whose imports hold most of the budget (Lightning's held 452 MiB of 520): the soft line's
    # margin is on the room above the process's usage, so a trial adding 10-40 MiB of a 160 MiB room runs to
    # its end through the study's own pruning calls, where 90% of the whole budget sat under the process
    ballast = np.ones(1536 * MiB, dtype=np.uint8)  # the program's own: over 90% of the budget below
    budget = omp.Budget(ram=_rss() + 160 * MiB)
    assert 0.9 * budget.ram < _rss()
    guard = MemoryGuard(None, budget, monitor_interval=0.02, search_space={"buffer_mb": IntDistribution(10, 40)})

    def objective(trial: optuna.Trial) -> float:
        block = np.ones(trial.suggest_int("buffer_mb", 10, 40) * MiB, dtype=np.uint8)
        for step in range(3):
            time.sleep(0.1)
            trial.report(float(step), step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return float(block[::4096].sum())

    study = optuna.create_study(
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)), pruner=guard.wrap_pruner(None)
    )
    for mb in (10, 40, 20, 30, 15, 25):
        study.enqueue_trial({"buffer_mb": mb})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study.optimize(guard.wrap_objective(objective), n_trials=6)
    assert not [w for w in caught if "before its first trial" in str(w.message)]  # 144 MiB of room: no word
    rows = [(t, read_record(t.user_attrs)) for t in study.trials]
    assert all(t.state is TrialState.COMPLETE for t, _ in rows), [(t.number, r.decision, r.reason) for t, r in rows]
    for t, r in rows[4:]:  # predicted: admitted on usage now + the bound, under the line above that usage
        assert r.decision in (Decision.ADMITTED, Decision.CLAMPED) and r.need["ram"] <= budget.ram, r.reason
        assert r.constraints()["memprune_ram"] <= 0
    del ballast


_CHILD = "import sys, time; b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); print(1, flush=True); time.sleep(60)"


@pytest.mark.parametrize("held_by", ["this process", "a child process"])
def test_a_first_trials_one_time_costs_are_kept_apart_and_later_trials_are_admitted(held_by: str) -> None:
    # The first trial of a process pays what no later trial pays again: a data set loaded once and cached, a
    # worker pool (scikit-learn's cross_val_score(n_jobs=2) started 470 MiB of loky workers in trial 0, kept
    # for the next trials), a CUDA context. Learned as that trial's increment, it stood 20-90x over the
    # others': the bound of a 10 MiB fit was 317 MiB and every trial after the warm-up was rejected. What the
    # first trial kept (its process's level once it ended and the guard gave back) is now on its record and
    # taken off the increment it is learned on.
    budget = omp.Budget(ram=_rss() + 300 * MiB + 200 * MiB)  # the cache plus room for any single trial
    guard = MemoryGuard(None, budget, monitor_interval=0.05)

    workers: list[subprocess.Popen] = []

    def objective(trial: optuna.Trial) -> float:
        if not _KEPT and not workers:  # started on first use, kept for the rest of the study
            if held_by == "this process":
                _KEPT.append(np.ones(300 * MiB, dtype=np.uint8))
            else:  # a worker pool's process, as loky's
                workers.append(subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE))
                workers[0].stdout.readline()  # its 300 MiB written
        block = np.ones(trial.suggest_int("buffer_mb", 10, 60) * MiB, dtype=np.uint8)
        time.sleep(0.2)
        return float(block[::4096].sum())

    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)))
    for mb in (40, 20, 50, 30, 45, 15, 35, 25):
        study.enqueue_trial({"buffer_mb": mb})
    try:
        study.optimize(guard.wrap_objective(objective), n_trials=8)
    finally:
        for w in workers:
            w.kill()
            w.wait()
    rows = [(t, read_record(t.user_attrs)) for t in study.trials]
    assert all(t.state is TrialState.COMPLETE for t, _ in rows), [(t.number, r.decision, r.reason) for t, r in rows]
    first = rows[0][1]
    assert 280 * MiB <= first.kept["ram"] <= 330 * MiB, first.kept  # the cache, not the trial's 40 MiB block
    assert all(not r.kept for _, r in rows[1:])  # only a process's first trial has one-time costs
    learning = Learning(learned(), corrected=False)
    own = {o.number: o.peaks["ram"] for o in learning.refresh(study).observations}
    assert 30 * MiB <= own[0] <= 60 * MiB, own[0] / MiB  # learned on its 40 MiB, as the later trials are
    for _, r in rows[4:]:  # after the warm-up: admitted on a bound near what such trials take
        assert r.decision in (Decision.ADMITTED, Decision.CLAMPED), r.reason
        assert r.learned["bound"]["ram"] < 150 * MiB, r.learned


def test_a_footprint_function_is_compared_alone_in_a_shared_process() -> None:
    # A footprint function predicts a whole process (the interpreter's baseline included): adding the start
    # level would count the baseline twice and reject this trial, which fits.
    rss = _rss()
    budget = omp.Budget(ram=int((rss + 150 * MiB) / 0.9))
    guard = MemoryGuard(
        lambda p: omp.Footprint.of(ram=rss + p["mb"] * MiB), budget, search_space={"mb": IntDistribution(8, 64)}
    )

    def objective(trial: optuna.Trial) -> float:
        block = np.ones(trial.suggest_int("mb", 8, 64) * MiB, dtype=np.uint8)
        return float(block[::4096].sum())

    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)))
    study.optimize(guard.wrap_objective(objective), n_trials=3)
    for t in study.trials:
        record = read_record(t.user_attrs)
        assert record.decision is Decision.ADMITTED and record.need == {} and record.start_ram > rss // 2


def _state(start: int, prediction: int, allowance: dict | None = None) -> TrialGuardState:
    state = TrialGuardState(0, 0, start={"ram": start, "vram": None, "threads": 4}, allowance=allowance or {})
    state.prediction = omp.Footprint.of(ram=prediction)
    return state


def _policy(learn: bool) -> Policy:
    return Policy(
        None if learn else (lambda p: omp.Footprint()),
        omp.Budget(ram="1GiB"),
        on_infeasible="reject",
        clamp=None,
        search_space=None,
        interval=0.1,
        soft=0.9,
        learning=Learning(learned(miss_rate=0.2), corrected=False) if learn else None,
    )


def test_admission_adds_usage_now_to_a_learned_increment_and_a_footprint_function_stands_alone() -> None:
    learned_policy, function_policy = _policy(True), _policy(False)  # the soft line: 921.6 MiB
    state = _state(start=500 * MiB, prediction=400 * MiB)
    base = charged(learned_policy, state)
    assert base == {"ram": 500 * MiB} and learned_policy.need(state.prediction, base) == {"ram": 900 * MiB}
    assert not learned_policy.excess(state.prediction, base)  # 500 + 400 fits
    over = omp.Footprint.of(ram=500 * MiB)
    # the soft line above usage now: 500 MiB + 90% of the 524 MiB above it (the margin is for the predicted)
    assert learned_policy.line(base) == {"ram": int(0.9 * 1024 * MiB + 0.1 * 500 * MiB)}
    assert learned_policy.excess(over, base) == {"ram": 1000 * MiB - int(0.9 * 1024 * MiB + 0.1 * 500 * MiB)}
    assert "500.00 MiB in use + 500.00 MiB" in learned_policy.describe_excess(over, base)
    assert not learned_policy.excess(over)  # alone it would fit: usage now is what rejects it
    # where what was left made the budget unreachable, admission does not charge it
    assert charged(learned_policy, _state(950 * MiB, 400 * MiB, {"ram": 400 * MiB})) == {"ram": 550 * MiB}
    # a footprint function's whole-process figure is compared alone; the runner's trials have no start level
    assert charged(function_policy, state) is None and function_policy.need(state.prediction, None) == {}
    assert charged(learned_policy, TrialGuardState(0, 0)) is None


def test_what_was_left_is_set_aside_only_where_it_makes_the_budget_unreachable() -> None:
    policy = _policy(True)  # a 1 GiB budget, soft 0.9: the soft line above a level L is L + 0.9 x (1024 MiB - L)
    assert allowance(policy, Start({"ram": 1030 * MiB}, {"ram": 400 * MiB}, {})) == {"ram": 400 * MiB}
    assert allowance(policy, Start({"ram": 900 * MiB}, {"ram": 400 * MiB}, {})) == {}  # a trial may still fit
    # ... unless no trial that ran to the end here would: the least one needed 120 MiB (111.6 MiB of room)
    assert allowance(policy, Start({"ram": 900 * MiB}, {"ram": 400 * MiB}, {"ram": 120 * MiB})) == {"ram": 400 * MiB}
    assert allowance(policy, Start({"ram": 900 * MiB}, {"ram": 400 * MiB}, {"ram": 100 * MiB})) == {}
    assert allowance(policy, Start({"ram": 1030 * MiB}, {"ram": 5 * MiB}, {})) == {}  # noise, not what was left
    assert allowance(policy, Start({"ram": 1030 * MiB}, {"ram": 0}, {})) == {}  # the process began over: the budget's


def test_the_start_fields_round_trip_and_old_records_read() -> None:
    study = optuna.create_study()
    trial = study.ask()
    record = TrialRecord(
        Decision.ADMITTED,
        start_ram=300 * MiB,
        start_vram=None,
        start_threads=5,
        leftover={"ram": 64 * MiB},
        need={"ram": 900 * MiB},
        kept={"ram": 128 * MiB},
        budget_ram=2**30,
        peak_ram=2**30,
    )
    write(trial, record)
    back = read(trial.user_attrs)
    assert (back.start_ram, back.start_vram, back.start_threads) == (300 * MiB, None, 5)
    assert back.leftover == {"ram": 64 * MiB} and back.need == {"ram": 900 * MiB} and back.kept == {"ram": 128 * MiB}
    assert type(trial.user_attrs["memprune:start_ram"]) is int and "memprune:start_vram" not in trial.user_attrs
    # the peak less what was left, and what admission compared, both count in the constraint
    assert record.constraints()["memprune_ram"] == pytest.approx(-64 / 1024)  # 1 GiB - 64 MiB vs 1 GiB (soft 1.0)
    old = {
        k: v
        for k, v in trial.user_attrs.items()
        if not k.split(":")[1].startswith(("start_", "leftover_", "need_", "kept_"))
    }
    again = read(old)
    assert (again.start_ram, again.start_threads, again.leftover, again.need, again.kept) == (None, None, {}, {}, {})


def test_a_short_trial_under_an_earlier_trials_peak_is_recorded_with_its_own_peak() -> None:
    # A trial shorter than one monitor reading that stays under an earlier trial's peak left no peak (the
    # process's VmHWM did not move), so no observation: a learned guard's warm-up waited on such trials for a
    # whole study (scripts/core/learned_study.py on a fast machine: 13 of 20 unchecked). The process's peak
    # is now reset at the start of a trial alone in it.
    guard = MemoryGuard(None, omp.Budget(ram=_rss() + 2048 * MiB), monitor_interval=10)  # no reading in a trial

    def objective(trial: optuna.Trial) -> float:
        block = np.ones(trial.suggest_int("mb", 8, 300) * MiB, dtype=np.uint8)  # written: resident
        return float(block[::4096].sum())

    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)))
    study.enqueue_trial({"mb": 300})
    study.enqueue_trial({"mb": 60})
    try:
        study.optimize(guard.wrap_objective(objective), n_trials=2)
    finally:  # its monitor would read on for a few idle readings of 10 s: stopped here, not left to later tests
        watch = watch_of(guard)
        with watch._lock:
            monitor, watch._monitor = watch._monitor, None
        if monitor is not None:
            monitor.stop()
    large, small = (read_record(t.user_attrs) for t in study.trials)
    # what each wrote, within what the rest of a loaded test process frees or adds meanwhile (287 MiB for the
    # 300 in one CI run)
    assert large.peak_ram - large.start_ram >= 250 * MiB, (large.peak_ram - large.start_ram) / MiB
    assert small.peak_ram is not None, "no peak recorded for the short trial"
    assert 45 * MiB <= small.peak_ram - small.start_ram <= 80 * MiB, (small.peak_ram - small.start_ram) / MiB
