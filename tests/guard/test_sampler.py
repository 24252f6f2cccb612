"""GuardedSampler: Optuna's own sampler test cases, the lookahead, clamping, rejection and constraints.

The adversarial studies run on a real SQLite file and allocate real memory sized by the params.
"""

from __future__ import annotations

import math
import threading
import time
import warnings

import numpy as np
import optuna
import psutil
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.testing.pytest_samplers import BasicSamplerTestCase, RelativeSamplerTestCase
from optuna.trial import TrialState

import optuna_memprune as omp
from optuna_memprune.guard import Decision, GuardedSampler, MemoryGuard, read_record
from optuna_memprune.guard.backend import policy_of, trials_of

MiB = 2**20
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _numeric_footprint(params: dict) -> omp.Footprint:
    """100 MiB per unit of every numeric param (negative values count as 0): clamps often."""
    units = sum(max(0.0, float(v)) for v in params.values() if isinstance(v, (int, float)))
    return omp.Footprint.of(ram=int(100 * MiB * units), threads=2)


def _guarded(base: optuna.samplers.BaseSampler, **kwargs) -> GuardedSampler:
    guard = MemoryGuard(_numeric_footprint, omp.Budget(ram="800MiB", threads=8), **kwargs)
    return guard.wrap_sampler(base)


_BASES = {
    "tpe": lambda: optuna.samplers.TPESampler(seed=1),
    "random": lambda: optuna.samplers.RandomSampler(seed=1),
    "gp": lambda: optuna.samplers.GPSampler(seed=1, n_startup_trials=5),
}


class TestGuardedSamplerBasic(BasicSamplerTestCase):
    """Optuna's BasicSamplerTestCase on GuardedSampler(TPE | Random | GP), clamping and rejecting."""

    @pytest.fixture(
        params=[("tpe", "clamp"), ("random", "clamp"), ("gp", "clamp"), ("tpe", "reject")], ids=lambda p: "-".join(p)
    )
    def sampler(self, request):  # type: ignore[no-untyped-def]
        base, policy = request.param
        return lambda: _guarded(_BASES[base](), on_infeasible=policy)


class TestGuardedSamplerRelative(RelativeSamplerTestCase):
    """Optuna's RelativeSamplerTestCase on GuardedSampler(TPE multivariate | GP)."""

    @pytest.fixture(params=["tpe", "gp"])
    def sampler(self, request):  # type: ignore[no-untyped-def]
        return lambda: _guarded(_BASES[request.param]())


# -- the lookahead and clamping ------------------------------------------------------------------


def _base() -> int:
    """This process's RSS plus headroom: the budget is the whole process's, so footprints start here."""
    return psutil.Process().memory_info().rss + 512 * MiB


def _space_study(guard: MemoryGuard, seed: int = 0) -> optuna.Study:
    return optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=seed)))


@pytest.mark.parametrize(
    "dist",
    [
        IntDistribution(1, 1000),
        IntDistribution(8, 1024, step=8),
        IntDistribution(1, 4096, log=True),
        FloatDistribution(1.0, 1000.0),
        FloatDistribution(1.0, 1000.0, step=0.5),
        FloatDistribution(1.0, 4096.0, log=True),
        CategoricalDistribution([16, 64, 256, 1024]),
    ],
    ids=["int", "int-step", "int-log", "float", "float-step", "float-log", "cat-numeric"],
)
def test_clamp_lowers_to_the_highest_fitting_value_within_the_distribution(dist) -> None:
    base = _base()
    budget = omp.Budget(ram=base + 300 * MiB)
    guard = MemoryGuard(
        lambda p: omp.Footprint.of(ram=base + int(p["x"] * MiB)),
        budget,
        search_space={"x": dist, "other": FloatDistribution(0, 1)},
    )
    study = _space_study(guard)
    seen = []

    def objective(trial: optuna.Trial) -> float:
        x = guard_suggest(trial, "x", dist)
        trial.suggest_float("other", 0, 1)
        seen.append(x)
        return x

    study.optimize(guard.wrap_objective(objective), n_trials=25)
    for trial, x in zip(study.trials, seen):
        record = read_record(trial.user_attrs)
        assert trial.params["x"] == x
        assert dist._contains(dist.to_internal_repr(x)) and type(x) is type(
            dist.to_external_repr(dist.to_internal_repr(x))
        )
        # the footprint's own figure (whole bytes): x * MiB unrounded may pass the line by a fraction of a byte
        assert base + int(x * MiB) <= policy_of(guard).limits["ram"] < budget.ram, (x, record)  # under the soft line
        if record.decision is Decision.CLAMPED:
            assert record.clamped_from["x"] > x
            # The nearest feasible value: the next value up the grid no longer fits.
            assert base + int(_next_up(dist, x) * MiB) > policy_of(guard).limits["ram"]
    assert any(read_record(t.user_attrs).decision is Decision.CLAMPED for t in study.trials)


