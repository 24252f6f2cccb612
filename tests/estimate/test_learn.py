"""The learned footprint's model (estimate/learn.py) on synthetic observations and real recorded trials:
directions, monotone bounds, censored trials, which params take memory, the bound's coverage at its stated
miss rate and its width as trials are added, corrected mode and bad input."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from optuna_memprune.estimate import learned
from optuna_memprune.estimate.checks import EstimateError
from optuna_memprune.estimate.learn import Observation, Role, role

from _recorded import KERAS_TRIALS, TORCH_MLP_TRIALS

MiB = 2**20


def _truth(p: dict) -> float:
    """A DQN-like peak: baseline, a buffer linear in maxlen, weights quadratic in width, activations
    width x batch, an optimizer state that only Adam has; ``chunks`` lowers memory as it grows."""
    return (
        300 * MiB
        + p["maxlen"] * 4000
        + p["width"] ** 2 * 64
        + p["batch"] * p["width"] * 16
        + (50 * MiB if p["opt"] == "adam" else 0)
        + 200 * MiB // p["chunks"]
    )


def _sample(rng: np.random.Generator) -> dict:
    return {
        "maxlen": int(rng.integers(1000, 200_000)),
        "width": int(2 ** rng.uniform(5, 11)),
        "batch": int(rng.choice([32, 64, 128, 256])),
        "lr": float(10 ** rng.uniform(-5, -2)),
        "opt": str(rng.choice(["adam", "sgd"])),
        "chunks": int(rng.integers(1, 9)),
    }


def _observe(rng: np.random.Generator, n: int, noise: float = 0.04) -> list[Observation]:
    out = []
    for i in range(n):
        p = _sample(rng)
        out.append(Observation(p, {"ram": _truth(p) * rng.uniform(1 - noise, 1 + noise), "threads": 5}, number=i))
    return out


def test_directions_are_read_from_the_data_and_a_declared_one_wins() -> None:
    obs = _observe(np.random.default_rng(0), 30)
    model = learned().fit(obs)
    assert model.directions["maxlen"] == 1 and model.directions["width"] == 1
    assert model.directions["chunks"] == -1  # memory shrinks as chunks grows
    assert learned(monotone={"chunks": 1}).fit(obs).directions["chunks"] == 1


def test_the_bound_is_monotone_in_each_param_in_its_direction() -> None:
    model = learned().fit(_observe(np.random.default_rng(1), 30))
    p = {"maxlen": 50_000, "width": 256, "batch": 64, "lr": 1e-3, "opt": "sgd", "chunks": 4}
    base = model.bound(p)["ram"]
    assert model.bound({**p, "maxlen": 150_000})["ram"] > base
    assert model.bound({**p, "width": 1024})["ram"] > base
    assert model.bound({**p, "chunks": 1})["ram"] >= base  # lowering a decreasing param never lowers memory
    assert model.bound({**p, "opt": "adam"})["ram"] >= base
    assert model.bound(p)["threads"] == 5


def test_the_bound_covers_about_its_stated_share_on_new_trials() -> None:
    misses, over, errors = [], [], []
    for seed in range(4):  # the miss rate is a share over studies: one fit may miss more, another less
        rng = np.random.default_rng(seed)
        model = learned(miss_rate=0.1).fit(_observe(rng, 30))
        assert model.ready and model.n == 30
        new = _observe(rng, 150)
        misses += [o.peaks["ram"] > model.bound(o.params)["ram"] for o in new]
        over += [model.bound(o.params)["ram"] / o.peaks["ram"] for o in new]
        errors += [abs(model.center(o.params)["ram"] - o.peaks["ram"]) / o.peaks["ram"] for o in new]
    assert np.mean(misses) <= 0.1
    assert float(np.median(errors)) < 0.05
    assert float(np.median(over)) < 1.2  # the bound is tight: its median within a fifth of the peak


def test_the_model_is_ready_from_the_fourth_trial_a_stopped_one_counting_with_two_run_to_the_end() -> None:
    assert learned().warmup == 4 and learned(miss_rate=0.05).warmup == 4 and learned(warmup=2).warmup == 2
    rng = np.random.default_rng(3)
    obs = [Observation(o.params, o.peaks, number=o.number, start={"ram": 80 * MiB}) for o in _observe(rng, 3)]
    assert not learned().fit(obs).ready
    stopped = [Observation(o.params, o.peaks, True, None, o.number, {"ram": 80 * MiB}) for o in _observe(rng, 5)]
    model = learned().fit(obs[:1] + stopped)  # six increments observed, one to the end
    assert model.n == 1 and not model.ready
    whole = [Observation(o.params, o.peaks, o.censored, number=o.number) for o in obs[:1] + stopped]
    assert learned().fit(whole).ready  # whole processes' peaks: one run to the end (their baseline anchors it)
    model = learned().fit(obs[:2] + stopped[:2])  # four observed, two to the end
    assert model.n == 2 and model.ready
    model = learned().fit(obs + _observe(rng, 1))
    assert model.ready and "width" in model.params() and "lr" not in model.params()


def test_a_censored_trial_raises_the_bound_of_every_assignment_that_dominates_it() -> None:
    rng = np.random.default_rng(4)
    obs = _observe(rng, 12)
    p = {"maxlen": 100_000, "width": 512, "batch": 128, "lr": 1e-3, "opt": "sgd", "chunks": 2}
    stopped = Observation(p, {"ram": 4096 * MiB}, censored=True, number=99)  # killed at 4 GiB: at least that
    model = learned().fit([*obs, stopped])
    assert model.bound({**p, "maxlen": 120_000, "chunks": 1})["ram"] >= 4096 * MiB  # larger everywhere
    assert model.dominated_by({**p, "width": 600}) == 99
    assert model.dominated_by({**p, "maxlen": 50_000}) is None  # smaller in one param: not known
    assert model.floor({**p, "opt": "adam"}) == {}  # another label: not comparable
    # a float (here the learning rate) is no size: a lower one still dominates, unless declared monotone
    assert model.dominated_by({**p, "lr": 1e-4}) == 99
    declared = learned(monotone={"lr": 1}).fit([*obs, stopped])
    assert declared.dominated_by({**p, "lr": 1e-4}) is None and declared.dominated_by({**p, "lr": 1e-2}) == 99
    # a censored peak above the fit pulls the fit up (it needed at least that), one below it does not lower it
    low = Observation(p, {"ram": 10 * MiB}, censored=True, number=98)
    assert learned().fit([*obs, low]).center(p)["ram"] == pytest.approx(learned().fit(obs).center(p)["ram"], rel=0.02)


def test_corrected_mode_learns_the_ratio_to_a_footprint_functions_figures() -> None:
    rng = np.random.default_rng(5)
    obs = []
    for i in range(12):
        pred = float(rng.uniform(200, 700)) * MiB
        peak = (pred + 40 * MiB) * rng.uniform(0.99, 1.01)  # the function misses a constant 40 MiB
        obs.append(Observation({"x": i}, {"ram": peak, "threads": 5}, predicted={"ram": pred, "threads": 5}, number=i))
    model = learned().fit(obs, corrected=True)
    assert model.ready
    figures = {"ram": 500 * MiB, "vram": 0, "threads": 5}
    center, bound = model.center({"x": 0}, figures), model.bound({"x": 0}, figures)
    assert 535 * MiB <= center["ram"] <= 545 * MiB and center["threads"] == bound["threads"] == 5
    assert center["ram"] < bound["ram"] <= 600 * MiB


def test_bad_settings_and_params_raise_naming_what_was_expected() -> None:
    with pytest.raises(EstimateError, match=r"miss_rate must be a share in \(0, 0.5\], but got 0.9"):
        learned(miss_rate=0.9)
    with pytest.raises(EstimateError, match=r"warmup must be an int >= 2 .* but got 1"):
        learned(warmup=1)
    with pytest.raises(EstimateError, match=r"monotone\['width'\] must be \+1 .* but got 2"):
        learned(monotone={"width": 2})
    with pytest.raises(EstimateError, match="categorical must be a list of param names"):
        learned(categorical="opt")
    model = learned().fit(_observe(np.random.default_rng(6), 10))
    p = {"maxlen": 1000, "width": 64, "batch": 32, "lr": 1e-3, "opt": "sgd", "chunks": 1}
    with pytest.raises(EstimateError, match=r"param 'width' must be a number .* but got 'wide'"):
        model.bound({**p, "width": "wide"})
    spans = learned().fit([Observation({"n": n}, {"ram": 100 * MiB + n * MiB}) for n in (1, 10, 40, 100)])
    with pytest.raises(EstimateError, match=r"param 'n' must be positive .* but got -1"):
        spans.bound({"n": -1})
    # a label no trial ran is priced as the costliest label seen
    assert model.bound({**p, "opt": "rmsprop"})["ram"] >= model.bound(p)["ram"]


def test_a_large_constant_baseline_leaves_trials_just_above_it_under_a_soft_line_close_to_it() -> None:
    # TensorFlow-like: ~800 MiB whatever the params, a small part that grows with them, a soft line just
    # above the baseline. A factor on the whole fit (at least 1/0.95: 842 MiB at 800) would put every trial
    # over the line and, rejected, none would be observed to correct it; the residual bound admits them.
    rng = np.random.default_rng(0)
    line = 850 * MiB

    def peak(n: int) -> float:
        return 800 * MiB + n * 2 * MiB + rng.uniform(-3, 3) * MiB

    model = learned(miss_rate=0.2).fit([Observation({"n": n}, {"ram": peak(n)}) for n in (1, 3, 6, 10, 14)])
    assert model.ready and model.quantile("ram")[2] > 790 * MiB  # the base: the constant baseline
    under = [n for n in range(1, 15) if model.bound({"n": n})["ram"] <= line]
    assert under and min(under) == 1 and max(under) >= 10  # trials whose peak is under the line are admitted
    assert model.bound({"n": 40})["ram"] > line  # and one whose fit is over it is not
    for n in range(1, 15):  # the bound is still over the fit
        assert model.bound({"n": n})["ram"] > model.center({"n": n})["ram"]


def test_one_large_trials_miss_does_not_price_every_small_trial_over_a_large_baseline() -> None:
    # a ratio on the whole fit multiplied TensorFlow's baseline by 1.165 and a plain difference added the
    # 118 MiB miss to every trial: both put the smallest network over the 738 MiB soft line, and the guard
    # rejected 48 of 60 trials; the residual scaled by what varies keeps small trials admitted
    obs = [
        Observation({"maxlen": m, "width": w, "batch_size": b, "lr": lr}, {"ram": peak * MiB}, censored=c, number=i)
        for i, (m, w, b, lr, peak, c) in enumerate(KERAS_TRIALS)
    ]
    model = learned(miss_rate=0.2).fit(obs)
    assert model.ready and model.quantile("ram")[2] > 600 * MiB
    line = 738 * MiB
    small = {"maxlen": 46270, "width": 76, "batch_size": 512, "lr": 5e-4}
    assert model.bound(small)["ram"] < line
    assert model.bound(small)["ram"] >= model.center(small)["ram"]
    # as wide as the trial that ran to the end at 768 MiB, or as one stopped at 834 MiB: still over the line (a
    # width of 1072 was too, by 3.6 MiB, while the solver stopped short of the least-squares answer: 0.3 under now)
    for width in (1492, 2014):
        assert model.bound({**small, "width": width, "maxlen": 3421})["ram"] > line


def _torch(rows=TORCH_MLP_TRIALS) -> list[Observation]:
    return [
        Observation({"width": w, "depth": d, "batch_size": b, "lr": lr}, {"ram": peak * MiB}, number=i)
        for i, (w, d, b, lr, peak) in enumerate(rows)
    ]


def _held_out(obs: list[Observation], miss_rate: float) -> list[tuple[bool, float]]:
    """Each trial from the fifth on predicted by the model of the trials before it: (missed, bound / peak)."""
    out = []
    for k in range(4, len(obs)):
        model = learned(miss_rate=miss_rate).fit(obs[:k])
        assert model.ready
        bound, peak = model.bound(obs[k].params)["ram"], obs[k].peaks["ram"]
        out.append((peak > bound, bound / peak))
    return out


@pytest.mark.parametrize("miss_rate", [0.2, 0.1])
def test_the_bound_meets_its_stated_miss_rate_on_real_trials_held_out(miss_rate: float) -> None:
    # real peaks (torch MLPs in fresh processes): each trial predicted before it ran, by the model of the
    # trials before it, from the fifth on, in two orders; the old stack had no bound before the tenth
    # trial at 10% and, with its least factor of 1/0.95, a median bound 6-7% over the peak
    rng = np.random.default_rng(0)
    obs = _torch()
    results = []
    for _ in range(2):
        results += _held_out([obs[i] for i in rng.permutation(len(obs))], miss_rate)
    misses = np.mean([m for m, _ in results])
    # binomial spread of ~70 held-out trials: two standard deviations over the stated rate at most
    assert misses <= miss_rate + 2 * np.sqrt(miss_rate * (1 - miss_rate) / len(results)), misses
    assert float(np.median([r for _, r in results])) < 1.06  # and tight: its median within 6% of the peak


def test_the_bound_tightens_as_trials_are_added() -> None:
    # the bound's width over the fit, on the same held-out trials, as the model learns from 4, 8, then 32
    # trials, averaged over six orders of the real trials
    obs, rng = _torch(), np.random.default_rng(0)
    widths: dict[int, list[float]] = {4: [], 8: [], 32: []}
    for _ in range(6):
        order = [obs[i] for i in rng.permutation(len(obs))]
        for n, out in widths.items():
            model = learned(miss_rate=0.1).fit(order[:n])
            out.append(
                np.mean(
                    [
                        (model.bound(o.params)["ram"] - model.center(o.params)["ram"]) / o.peaks["ram"]
                        for o in order[32:]
                    ]
                )
            )
    mean = {n: float(np.mean(v)) for n, v in widths.items()}
    assert mean[4] > mean[8] > mean[32] and mean[32] < 0.06, mean


def test_a_learning_rate_like_param_takes_no_memory_without_evidence() -> None:
    assert [
        role(n)
        for n in (
            "learning_rate",
            "lr",
            "gamma",
            "dropout",
            "weight_decay",
            "seed",
            "clip_range",
            "beta1",
            "batch_norm_momentum",
        )
    ] == [Role.NONE] * 9
    assert [
        role(n)
        for n in (
            "batch_size",
            "n_layers",
            "hiddenDim",
            "num_leaves",
            "max_bin",
            "buffer_size",
            "seq_len",
            "n_envs",
            "frame_stack",
        )
    ] == [Role.SIZE] * 9
    for rows in (
        _torch(),
        [
            Observation({"maxlen": m, "width": w, "batch_size": b, "lr": lr}, {"ram": p * MiB}, censored=c, number=i)
            for i, (m, w, b, lr, p, c) in enumerate(KERAS_TRIALS)
        ],
    ):
        for n in (4, 8, 12, len(rows)):
            model = learned().fit(rows[:n])
            assert "lr" not in model.params(), (n, model.params())
            p = dict(rows[-1].params)
            assert model.bound({**p, "lr": 1e-4}) == model.bound({**p, "lr": 1e-2})
    # a param the trials show takes memory, whatever its name, is held from MIN_TURN trials on
    rng = np.random.default_rng(9)
    obs = [
        Observation({"width": int(w), "temperature": float(t)}, {"ram": (300 + w / 4 + 400 * t) * MiB}, number=i)
        for i, (w, t) in enumerate(zip(rng.integers(64, 1024, 24), rng.uniform(0, 1, 24)))
    ]
    assert "temperature" not in learned().fit(obs[:8]).params() and "temperature" in learned().fit(obs).params()


def test_a_trial_whose_own_increment_is_zero_is_fitted_without_a_division_by_zero() -> None:
    # in a shared process a trial that started no thread (or allocated nothing new) has an increment of 0:
    # its relative error once divided by 0 (a RuntimeWarning, and nan errors no comparison could rank)
    rng = np.random.default_rng(5)
    obs = [
        Observation(
            {"width": w, "lr": float(rng.uniform(1e-4, 1e-2))}, {"ram": (20 + w / 8) * MiB, "threads": t}, number=i
        )
        for i, (w, t) in enumerate([(64, 0), (128, 1), (256, 2), (512, 0), (1024, 4), (96, 0)])
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = learned().fit(obs)
    assert (
        model.ready and model.bound({"width": 2048, "lr": 1e-3})["ram"] > model.center({"width": 64, "lr": 1e-3})["ram"]
    )
    assert math.isfinite(model.quantile("threads")[0])


def test_stopped_trials_keep_the_sizes_in_the_fit_when_those_that_ran_to_the_end_added_almost_nothing() -> None:
    # Lightning in process on a 2-core machine (bench_clients): the trials that ran to the end reused what
    # earlier trials had freed in the process (increments 0.13 and 0.20 MiB); four stopped ones reached
    # 48-204 MiB. Weighted by 1 / increment, the two tiny trials outweighed the stopped ones 1500 to 1: the
    # fit held no param, flat at 0.2 MiB, the stopped trials' misses from it put the bound at 147 MiB for every
    # assignment, and the guard rejected every later trial (4 of 5 replayed alone ran under the soft line).
    rows = [  # width, layers, batch_size, increment in MiB, stopped
        (666, 5, 42, 51.87, True),
        (6694, 3, 71, 171.12, True),
        (742, 6, 9, 47.73, True),
        (7274, 5, 28, 203.62, True),
        (61, 4, 11, 0.13, False),
        (574, 3, 16, 0.20, False),
    ]
    obs = [
        Observation({"width": w, "layers": n, "batch_size": b, "lr": 1e-3}, {"ram": mib * MiB}, censored=c, number=i)
        for i, (w, n, b, mib, c) in enumerate(rows)
    ]
    model = learned().fit(obs)
    assert model.ready and set(model.params()) >= {"width", "layers"}
    small, large = (
        {"width": 114, "layers": 1, "batch_size": 42, "lr": 1e-3},
        {"width": 2806, "layers": 3, "batch_size": 21, "lr": 1e-3},
    )
    assert model.bound(small)["ram"] < 10 * MiB < model.bound(large)["ram"]
    assert model.bound({**large, "width": 7274, "layers": 5, "batch_size": 28})["ram"] >= 203.62 * MiB  # the floor


def test_increments_of_zero_fit_without_a_warning() -> None:
    # A trial whose process already held what it needed has an increment of 0: the directions' check divided
    # by it ("RuntimeWarning: divide by zero" on the program's stderr, seen under optuna-integration's tuner).
    rows = [
        Observation({"leaves": 2 + 10 * i, "frac": 0.1 * (i % 9) + 0.1}, {"ram": 0.0 if i % 4 == 0 else 1e6 * i})
        for i in range(24)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = learned().fit(rows)
    assert model.ready and model.bound({"leaves": 100, "frac": 0.5})["ram"] > 0


def test_a_small_increment_is_measured_against_the_noise_of_the_process_it_was_read_in() -> None:
    # A grid of 1-48 MiB increments read in an 84 MiB process (memprune run on a GridSampler study): scaled by
    # the increments' own base (about 1 MiB), a 0.3 MiB spread counted as 20 noises and the bound at 32 rows
    # was 929 MiB for a 32 MiB fit. A reading's noise is a share of what the process holds.
    start = {"ram": 84 * MiB}
    rows = [Observation({"rows": r}, {"ram": (r + 0.3 * (r % 3)) * MiB}, start=start) for r in (48, 16, 1, 2)]
    model = learned().fit(rows)
    center, bound = model.center({"rows": 32})["ram"], model.bound({"rows": 32})["ram"]
    assert 30 * MiB < center < bound < 1.5 * center, (center / MiB, bound / MiB)
    alone = learned().fit([Observation(o.params, o.peaks) for o in rows])  # whole-process peaks of ~2-48 MiB
    assert alone.bound({"rows": 32})["ram"] > bound


def test_a_trial_run_to_the_end_caps_the_bound_of_every_assignment_it_covers() -> None:
    # A grid of widths 50 and 90 and three learning rates (memprune run on a GridSampler study): the width 90
    # seen once, with lr 0.001; at lr 0.1 the bound was 531 MiB for a 91 MiB fit (the leave-one-out fit
    # without that trial knew nothing of the width). Memory is monotone: it needs no more than that trial took.
    start = {"ram": 84 * MiB}
    seen = [({"n": 50, "lr": 0.1}, 50.3), ({"n": 90, "lr": 0.001}, 91.3), ({"n": 50, "lr": 0.001}, 50.5)]
    rows = [Observation(p, {"ram": v * MiB}, start=start) for p, v in seen + [({"n": 50, "lr": 0.01}, 50.2)]]
    model = learned().fit(rows)
    assert model.params() == ["n"]
    assert 91.3 * MiB < model.bound({"n": 90, "lr": 0.1})["ram"] < 95 * MiB  # the peak and a reading's noise
    assert model.bound({"n": 70, "lr": 0.1})["ram"] < 95 * MiB  # covered by the width 90 too
    assert model.bound({"n": 130, "lr": 0.1})["ram"] > 200 * MiB  # beyond every trial: the fit's bound, wide
    stopped = learned().fit([*rows[:1], Observation({"n": 90, "lr": 0.001}, {"ram": 91.3 * MiB}, censored=True)])
    assert stopped.ceiling({"n": 90, "lr": 0.1}).get("ram", 0) < 91.3 * MiB  # a stopped trial caps nothing


def test_a_trial_run_to_the_end_caps_by_the_names_that_grow() -> None:
    # GPT-2s in a process of 420 MiB of imports (bench_clients, hf_gpt2, process per trial, a 620 MiB limit):
    # seven stopped at the limit, two ran to the end at 549 and 581 MiB; the fit held no param and the bound
    # was 654 MiB for every assignment (the fit now holds the width and layers). A width of 64, 3 layers and
    # batch 37 takes no more than the 64, 7 layers and batch 89 that ran to the end.
    stopped = [(192, 6, 96), (512, 5, 25), (448, 6, 94), (1024, 4, 34), (640, 8, 10), (128, 6, 110), (576, 4, 68)]
    rows = [Observation(_gpt2(*p), {"ram": 620 * MiB}, censored=True) for p in stopped]
    rows += [Observation(_gpt2(64, 7, 89), {"ram": 549 * MiB}), Observation(_gpt2(192, 2, 114), {"ram": 581 * MiB})]
    model = learned().fit(rows)
    small = _gpt2(64, 3, 37)
    assert 549 * MiB < model.ceiling(small)["ram"] < 549 * 1.03 * MiB  # the trial that covers it, and the noise
    assert model.bound({**small, "n_embd": 128})["ram"] > 620 * MiB  # covered by no trial run to the end
    assert 549 * MiB < model.bound(small)["ram"] < 549 * 1.03 * MiB  # the peak and a reading's noise
    assert model.ceiling({**small, "min_child_samples": 3}) == {}  # "min": the name says not which way


def _gpt2(width: int, layers: int, batch: int) -> dict[str, int | float]:
    return {
        "n_embd": width,
        "n_layer": layers,
        "per_device_train_batch_size": batch,
        "learning_rate": 3e-4,
        "min_child_samples": 5,
    }


def test_whole_processes_are_predicted_after_one_trial_run_to_the_end_increments_after_two() -> None:
    # GPT-2s with n_jobs=2 (bench_clients): one ran to the end, three were stopped at the 620 MiB limit; with
    # two needed, the warm-up lasted to trial 11 and four more were stopped there, each predicted over the line
    stopped = [(320, 8, 33), (576, 6, 35), (448, 6, 94)]
    rows = [Observation(_gpt2(*p), {"ram": 620 * MiB}, censored=True) for p in stopped]
    rows.append(Observation(_gpt2(64, 2, 12), {"ram": 493 * MiB}))
    whole = learned().fit(rows)
    assert whole.ready and whole.min_done == 1
    assert whole.bound(_gpt2(512, 5, 43))["ram"] > 558 * MiB  # stopped at 620 MiB in that run
    shared = [Observation(o.params, o.peaks, o.censored, start={"ram": 400 * MiB}) for o in rows]
    assert not learned().fit(shared).ready and learned().fit(shared).min_done == 2
