"""MemoryGuard(None, budget): footprints learned from the study's own trials, with real allocations and
real storages, in process and process per trial; the model rebuilt from the records after a restart."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.distributions import FloatDistribution, IntDistribution

import optuna_memprune as omp
from optuna_memprune.guard.backend import policy_of, trials_of
from optuna_memprune.ledger import HostBudget, Ledger
from optuna_memprune.records import Decision

import _learned_objectives as objectives

MiB = 2**20
SPACE = {"mb": IntDistribution(8, 480, log=True), "lr": FloatDistribution(1e-4, 1e-1, log=True)}


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _study(url: str, guard: omp.MemoryGuard, seed: int = 0) -> optuna.Study:
    return optuna.create_study(
        storage=url,
        study_name="learned",
        load_if_exists=True,
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=seed)),
        pruner=guard.wrap_pruner(None),
    )


def _records(study: optuna.Study) -> list[tuple[optuna.trial.FrozenTrial, omp.guard.TrialRecord]]:
    out = []
    for t in study.trials:
        assert t.state.is_finished(), f"trial {t.number} left {t.state.name}"
        record = omp.read_record(t.user_attrs)
        assert record is not None, f"trial {t.number} has no record"
        out.append((t, record))
    return out


def _check_warmup_then_bound(rows, warmup: int) -> list:
    """Every trial before ``warmup`` trials were observed (ran to the end, or were stopped: a lower bound; two
    at least to the end) is unchecked and says it warms up (or was rejected for dominating a stopped trial);
    from then on every trial's prediction is the learned bound."""
    seen = done = 0
    bounded = []
    for t, r in rows:
        if seen < warmup or done < 2:
            assert r.learned["phase"] == "warm-up", (t.number, r)
            assert r.decision in (Decision.UNCHECKED, Decision.STOPPED, Decision.REJECTED), (t.number, r)
            if r.decision is Decision.UNCHECKED:
                assert "warming up" in r.reason and r.pred_ram is None, (t.number, r.reason)
        else:
            assert r.learned["phase"] == "bound" and r.learned["n"] >= 2, (t.number, r.learned)
            assert r.decision in (Decision.ADMITTED, Decision.CLAMPED, Decision.REJECTED), (t.number, r)
            assert r.pred_ram is not None and "learned upper bound" in r.breakdown["components"][0]["name"]
            bounded.append((t, r))
        done += t.state == optuna.trial.TrialState.COMPLETE and r.decision is not Decision.STOPPED
        seen += r.decision is not Decision.REJECTED
    return bounded