def guard_suggest(trial: optuna.Trial, name: str, dist):  # type: ignore[no-untyped-def]
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)


def _next_up(dist, x):  # type: ignore[no-untyped-def]
    if isinstance(dist, CategoricalDistribution):
        return min((c for c in dist.choices if c > x), default=math.inf)
    if isinstance(dist, IntDistribution):
        return x + dist.step
    if dist.step is not None:
        return x + dist.step
    return x * (1 + 2e-3) if dist.log else x + 1e-3 * (dist.high - dist.low)


def test_clamp_only_the_declared_params_and_categoricals_by_footprint() -> None:
    kinds = {"sgd": 0, "adam": 2, "lbfgs": 10}  # optimizer state, in units of the model
    space = {
        "width": IntDistribution(16, 512),
        "batch": IntDistribution(16, 512),
        "optimizer": CategoricalDistribution(["lbfgs", "adam", "sgd"]),
    }

    def footprint(p):  # type: ignore[no-untyped-def]
        model = p["width"] * MiB
        return omp.Footprint.of(ram=base + model * (1 + kinds[p["optimizer"]]) + p["batch"] * MiB)

    base = _base()
    budget = omp.Budget(ram=base + 1500 * MiB)
    guard = MemoryGuard(footprint, budget, clamp=["optimizer", "batch"], search_space=space)
    study = _space_study(guard, seed=3)
    study.optimize(guard.wrap_objective(lambda t: _suggest_all(t, space)), n_trials=40)
    clamped = [t for t in study.trials if read_record(t.user_attrs).decision is Decision.CLAMPED]
    assert clamped
    for t in clamped:
        record = read_record(t.user_attrs)
        assert set(record.clamped_from) <= {"optimizer", "batch"}
        assert footprint(t.params).ram <= policy_of(guard).limits["ram"]
        if "optimizer" in record.clamped_from:  # a lower-footprint choice, never a higher one
            assert kinds[t.params["optimizer"]] < kinds[record.clamped_from["optimizer"]]
    for t in study.trials:
        if read_record(t.user_attrs).decision is Decision.REJECTED:  # width alone is over budget
            assert footprint({**t.params, "optimizer": "sgd", "batch": 16}).ram > policy_of(guard).limits["ram"]


def _suggest_all(trial: optuna.Trial, space: dict) -> float:
    return float(sum(hash(guard_suggest(trial, n, d)) % 7 for n, d in space.items()))


