"""Studies of many light trials in process (Optuna's quadratic examples, a pruning demo on iris): each trial is
observed even when it is shorter than one monitor reading and takes no memory, and the learned model is not
refitted after every one of them once it knows enough trials."""

from __future__ import annotations

import mmap
import subprocess
import sys
import threading

import numpy as np
import optuna
import psutil
import pytest

import optuna_memprune as omp
from optuna_memprune.estimate.learn import learned
from optuna_memprune.guard._learning import ALWAYS_REFIT, Learning
from optuna_memprune.guard._start import reset_rss_peak
from optuna_memprune.guard._watch import TRIM_ABOVE, Live
from optuna_memprune.guard.backend import trials_of
from optuna_memprune.records import Decision

MiB = 2**20
_EXTRA: list[int] = []  # MiB a trial takes beyond its ``mb`` (none the params show)
_FAIL: list[str] = []  # "before" or "after" it allocated


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _rss() -> int:
    return psutil.Process().memory_info().rss


def quadratic(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -100, 100)
    y = trial.suggest_categorical("y", [-1, 0, 1])
    return x**2 + y


def block(trial: optuna.Trial) -> float:
    mb = trial.suggest_int("mb", 8, 64)
    if _FAIL == ["before"]:
        raise ValueError("the trial failed before it allocated")
    held = np.ones((mb + sum(_EXTRA)) * MiB, dtype=np.uint8)
    if _FAIL == ["after"]:
        raise ValueError("the trial failed after it allocated")
    return float(held[::4096].sum())


def test_trials_shorter_than_a_reading_that_take_no_memory_are_observed_and_admitted() -> None:
    # Optuna's quadratic example, in process: each trial takes about a millisecond and no memory. With no
    # monitor reading in it and the process's peak not risen, no trial was observed: all 323 trials of a
    # one-second run stayed unchecked in the warm-up. The peak, reset for each trial, is its peak.
    guard = omp.MemoryGuard(None, omp.Budget(ram=_rss() + 1024 * MiB), monitor_interval=0.5)
    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)))
    study.optimize(guard.wrap_objective(quadratic), n_trials=8)
    rows = [omp.read_record(t.user_attrs) for t in study.trials]
    assert all(r is not None and r.peak_ram is not None and r.start_ram is not None for r in rows), rows
    assert all(abs(r.peak_ram - r.start_ram) < 16 * MiB for r in rows), [(r.peak_ram, r.start_ram) for r in rows]
    assert [r.decision for r in rows[4:]] == [Decision.ADMITTED] * 4, [(r.decision, r.reason) for r in rows]
    assert all(r.learned["n"] >= 4 for r in rows[4:])


def test_a_process_started_by_a_larger_one_reads_its_own_peak_after_the_reset() -> None:
    # getrusage's ru_maxrss never falls below what a process held before its exec: the size of the process
    # that started it. A program memprune run started from a 558 MiB test process read 558 MiB for every trial.
    held = np.ones(400 * MiB, dtype=np.uint8)  # this process, the parent, at 400 MiB more
    code = (
        "from optuna_memprune.guard._start import reset_rss_peak; from optuna_memprune.guard._peak_rss import "
        "peak_rss; import psutil; assert reset_rss_peak(); print(peak_rss(), psutil.Process().memory_info().rss)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    peak, rss = map(int, out.stdout.split())
    assert rss - MiB <= peak < rss + 16 * MiB < _rss() - 300 * MiB, (peak / MiB, rss / MiB, _rss() / MiB)
    del held


def test_a_model_that_knows_enough_trials_is_refitted_for_news_or_when_its_time_share_allows() -> None:
    guard = omp.MemoryGuard(None, omp.Budget(ram=_rss() + 1500 * MiB), monitor_interval=0.05)
    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)))
    for mb in range(8, 8 + 2 * (ALWAYS_REFIT + 2), 2):
        study.enqueue_trial({"mb": mb})
    study.optimize(guard.wrap_objective(block), n_trials=ALWAYS_REFIT + 2)

    learning = Learning(learned(), corrected=False)
    fits: list[int] = []
    fit = learning.settings.fit
    learning.settings.fit = lambda observations, **kw: fits.append(len(observations)) or fit(observations, **kw)  # type: ignore[method-assign]

    def one(mb: int) -> None:
        study.enqueue_trial({"mb": mb})
        study.optimize(guard.wrap_objective(block), n_trials=1, catch=(ValueError,))
        learning.refresh(study)

    learning.refresh(study)
    assert fits == [ALWAYS_REFIT + 2] and learning.model.ready
    learning._fit_seconds = 3600.0  # as if the last fit took an hour: only news refits before its share is due
    one(30)  # inside what the model knows and under its bound: nothing new enough to refit for
    assert fits == [ALWAYS_REFIT + 2] and len(learning.model.observations) == ALWAYS_REFIT + 2
    _EXTRA.append(300)
    try:
        one(30)  # 330 MiB where the bound of 30 is about 30: a miss, refitted at once with both trials
    finally:
        _EXTRA.clear()
    assert fits[1:] == [ALWAYS_REFIT + 4], fits
    learning._fit_seconds = 3600.0
    _FAIL.append("before")
    try:
        one(30)  # failed before it allocated: a lower bound, but far under the fit of its params (it moves nothing)
        assert fits[2:] == [] and not learning.model.observations[-1].censored, fits
        _FAIL[0] = "after"
        _EXTRA.append(200)
        one(20)  # failed after it took 220 MiB, over the fit of 20: a lower bound that moves it, refitted at once
    finally:
        _FAIL.clear()
        _EXTRA.clear()
    assert fits[2:] == [ALWAYS_REFIT + 6], fits
    assert [o.censored for o in learning.model.observations[-2:]] == [True, True]
    learning._fit_seconds = 0.0  # a fit that took no time is always due
    one(26)
    assert fits[3:] == [ALWAYS_REFIT + 7], fits


def test_a_trial_that_raised_the_reset_peak_by_a_few_pages_leaves_the_heap_untrimmed() -> None:
    # malloc_trim ran after most trivial trials once each trial's peak was reset (every page a rise); it is
    # worth its 0.08 ms only where the trial raised the peak by more than TRIM_ABOVE
    guard = omp.MemoryGuard(lambda p: omp.Footprint(), omp.Budget(ram="64GiB"))
    for size, grew in ((512 * 1024, False), (8 * MiB, True)):
        state = trials_of(guard).open(-1, -1)
        live = Live(guard, state, threading.get_ident(), reset=reset_rss_peak())
        block = mmap.mmap(-1, size)  # new pages, not free heap: the peak rises by the size
        block.write(b"x" * size)
        assert live.peaks()["ram"] is not None
        assert live.grew() is grew, (size, TRIM_ABOVE)
        block.close()
        trials_of(guard).close(state.trial_id)