def test_in_process_trials_run_unchecked_through_the_warmup_then_are_checked_by_the_learned_bound(tmp_path) -> None:
    base = psutil.Process().memory_info().rss
    budget = omp.Budget(ram=base + 320 * MiB)
    guard = omp.MemoryGuard(None, budget, search_space=SPACE, learn=omp.estimate.learned(miss_rate=0.2))
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = _study(url, guard)
    study.optimize(guard.wrap_objective(objectives.alloc), n_trials=10)
    bounded = _check_warmup_then_bound(_records(study), warmup=4)
    assert len(bounded) >= 4
    errors = []
    for t, r in bounded:
        bound = r.learned["bound"]["ram"]  # what the guard decided on; pred_ram is the fit
        assert bound >= r.pred_ram
        # in process a learned bound is admitted on the process's usage at the start plus the bound
        compared, charged = r.need["ram"], r.start_ram - r.leftover.get("ram", 0)
        assert compared == charged + bound, (t.number, r)
        line = int(0.9 * budget.ram + 0.1 * charged)  # the soft line above the usage at the start
        if r.decision is not Decision.REJECTED:  # admitted and clamped trials fit: the bound held
            assert r.peak_ram <= budget.ram and compared <= line, (t.number, r)
            own = r.peak_ram - r.start_ram  # the trial's own increment: what the learned fit predicts here
            # relative to 1 MiB at least: a trial can take nothing new where it reuses what an earlier one freed
            # (its peak, the process's VmHWM reset at its start, is then its start's RSS)
            errors.append((own - r.pred_ram) / max(own, MiB))
        else:
            assert compared > line and r.constraints()["memprune_ram"] > 0  # the constraint uses it
    errors.sort()
    assert abs(errors[len(errors) // 2]) < 0.05, errors  # the fit's median error
    # the report: the learned predictions are their own rows, quality line and plot
    from optuna_memprune import report

    data = report.build(study)
    learned = json.loads(report.render_json(data))["learned"]
    assert [row["number"] for row in learned["rows"]] == list(range(10))
    assert learned["median_rel_error_center"] is not None and learned["warmup_trials"] >= 4
    assert 'id="plot-learned"' in report.render_html(data)
    # a restart: a new guard knows nothing but the storage, and its first trial is checked by the bound
    fresh = omp.MemoryGuard(None, budget, search_space=SPACE, learn=omp.estimate.learned(miss_rate=0.2))
    again = _study(url, fresh, seed=1)
    again.optimize(fresh.wrap_objective(objectives.alloc), n_trials=1)
    last = omp.read_record(again.trials[-1].user_attrs)
    assert last.learned["phase"] == "bound" and last.learned["n"] >= 4 and last.pred_ram is not None


def test_a_stopped_trial_makes_every_larger_assignment_rejected_even_in_the_warmup(tmp_path) -> None:
    base = psutil.Process().memory_info().rss
    budget = omp.Budget(ram=base + 200 * MiB)
    guard = omp.MemoryGuard(None, budget, search_space=SPACE)
    study = _study(f"sqlite:///{tmp_path / 'study.db'}", guard)
    study.enqueue_trial({"mb": 300, "lr": 1e-3})  # over the budget: stopped in process
    study.enqueue_trial({"mb": 400, "lr": 1e-3})  # larger in the param that takes memory: rejected
    study.enqueue_trial({"mb": 20, "lr": 1e-3})  # smaller: nothing known, unchecked
    study.optimize(guard.wrap_objective(objectives.alloc), n_trials=3)
    (_, first), (_, second), (_, third) = _records(study)
    assert first.decision is Decision.STOPPED
    assert second.decision is Decision.REJECTED and "at least trial #0" in second.breakdown["components"][0]["name"]
    assert third.decision is Decision.UNCHECKED and "warming up" in third.reason


def test_a_stopped_trial_counts_toward_the_warmup_as_a_lower_bound(tmp_path) -> None:
    # a study whose first draw crossed the budget is predicted from its fifth trial, not its sixth; the
    # stopped trial's reach holds the bound of larger assignments up
    base = psutil.Process().memory_info().rss
    guard = omp.MemoryGuard(None, omp.Budget(ram=base + 200 * MiB), search_space=SPACE)
    study = _study(f"sqlite:///{tmp_path / 'study.db'}", guard)
    for mb in (300, 20, 60, 120, 40):
        study.enqueue_trial({"mb": mb, "lr": 1e-3})
    study.optimize(guard.wrap_objective(objectives.alloc), n_trials=5)
    rows = _records(study)
    assert rows[0][1].decision is Decision.STOPPED
    assert [r.learned["phase"] for _, r in rows[:4]] == ["warm-up"] * 4
    assert "1 of 4 trials observed (0 to the end, 2 needed)" in rows[1][1].reason, rows[1][1].reason
    fifth = rows[4][1]
    assert fifth.learned["phase"] == "bound" and fifth.learned["n"] == 3, fifth.learned
    # predicted (admitted, or rejected where the bound of three completed trials is still wide: in one full
    # run under load it was)
    assert fifth.decision in (Decision.ADMITTED, Decision.CLAMPED, Decision.REJECTED) and fifth.pred_ram is not None
    model = policy_of(guard).learning.model
    assert model.bound({"mb": 400, "lr": 1e-3})["ram"] >= rows[0][1].peak_ram - rows[0][1].start_ram


@pytest.mark.slow
def test_optimize_workers_share_the_learned_model_through_the_storage(tmp_path) -> None:
    budget = omp.Budget(ram="700MiB")
    guard = omp.MemoryGuard(None, budget, search_space=SPACE, learn=omp.estimate.learned(miss_rate=0.2))
    url = f"sqlite:///{tmp_path / 'study.db'}"
    ledger = Ledger(
        HostBudget(ram="4GiB", headroom=0.0), url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", host="test-host"
    )
    omp.optimize(
        _study(url, guard), objectives.alloc, guard=guard, n_trials=8, n_jobs=2, host=ledger, enforce="polling"
    )
    rows = _records(optuna.load_study(study_name="learned", storage=url))
    assert any(r.learned["phase"] == "bound" for _, r in rows)
    # another worker of the same storage (the guard as it travels: pickled, no model) starts where it stands
    other = pickle.loads(pickle.dumps(guard))
    omp.optimize(_study(url, other, seed=2), objectives.alloc, guard=other, n_trials=1, host=ledger, enforce="polling")
    last = omp.read_record(optuna.load_study(study_name="learned", storage=url).trials[-1].user_attrs)
    assert last.learned["phase"] == "bound" and last.learned["n"] >= 4 and last.pred_ram is not None


@pytest.mark.parametrize("stop", [False, True])
def test_a_trial_asked_while_one_runs_whose_end_completes_the_warm_up_waits_for_it(tmp_path, stop) -> None:
    # With n_jobs=2 the fifth trial was asked while the fourth ran, and ran unchecked, in every program of
    # bench_clients. Here two recorded trials (10 and 12 MiB, peaks near 1 GiB) and warmup=3: a 40 MiB trial
    # runs 4 s in the warm-up; the 8 MiB trial asked meanwhile waits for its end, which completes the warm-up,
    # and is decided on the bound; the last 40 MiB trial, covered by the long one, is admitted under its peak.
    url = f"sqlite:///{tmp_path / 'study.db'}"
    guard = omp.MemoryGuard(None, omp.Budget(ram="1GiB"), learn=omp.estimate.learned(warmup=3))
    study = optuna.create_study(
        storage=url, sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)), pruner=guard.wrap_pruner(None)
    )
    for mb, peak in ((10, 1000), (12, 1010)):
        record = omp.guard.TrialRecord(Decision.ADMITTED, peak_ram=peak * MiB, budget_ram=2**30, soft=0.9)
        study.add_trial(
            optuna.trial.create_trial(
                params={"mb": mb}, distributions={"mb": SPACE["mb"]}, value=0.0, user_attrs=record.attrs()
            )
        )
    for params in ({"mb": 40, "seed": 3 if stop else 1}, {"mb": 8, "seed": 0}, {"mb": 40, "seed": 2}):
        study.enqueue_trial(params)
    ledger = Ledger(HostBudget(ram="4GiB", headroom=0.0), url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", host="h")
    omp.optimize(study, objectives.alloc_held, guard=guard, n_trials=3, n_jobs=2, host=ledger, enforce="polling")
    long, waited = (omp.read_record(t.user_attrs) for t in study.trials[2:4])
    assert long.learned["phase"] == "warm-up" and waited.learned is not None
    if stop:  # the long trial stopped the study as it ended: the waiting one runs as first checked
        assert waited.decision is Decision.UNCHECKED and "checked again" not in waited.reason, waited.reason
        assert study.trials[3].state is optuna.trial.TrialState.COMPLETE
        assert study.trials[4].state is optuna.trial.TrialState.WAITING  # never asked after study.stop()
        return
    assert waited.learned["phase"] == "bound", waited.reason
    assert "checked again once a running trial ended (first: learned footprint warming up" in waited.reason
    last_trial = study.trials[4]
    last = omp.read_record(last_trial.user_attrs)
    assert last_trial.state is optuna.trial.TrialState.COMPLETE and last.decision is Decision.ADMITTED, last.reason
    assert last.learned["bound"]["ram"] < long.peak_ram + 32 * MiB  # capped by the long trial's peak


def test_may_change_names_what_a_running_trials_end_can_change() -> None:
    from optuna_memprune.guard import GuardedSampler
    from optuna_memprune.guard.backend import TrialGuardState

    def state(decision: Decision, **learned: object) -> TrialGuardState:
        out = TrialGuardState(0, 0)
        out.decision, out.learned = decision, {"mode": "learned", **learned}
        return out

    assert GuardedSampler.may_change(state(Decision.REJECTED, phase="bound"))
    assert not GuardedSampler.may_change(state(Decision.REJECTED, phase="warm-up"))  # on a stopped trial's peak
    warming = state(Decision.UNCHECKED, phase="warm-up", to_observe=2)
    assert GuardedSampler.may_change(warming) and GuardedSampler.may_change(warming, 2)
    assert not GuardedSampler.may_change(warming, 1)  # one end does not complete the warm-up: it runs now
    assert not GuardedSampler.may_change(state(Decision.UNCHECKED, phase="explore"), 3)
    corrected = state(Decision.UNCHECKED, phase="warm-up", to_observe=1)
    corrected.learned = {**(corrected.learned or {}), "mode": "corrected"}
    assert not GuardedSampler.may_change(corrected, 1)


def test_in_process_threads_a_learned_rejection_waits_for_a_running_trial_to_end() -> None:
    # study.optimize(n_jobs=2) in one process: as the runners do, the rejected trial waits for the running one.
    # In memory: on SQLite two threads' asks can both pop the same enqueued trial (Optuna's
    # _pop_waiting_trial_id reads, then sets RUNNING, with no lock there), and it then ran twice.
    budget = psutil.Process().memory_info().rss + 600 * MiB
    guard = omp.MemoryGuard(None, omp.Budget(ram=budget), learn=omp.estimate.learned(warmup=3))
    study = optuna.create_study(
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)), pruner=guard.wrap_pruner(None)
    )
    for mb in (10, 12):  # whole processes at the budget: every assignment from 10 MiB on is over the line
        record = omp.guard.TrialRecord(Decision.ADMITTED, peak_ram=budget, budget_ram=budget, soft=0.9)
        study.add_trial(
            optuna.trial.create_trial(
                params={"mb": mb}, distributions={"mb": SPACE["mb"]}, value=0.0, user_attrs=record.attrs()
            )
        )
    for params in ({"mb": 40, "seed": 1}, {"mb": 8, "seed": 0}, {"mb": 40, "seed": 2}):
        study.enqueue_trial(params)
    study.optimize(guard.wrap_objective(objectives.alloc_held), n_trials=3, n_jobs=2)
    rows = _records(study)[2:]
    assert [t.state for t, _ in rows] == [optuna.trial.TrialState.COMPLETE] * 3, [(t.state, r.reason) for t, r in rows]
    last = rows[2][1]
    assert last.decision is Decision.ADMITTED and last.learned["phase"] == "bound", last.reason
    assert "checked again once a running trial ended (first: predicted over budget: RAM" in last.reason, last.reason