def test_enqueued_params_are_kept_and_the_rest_is_lowered() -> None:
    space = {"a": IntDistribution(1, 1000), "b": IntDistribution(1, 1000)}
    base = _base()
    guard = MemoryGuard(
        lambda p: omp.Footprint.of(ram=base + (p["a"] + p["b"]) * MiB),
        omp.Budget(ram=base + 1000 * MiB),
        search_space=space,
        soft=1.0,
    )  # the soft line at the budget: plain arithmetic
    study = _space_study(guard)
    study.enqueue_trial({"a": 900, "b": 900})  # both fixed: nothing may be lowered
    study.enqueue_trial({"a": 1000})  # b would have to go below its low end
    for _ in range(5):
        study.enqueue_trial({"a": 900})  # a fixed; b is drawn and lowered to 100 at most
    study.optimize(guard.wrap_objective(lambda t: _suggest_all(t, space)), n_trials=7)
    records = [read_record(t.user_attrs) for t in study.trials]
    for t, r in zip(study.trials[:2], records[:2]):
        assert r.decision is Decision.REJECTED and t.state is TrialState.PRUNED
        assert set(t.params) == {"a", "b"}
    assert study.trials[0].params == {"a": 900, "b": 900}
    assert "no param may be lowered (fixed: ['a', 'b'])" in records[0].reason  # the reason says why
    assert "no assignment fits by lowering ['b']" in records[1].reason
    for t, r in zip(study.trials[2:], records[2:]):
        assert t.params["a"] == 900 and t.params["b"] <= 100 and t.state is TrialState.COMPLETE
        assert r.decision in (Decision.ADMITTED, Decision.CLAMPED)
        if r.decision is Decision.CLAMPED:
            assert set(r.clamped_from) == {"b"} and t.params["b"] == 100
    assert any(r.decision is Decision.CLAMPED for r in records[2:])


def test_a_prediction_must_stay_under_the_soft_line_to_be_admitted() -> None:
    # Above the soft line the guarded pruner would prune the trial at its first should_prune().
    base = _base()
    budget = omp.Budget(ram=base + 1000 * MiB)
    guard = MemoryGuard(
        lambda p: omp.Footprint.of(ram=int(p["x"] * budget.ram)),
        budget,
        on_infeasible="reject",
        search_space={"x": CategoricalDistribution([0.85, 0.95])},
    )
    study = _space_study(guard)
    study.enqueue_trial({"x": 0.85})
    study.enqueue_trial({"x": 0.95})
    study.optimize(guard.wrap_objective(lambda t: t.suggest_categorical("x", [0.85, 0.95])), n_trials=2)
    fits, over = (read_record(t.user_attrs) for t in study.trials)
    assert fits.decision is Decision.ADMITTED and over.decision is Decision.REJECTED
    assert "90% of the budget" in over.reason
    assert study.trials[0].constraints["memprune_ram"] < 0 < study.trials[1].constraints["memprune_ram"]


# -- rejection, constraints, unchecked trials ------------------------------------------------------


def test_rejected_trials_store_the_whole_space_and_never_run_the_objective(tmp_path) -> None:
    storage = f"sqlite:///{tmp_path / 'reject.db'}"
    ran = []

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_int("x", 1, 100)
        lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
        kind = trial.suggest_categorical("kind", ["a", "b"])
        ran.append(trial.number)
        return x * lr + (kind == "a")

    baseline = psutil.Process().memory_info().rss + 100 * MiB  # the budget is the whole process's
    guard = MemoryGuard(
        lambda p: omp.Footprint.of(ram=baseline + p["x"] * MiB, threads=1),
        omp.Budget(ram=baseline + 50 * MiB, threads=256),
        on_infeasible="reject",
        soft=1.0,
    )
    study = optuna.create_study(storage=storage, sampler=guard.wrap_sampler(optuna.samplers.TPESampler(seed=0)))
    study.optimize(guard.wrap_objective(objective), n_trials=30)
    trials = optuna.load_study(study_name=study.study_name, storage=storage).trials
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    rejected = [t for t in trials if read_record(t.user_attrs).decision is Decision.REJECTED]
    assert rejected
    for t in trials:
        assert set(t.constraints) == {"memprune_ram", "memprune_threads"}  # the same keys on every trial
        assert all(math.isfinite(v) for v in t.constraints.values())
    for t in rejected:
        assert t.state is TrialState.PRUNED and t.number not in ran
        assert set(t.params) == {"x", "lr", "kind"}
        assert t.params["x"] > 50 and t.constraints["memprune_ram"] > 0
        assert "predicted over budget" in read_record(t.user_attrs).reason
    for t in trials:
        if t.number in ran:
            assert read_record(t.user_attrs).decision is not Decision.STOPPED and t.state is TrialState.COMPLETE
    assert read_record(trials[0].user_attrs).decision is Decision.UNCHECKED


def test_a_broken_footprint_leaves_the_trial_unchecked_and_the_study_going() -> None:
    def footprint(p):  # type: ignore[no-untyped-def]
        if p["x"] > 6:
            raise KeyError("no such layer")
        if p["x"] > 3:
            return "garbage"
        return omp.Footprint.of(ram=base + p["x"] * MiB)

    base = _base()
    guard = MemoryGuard(footprint, omp.Budget(ram=base + 2**30))
    study = _space_study(guard)
    study.optimize(guard.wrap_objective(lambda t: t.suggest_int("x", 0, 9)), n_trials=30)
    assert all(t.state is TrialState.COMPLETE for t in study.trials)
    reasons = [read_record(t.user_attrs).reason for t in study.trials[1:] if t.params["x"] > 3]
    assert reasons and all("footprint function failed" in r for r in reasons)
    assert any("KeyError" in r for r in reasons) and any("not a Footprint" in r for r in reasons)
    assert all(set(t.constraints) == {"memprune_ram"} for t in study.trials)


def test_a_new_conditional_param_makes_the_trial_unchecked() -> None:
    base = _base()
    guard = MemoryGuard(
        lambda p: omp.Footprint.of(ram=base + MiB * (p.get("y", 0) + p.get("z", 0))), omp.Budget(ram=base + 2**30)
    )
    study = _space_study(guard)

    def objective(trial: optuna.Trial) -> float:
        if trial.number == 0 or trial.suggest_categorical("branch", ["y", "z"]) == "y":
            return trial.suggest_int("y", 0, 10)
        return trial.suggest_int("z", 0, 10)

    study.optimize(guard.wrap_objective(objective), n_trials=12)
    records = [read_record(t.user_attrs) for t in study.trials]
    assert records[0].decision is Decision.UNCHECKED
    first_z = next(t.number for t in study.trials if "z" in t.params)
    assert records[first_z].decision is Decision.UNCHECKED and "'z'" in records[first_z].reason
    assert any(r.decision is Decision.ADMITTED for r in records[first_z + 1 :])


def test_guarded_sampler_is_thread_safe_with_n_jobs() -> None:
    base = _base()
    guard = MemoryGuard(
        lambda p: omp.Footprint.of(ram=base + int(p["x"] * MiB)), omp.Budget(ram=base + 500 * MiB), soft=1.0
    )
    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.TPESampler(seed=0)), direction="maximize")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.optimize(guard.wrap_objective(lambda t: t.suggest_float("x", 0, 1000)), n_trials=40, n_jobs=4)
    assert len(study.trials) == 40
    for t in study.trials:
        assert t.state is TrialState.COMPLETE
        record = read_record(t.user_attrs)
        if record.decision is not Decision.UNCHECKED:
            assert t.params["x"] <= 500
    assert trials_of(guard).registered() == {}, trials_of(guard).registered()
    deadline = time.monotonic() + 5  # the guard's monitor stops by itself once no trial runs
    while [t for t in threading.enumerate() if t.name.startswith("memprune-monitor")]:
        assert time.monotonic() < deadline, "a monitor thread outlived its trials"
        time.sleep(0.05)