def test_a_trial_below_every_observed_one_whose_fit_is_under_the_line_runs_unchecked_to_be_observed() -> None:
    # the bound below the range seen is the low end's: over the line there, a smaller trial would be rejected
    # forever (a rejected trial is never observed); its fit under the line lets it run under the monitor
    from optuna_memprune.estimate.learn import Observation
    from optuna_memprune.guard._call import NoFootprint
    from optuna_memprune.guard._learning import Learning

    learning = Learning(omp.estimate.learned(miss_rate=0.2), corrected=False)
    peaks = {100: 700, 150: 760, 200: 690, 300: 820, 400: 900, 500: 1000}  # noisy: a wide bound
    learning.model = learning.settings.fit(
        [Observation({"n": n}, {"ram": p * MiB}, number=i) for i, (n, p) in enumerate(peaks.items())]
    )
    limits = {"ram": 685 * MiB}  # between the fit at the low end (681 MiB) and its bound (696 MiB), under every peak
    assert learning.ready and learning.model.bound({"n": 50})["ram"] > limits["ram"]
    assert learning.explore({"n": 50}, limits) == ["n"]
    with pytest.raises(NoFootprint, match="exploring"):
        learning.footprint({"n": 50}, None, limits)
    assert learning.info({"n": 50}, None, True, limits)["phase"] == "explore"
    assert learning.explore({"n": 150}, limits) == []  # inside the range seen: the bound decides
    # the fit itself over the line, and no trial ran to the end under it: the smallest is tried all the same
    assert learning.explore({"n": 50}, {"ram": 600 * MiB}) == ["n"]
    # at 690 MiB, trial n=200 ran to the end at the line and covers n=50: admitted at the line, not explored
    assert learning.footprint({"n": 50}, None, {"ram": 690 * MiB}).ram == 690 * MiB