def test_an_unknown_clamp_name_warns_once_the_space_is_known_and_the_trials_run_unchecked() -> None:
    # Without search_space= the names can only be checked once a trial's space is known: never mid-trial.
    guard = MemoryGuard(lambda p: omp.Footprint(), omp.Budget(ram=_base()), clamp=["widht"])
    study = _space_study(guard)
    study.optimize(guard.wrap_objective(lambda t: t.suggest_int("width", 1, 9)), n_trials=1)
    with pytest.warns(UserWarning, match="widht") as caught:
        study.optimize(guard.wrap_objective(lambda t: t.suggest_int("width", 1, 9)), n_trials=2)
    assert len([w for w in caught if "widht" in str(w.message)]) == 1
    assert all(t.state.is_finished() for t in study.trials)
    assert omp.read_record(study.trials[-1].user_attrs).reason == (
        "clamp names ['widht'] are not params of the search space ['width']: the trial runs unchecked under the monitor"
    )


# -- the adversarial study (acceptance 2) ----------------------------------------------------------

_FITS_MIB = 64  # the study's budget leaves room for 64 MiB of replay buffer: about half the space


def _adversarial(tmp_path, policy: str, n_trials: int, **tpe):  # type: ignore[no-untyped-def]
    """TPE on a score that grows with memory; the footprint rules out about half the space.

    The params are sized like rl-zoo's: a replay buffer of ``buffer_mib`` per env, ``n_envs`` envs. The
    objective allocates and touches ``buffer_mib * n_envs`` MiB for real; the budget is this process's RSS
    now plus 64 MiB (and a margin), so what does not fit would really cross it.
    """
    baseline = psutil.Process().memory_info().rss + 32 * MiB
    # the soft line (90%) leaves 64 MiB, not a byte less: rounded down, 64 MiB fitted or not with the RSS read
    budget = omp.Budget(ram=math.ceil((baseline + _FITS_MIB * MiB) / 0.9) + 16)

    def footprint(p):  # type: ignore[no-untyped-def]
        return omp.Footprint.of(ram=baseline + p["buffer_mib"] * p["n_envs"] * MiB, name="buffer")

    ran: list[tuple[int, dict]] = []

    def objective(trial: optuna.Trial) -> float:
        buffer_mib = trial.suggest_categorical("buffer_mib", [8, 16, 32, 64, 128])
        n_envs = trial.suggest_categorical("n_envs", [1, 2, 4, 8])
        lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        ran.append((trial.number, dict(trial.params)))
        buffer = np.ones(buffer_mib * n_envs * MiB, dtype=np.uint8)  # real pages, sized by the params
        filled = float(buffer[::4096].sum()) * 4096 / MiB  # MiB actually touched
        del buffer
        return filled * (1 - abs(math.log10(lr) + 2.5) / 10)  # more memory, better score

    # The space declared: trial 0 is checked too. Unchecked, it was stopped or not by the monitor's timing (its
    # buffer of up to 1 GiB against a reading every 0.1 s), and TPE's history, so the shares, moved with it.
    space = {
        "buffer_mib": CategoricalDistribution([8, 16, 32, 64, 128]),
        "n_envs": CategoricalDistribution([1, 2, 4, 8]),
        "lr": FloatDistribution(1e-4, 1e-1, log=True),
    }
    guard = MemoryGuard(footprint, budget, on_infeasible=policy, search_space=space)
    seed = tpe.get("seed", 7)
    storage = f"sqlite:///{tmp_path / f'adversarial-{policy}-{seed}.db'}"
    study = optuna.create_study(
        storage=storage,
        direction="maximize",
        sampler=guard.wrap_sampler(optuna.samplers.TPESampler(**{"seed": 7, **tpe})),
        pruner=guard.wrap_pruner(optuna.pruners.NopPruner()),
    )
    study.optimize(guard.wrap_objective(objective), n_trials=n_trials)
    trials = optuna.load_study(study_name=study.study_name, storage=storage).trials
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    return trials, ran, footprint, policy_of(guard).limits["ram"]


def _shares(records, decision: Decision) -> list[float]:  # type: ignore[no-untyped-def]
    return [
        sum(r.decision is decision for r in records[s : s + 20]) / len(records[s : s + 20])
        for s in range(0, len(records), 20)
    ]


def test_adversarial_clamp_launches_nothing_over_budget_and_stores_what_ran(tmp_path) -> None:
    trials, ran, footprint, limit = _adversarial(tmp_path, "clamp", 40)
    records = [read_record(t.user_attrs) for t in trials]
    print(
        "clamped share of TPE's proposals per block of 20:",
        " ".join(f"{s:.2f}" for s in _shares(records, Decision.CLAMPED)),
    )
    assert sum(r.decision is Decision.CLAMPED for r in records) >= 5
    stored = {t.number: t.params for t in trials}
    for number, params in ran:
        assert stored[number] == params  # the stored params are the ones the objective ran with
        assert footprint(params).ram <= limit  # the search space is declared: nothing launches over budget
    for t, r in zip(trials, records):
        assert footprint(t.params).ram <= limit and r.pred_ram <= limit
        if r.decision is Decision.CLAMPED:  # lowered to the nearest choices that fit, nothing else
            assert set(r.clamped_from) <= {"buffer_mib", "n_envs"}
            assert all(t.params[n] < v for n, v in r.clamped_from.items())
    assert all(r.decision is not Decision.STOPPED for r in records)


def test_adversarial_reject_teaches_tpe_the_infeasible_region(tmp_path) -> None:
    # The first block of 20 is TPE's random startup: the share a sampler that learns nothing proposes.
    # One run's blocks of 20 are noisy (a binomial of 20: +-0.11), so the shares are averaged over seeds.
    runs = []
    for seed in range(4):
        trials, ran, footprint, limit = _adversarial(tmp_path, "reject", 100, seed=seed, n_startup_trials=20)
        records = [read_record(t.user_attrs) for t in trials]
        launched = {number for number, _ in ran}
        for t, r in zip(trials, records):
            if t.number in launched:  # zero launches predicted over budget
                assert r.pred_ram <= limit and footprint(t.params).ram <= limit
            if r.decision is Decision.REJECTED:
                assert t.state is TrialState.PRUNED and t.number not in launched
                assert set(t.params) == {"buffer_mib", "n_envs", "lr"} and t.constraints["memprune_ram"] > 0
        runs.append(_shares(records, Decision.REJECTED))
        print(
            f"seed {seed}: infeasible share of TPE's proposals per block of 20:", " ".join(f"{s:.2f}" for s in runs[-1])
        )
    shares = np.mean(runs, axis=0)
    print("mean over seeds:", " ".join(f"{s:.2f}" for s in shares))
    assert np.mean(shares[1:]) < 0.8 * shares[0]  # learned: well under the random startup's share
    assert shares[-1] < shares[0]  # and still under it at the end


def test_reject_mode_leaves_tpe_exactly_the_search_its_own_constraints_give() -> None:
    # What reject mode teaches TPE is what TPE's own constraint handling learns: with the same seed, a
    # guarded study proposes the same params, trial for trial, as bare TPE told the same constraints.
    baseline = psutil.Process().memory_info().rss + 256 * MiB  # the monitor reads this whole process

    def footprint(p):  # type: ignore[no-untyped-def]
        return omp.Footprint.of(ram=baseline + p["buffer_mib"] * p["n_envs"] * MiB)

    def suggest(trial: optuna.Trial) -> tuple[int, int, float]:
        return (
            trial.suggest_categorical("buffer_mib", [8, 16, 32, 64, 128]),
            trial.suggest_categorical("n_envs", [1, 2, 4, 8]),
            trial.suggest_float("lr", 1e-4, 1e-1, log=True),
        )

    def score(b: int, e: int, lr: float) -> float:
        return b * e * (1 - abs(math.log10(lr) + 2.5) / 10)

    guard = MemoryGuard(footprint, omp.Budget(ram=baseline + 64 * MiB), on_infeasible="reject", soft=1.0)
    guarded = optuna.create_study(
        direction="maximize",
        pruner=guard.wrap_pruner(),
        sampler=guard.wrap_sampler(optuna.samplers.TPESampler(seed=0, n_startup_trials=20)),
    )
    guarded.optimize(guard.wrap_objective(lambda t: score(*suggest(t))), n_trials=60)
    bare = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=20))
    for _ in range(60):
        trial = bare.ask()
        b, e, lr = suggest(trial)
        trial.set_constraint("memprune_ram", (b * e - 64) / 1024)
        if b * e > 64:
            bare.tell(trial, state=TrialState.PRUNED)
        else:
            bare.tell(trial, score(b, e, lr))
    assert [t.params for t in guarded.trials] == [t.params for t in bare.trials]
    rejected = [read_record(t.user_attrs).decision is Decision.REJECTED for t in guarded.trials]
    # trial 0 ran unchecked (no search space known yet); every later infeasible proposal was rejected
    assert rejected[1:] == [t.state is TrialState.PRUNED for t in bare.trials][1:] and any(rejected[20:])