def _gpt2(width: int, layers: int, batch: int) -> dict[str, float]:
    return {"n_embd": width, "n_layer": layers, "learning_rate": 3e-4, "per_device_train_batch_size": batch}


def _gpt2_learning(stopped: list[tuple[int, ...]], run: tuple[int, ...], peak_mib: int):  # type: ignore[no-untyped-def]
    """A learned guard's model of GPT-2 trials: ``stopped`` at 620 MiB, one ``run`` to the end at ``peak_mib``."""
    from optuna_memprune.estimate.learn import Observation
    from optuna_memprune.guard._learning import Learning

    rows = [Observation(_gpt2(*p), {"ram": 620 * MiB}, censored=True) for p in stopped]
    learning = Learning(omp.estimate.learned(), corrected=False)
    learning.model = learning.settings.fit([*rows, Observation(_gpt2(*run), {"ram": peak_mib * MiB})])
    return learning


def test_where_no_trial_ran_to_the_end_under_the_line_the_smallest_runs_unchecked_to_be_observed() -> None:
    # One GPT-2 run to the end at 568 MiB (420 of them imports), over the 558 MiB line, and four stopped at
    # 620: the fit was that level everywhere, the last 15 trials were rejected and the program ended with "No
    # feasible trials" (bench_clients, n_jobs=2), while the smallest of them ran alone at 421-497 MiB.
    from optuna_memprune.guard._call import NoFootprint

    learning = _gpt2_learning([(448, 5, 57), (576, 6, 35), (1024, 4, 34), (640, 8, 10)], (256, 4, 19), 568)
    limits = {"ram": 558 * MiB}
    assert learning.ready and learning.model.center(_gpt2(64, 3, 19))["ram"] > limits["ram"]
    assert learning.explore(_gpt2(64, 3, 19), limits) == ["n_embd", "n_layer"]
    with pytest.raises(NoFootprint, match="than every trial run to the end .* none of which came in under the line"):
        learning.footprint(_gpt2(64, 3, 19), None, limits)
    assert learning.explore(_gpt2(1024, 4, 19), limits) == []  # wider than the trial run to the end: the bound decides
    assert learning.explore(_gpt2(256, 4, 19), limits) == []  # that trial itself
    # wider, but smaller in the product of the sizes (width x layers x batch 4,096 against 19,456)
    assert learning.explore(_gpt2(512, 1, 8), limits) == ["n_layer", "per_device_train_batch_size"]