def test_a_grid_runs_each_point_once_and_a_point_over_budget_is_rejected_not_moved() -> None:
    # GridSampler writes the trial's grid point in before_trial; the lookahead gave it the trial Optuna read
    # before that, and GridSampler raised from the second trial on (every trial after the first FAIL). A
    # point lowered would run another point twice and this one never: it is rejected.
    base = _base()
    guard = MemoryGuard(
        lambda p: omp.Footprint.of(ram=base - 512 * MiB + p["rows"] * 100 * MiB),
        omp.Budget(ram=base + 100 * MiB),
        search_space={"rows": IntDistribution(1, 8), "lr": FloatDistribution(1e-3, 1)},  # trial 0 checked too
    )
    grid = {"rows": [1, 2, 8], "lr": [0.1, 0.01]}
    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.GridSampler(grid, seed=0)))
    study.optimize(guard.wrap_objective(lambda t: t.suggest_int("rows", 1, 8) * t.suggest_float("lr", 1e-3, 1)))
    ran = sorted((t.params["rows"], t.params["lr"]) for t in study.trials if t.state is TrialState.COMPLETE)
    assert ran == [(1, 0.01), (1, 0.1), (2, 0.01), (2, 0.1)]  # each point once, as the grid has them
    rejected = [t for t in study.trials if t.state is TrialState.PRUNED]
    assert sorted(t.params["lr"] for t in rejected) == [0.01, 0.1] and {t.params["rows"] for t in rejected} == {8}
    for t in rejected:
        record = read_record(t.user_attrs)
        assert record.decision is Decision.REJECTED and "a GridSampler point" in record.reason, record.reason


def test_a_clamp_of_a_param_the_trial_never_suggests_is_said_on_its_record() -> None:
    # optuna-integration's LightGBMTuner: a trial of the bagging step was "clamped" on num_leaves 198 -> 68, a
    # param of another step that the lookahead drew and the trial never suggested (it ran with the tuner's
    # fixed value). The record says so.
    base = _base()

    def footprint(p: dict) -> omp.Footprint:
        return omp.Footprint.of(ram=base - 512 * MiB + p.get("leaves", 1) * 100 * MiB)

    guard = MemoryGuard(footprint, omp.Budget(ram=base + 300 * MiB))
    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)))
    study.enqueue_trial({"leaves": 1})

    def objective(trial: optuna.Trial) -> float:
        if trial.number == 0:
            return trial.suggest_int("leaves", 1, 64)  # the first step's param
        return trial.suggest_float("fraction", 0.1, 1.0)  # a later step's: leaves stays as it was

    study.optimize(guard.wrap_objective(objective), n_trials=6)
    later = [(t.params, read_record(t.user_attrs)) for t in study.trials[1:]]
    clamped = [(p, r) for p, r in later if r.decision is Decision.CLAMPED]
    assert clamped, [r.reason for _, r in later]  # leaves drawn up to 64 (6.4 GiB): lowered
    for params, record in clamped:
        assert "leaves" not in params and "leaves" in record.clamped_from
        assert record.reason.endswith("; the trial suggested no ['leaves']: it ran without what was lowered there")