def test_where_the_one_trial_run_to_the_end_has_the_smallest_batch_and_depth_a_smaller_product_is_explored() -> None:
    # The one trial run to the end (width 704, 1 layer, batch 8: the smallest batch and depth of the space) at
    # 606 MiB, over the 558 MiB line; four stopped at 620. No later trial is covered by it in every size (each
    # has a batch over 8 or more layers), and the last 15 of 20 were rejected with exit 1 (bench_clients,
    # n_jobs=2), among them width 192, 1 layer, batch 10, a third of its width and not a third more batch.
    learning = _gpt2_learning([(576, 5, 50), (576, 6, 35), (448, 6, 94), (1024, 4, 34)], (704, 1, 8), 606)
    limits = {"ram": 558 * MiB}
    assert learning.ready and learning.model.bound(_gpt2(192, 1, 10))["ram"] > limits["ram"]
    assert learning.model.below(_gpt2(192, 1, 10), _gpt2(704, 1, 8)) is None  # not covered: batch 10 > 8
    assert learning.explore(_gpt2(192, 1, 10), limits) == ["n_embd"]
    assert learning.explore(_gpt2(256, 1, 12), limits) == ["n_embd"]
    assert learning.explore(_gpt2(832, 1, 10), limits) == []  # wider and more batch: the bound decides (rejected)
    assert learning.explore(_gpt2(64, 7, 89), limits) == []  # narrower, but the product is larger
    assert learning.explore(_gpt2(576, 6, 35), limits) == []  # as large as a stopped trial: over, never explored


def test_a_trial_covered_by_one_run_to_the_end_under_the_line_is_not_rejected_for_the_noise_on_its_peak() -> None:
    # One plain torch MLP run to the end at 397 MiB, under the 405 MiB line, four stopped at 450: the cap of the
    # trials it covers is its peak plus a reading's noise (405.57 MiB), and they were rejected, 15 of 20 in all
    # (bench_clients, n_jobs=2), among them width 64, 2 layers, batch 109.
    from optuna_memprune.estimate.learn import Observation
    from optuna_memprune.guard._learning import Learning

    def mlp(width: int, depth: int, batch: int) -> dict[str, float]:
        return {"width": width, "depth": depth, "batch_size": batch, "lr": 1e-3}

    stopped = [(7488, 4, 35), (4544, 3, 42), (3520, 3, 26), (7936, 2, 71)]
    rows = [Observation(mlp(*p), {"ram": 450 * MiB}, censored=True) for p in stopped]
    learning = Learning(omp.estimate.learned(), corrected=False)
    learning.model = learning.settings.fit([*rows, Observation(mlp(1472, 2, 127), {"ram": 397 * MiB})])
    limits = {"ram": 405 * MiB}
    assert learning.model.bound(mlp(64, 2, 109))["ram"] > limits["ram"]  # the ceiling: 397 MiB and the noise
    assert learning.footprint(mlp(64, 2, 109), None, limits).ram == limits["ram"]  # at the line: admitted
    assert learning.footprint(mlp(320, 1, 94), None, limits).ram == limits["ram"]
    assert learning.footprint(mlp(1024, 3, 11), None, limits).ram > limits["ram"]  # deeper: not covered
    assert learning.footprint(mlp(1472, 2, 127), None, {"ram": 390 * MiB}).ram > 390 * MiB  # it ran over this line


def test_a_clamp_search_that_passes_below_the_observed_range_still_clamps_or_rejects() -> None:
    # the clamp search tries lower values of each param, below every observed trial's too; a candidate
    # there once raised the "exploring" answer out of the search, and the trial ran unchecked as sampled
    from optuna.samplers import BaseSampler

    from optuna_memprune.estimate.learn import Observation

    class Always300(BaseSampler):
        def infer_relative_search_space(self, study, trial):
            return {}

        def sample_relative(self, study, trial, search_space):
            return {}

        def sample_independent(self, study, trial, param_name, param_distribution):
            return 300

    space = {"n": IntDistribution(10, 1000)}
    guard = omp.MemoryGuard(
        None, omp.Budget(ram=int(690 * MiB / 0.9) + 1), search_space=space, learn=omp.estimate.learned(miss_rate=0.2)
    )
    learning = policy_of(guard).learning
    peaks = {100: 700, 150: 760, 200: 690, 300: 820, 400: 900, 500: 1000}
    learning.model = learning.settings.fit(
        [Observation({"n": n}, {"ram": p * MiB}, number=i) for i, (n, p) in enumerate(peaks.items())]
    )
    assert learning.model.bound({"n": 300})["ram"] > 690 * MiB and learning.explore({"n": 50}, policy_of(guard).limits)
    study = optuna.create_study(sampler=guard.wrap_sampler(Always300()), pruner=guard.wrap_pruner(None))
    trial = study.ask()
    trial.suggest_int("n", 10, 1000)
    state = trials_of(guard).get(trial._trial_id)
    assert state.decision in (Decision.CLAMPED, Decision.REJECTED), (state.decision, state.reason)
    assert "exploring" not in state.reason
    if state.decision is Decision.CLAMPED:
        assert trial.params["n"] < 300 and state.prediction.ram <= 690 * MiB


def test_a_learning_rate_like_param_is_never_clamped() -> None:
    # a footprint that moves with the learning rate (a fit once put a sliver of memory on it): lowering it
    # would fit, but a rate takes no memory: the search lowers the size, or finds nothing
    from optuna_memprune.guard._clamp import ClampSearch

    search = ClampSearch(
        lambda p: omp.Footprint.of(ram=int(p["mb"] * MiB + p["learning_rate"] * 1e9)),
        lambda f: {"ram": f.ram - 500 * MiB} if f.ram > 500 * MiB else {},
        {"ram": 500 * MiB},
    )
    space = {"mb": IntDistribution(8, 480), "learning_rate": FloatDistribution(1e-4, 1e-1, log=True)}
    start = {"mb": 480, "learning_rate": 0.05}
    clamped, footprint = search.clamp(start, space, ["learning_rate", "mb"], search._predict(start))
    assert clamped["learning_rate"] == 0.05 and clamped["mb"] < 480 and footprint.ram <= 500 * MiB
    assert search.clamp(start, space, ["learning_rate"], search._predict(start)) is None


def test_trials_are_predicted_from_the_fifth_and_no_rate_is_ever_clamped(tmp_path) -> None:
    # real allocations, no footprint function, the default miss rate: four trials observed, then every trial
    # is checked by the learned bound (or runs unchecked to explore below every observed trial); a clamp
    # lowers mb, the param that takes memory, never lr
    base = psutil.Process().memory_info().rss
    budget = omp.Budget(ram=base + 320 * MiB)
    guard = omp.MemoryGuard(None, budget, search_space=SPACE)
    study = _study(f"sqlite:///{tmp_path / 'study.db'}", guard)
    study.optimize(guard.wrap_objective(objectives.alloc), n_trials=12)
    rows = _records(study)
    done = 0
    for t, r in rows:
        if done >= 4:
            assert r.learned["phase"] in ("bound", "explore"), (t.number, r.learned)
        assert "lr" not in (r.clamped_from or {}), (t.number, r.reason)
        done += t.state == optuna.trial.TrialState.COMPLETE and r.decision is not Decision.STOPPED
    assert done >= 5 and any(r.learned["phase"] == "bound" for _, r in rows)


def test_trials_pruned_by_the_studys_pruner_count_toward_the_warmup(tmp_path) -> None:
    # a trial pruned after its RSS settled (a training trial's peak comes at its first optimizer step) is
    # an observation of what it takes: four of them, and the fifth trial is predicted
    base = psutil.Process().memory_info().rss
    guard = omp.MemoryGuard(None, omp.Budget(ram=base + 600 * MiB), search_space=SPACE)
    study = _study(f"sqlite:///{tmp_path / 'study.db'}", guard)
    for mb in (20, 60, 120, 200):
        study.enqueue_trial({"mb": mb, "lr": 1e-3})
    study.optimize(guard.wrap_objective(objectives.alloc_then_pruned), n_trials=5)
    rows = _records(study)
    assert all(t.state == optuna.trial.TrialState.PRUNED for t, _ in rows)
    assert [r.learned["phase"] for _, r in rows[:4]] == ["warm-up"] * 4
    assert rows[4][1].learned["phase"] in ("bound", "explore") and rows[4][1].learned["n"] == 4, rows[4][1].learned


def test_the_runner_reserves_a_learned_bound_as_it_is(tmp_path) -> None:
    # the bound is already at the stated miss rate: a margin on top would count the error twice
    from optuna_memprune.runner._reserve import Reservations

    guard = omp.MemoryGuard(None, omp.Budget(ram="2GiB"), search_space=SPACE)
    study = _study(f"sqlite:///{tmp_path / 'study.db'}", guard)
    study.optimize(guard.wrap_objective(objectives.alloc), n_trials=2)
    ledger = Ledger(
        HostBudget(ram="4GiB", headroom=0.0), url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", host="test-host"
    )
    margins = Reservations(study, policy_of(guard).budget, ledger).margins()
    assert margins == {"ram": 1.0, "vram": 1.0, "threads": 1.0}
    fp = omp.Footprint.of(ram=300 * MiB)
    assert Reservations(study, policy_of(guard).budget, ledger).request(fp, margins).ram == 300 * MiB


def test_a_timeline_that_settled_early_is_a_plateau_and_a_growing_one_is_not() -> None:
    from optuna_memprune.guard._learning import plateaued

    settled = [(0.1 * i, (300 + min(i, 2) * 100) * MiB, 4, None) for i in range(10)]
    growing = [(0.1 * i, (300 + i * 50) * MiB, 4, None) for i in range(10)]
    assert plateaued(settled) and not plateaued(growing)
    assert not plateaued(settled[:2]) and not plateaued([])  # too few readings to say
    # measured over the trial's start in a shared process: 2% of the increment, not of the process
    late = [(0.1 * i, 1000 * MiB + (50 if i < 6 else 60) * MiB, 4, None) for i in range(10)]
    assert plateaued(late) and not plateaued(late, start=1000 * MiB)
