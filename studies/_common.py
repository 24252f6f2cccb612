"""Shared parts of the studies from the field: command line, the guarded study, per-trial lines and the summary.

Knows Optuna and the guard's public API; knows nothing of what a study trains (each study brings its search
space, objective, footprint and budget).
"""

from __future__ import annotations

import argparse
import functools
import gc
import math
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402
from optuna.distributions import (  # noqa: E402
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

import optuna_memprune as omp  # noqa: E402
from optuna_memprune.guard import Decision, read_record  # noqa: E402

#: What importing a study script adds to its training stack (a worker process that re-imports the script,
#: as multiprocessing's spawn and forkserver do, holds these too).
SCRIPT_IMPORTS = ("optuna", "optuna_memprune.guard")
#: What the study's own process imports besides its training stack: the script's imports and Optuna's RDB
#: storage as creating a SQLite study loads it (SQLAlchemy's ORM and SQLite dialect, Alembic's migration
#: machinery: about 15 MB here). The calibration measures processes importing these.
STUDY_IMPORTS = SCRIPT_IMPORTS + ("optuna.storages._rdb.storage", "sqlalchemy.dialects.sqlite", "alembic.command",
                                  "alembic.migration", "alembic.script")


def arguments(doc: str, *, trials: int, smoke_trials: int) -> argparse.Namespace:
    """The common command line: ``--smoke``, ``--trials``, ``--storage``, ``--seed``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny runs (seconds per trial) for the test suite")
    parser.add_argument("--trials", type=int, default=None,
                        help=f"number of trials (default {trials}, {smoke_trials} with --smoke)")
    parser.add_argument("--storage", default=None, help="Optuna storage URL (default sqlite:///studies/<name>.db)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the TPE sampler and of the training")
    args = parser.parse_args()
    if args.trials is None:
        args.trials = smoke_trials if args.smoke else trials
    if args.trials < 1:
        parser.error(f"--trials must be at least 1, but got {args.trials}")
    return args


def suggest(trial: optuna.Trial, space: Mapping[str, BaseDistribution]) -> dict[str, Any]:
    """Suggest every param of ``space`` (the one definition the guard's ``search_space=`` gets too)."""
    out = {}
    for name, dist in space.items():
        if isinstance(dist, CategoricalDistribution):
            out[name] = trial.suggest_categorical(name, dist.choices)
        elif isinstance(dist, IntDistribution):
            out[name] = trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
        elif isinstance(dist, FloatDistribution):
            out[name] = trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
        else:
            raise TypeError(f"param {name!r}: unsupported distribution {type(dist).__name__}")
    return out


def released(train: Callable[[optuna.Trial], float]) -> Callable[[optuna.Trial], float]:
    """``train`` as an objective that frees what the trial allocated before it ends.

    Trials run one after another in this process, so a trial's leftovers count in the next trial's peak.
    SB3 models live in reference cycles, and a pruning exception's traceback holds the training's frames
    (and the model with them): the traceback is dropped (the exception itself, maybe the guard's stop,
    goes on unchanged) and the cycles collected before the guard's record and heap trim.
    """

    @functools.wraps(train)
    def objective(trial: optuna.Trial) -> float:
        try:
            return train(trial)
        except optuna.TrialPruned as exc:
            exc.__traceback__ = None
            pruned = exc
        finally:
            gc.collect()
        raise pruned

    return objective


class RewardRate:
    """An SB3 ``learn(callback=...)`` callable (SB3 takes any ``f(locals, globals) -> bool``): sums the
    rewards of every env step, reports the reward per 1000 steps to the trial every ``every`` steps and
    prunes when the (guarded) pruner says so. ``on_step(model)``, if given, runs at every step."""

    def __init__(self, trial: optuna.Trial, every: int, on_step: Callable[[Any], None] | None = None) -> None:
        self.trial, self.every, self.on_step = trial, every, on_step
        self.reward, self.steps, self._reported = 0.0, 0, 0

    @property
    def value(self) -> float:
        return 1000.0 * self.reward / max(1, self.steps)

    def __call__(self, local: dict[str, Any], _globals: dict[str, Any]) -> bool:
        model = local["self"]
        self.reward += float(sum(local["rewards"]))
        self.steps = int(model.num_timesteps)
        if self.on_step is not None:
            self.on_step(model)
        if self.steps - self._reported >= self.every:
            self._reported = self.steps
            self.trial.report(self.value, self.steps)
            if self.trial.should_prune():
                raise optuna.TrialPruned()
        return True


#: The guard's monitor thread: it lives in the trial's process while the trial runs.
MONITOR_THREAD = omp.Footprint.of(threads=1, name="memprune monitor thread", kind=omp.Kind.THREADS)


def study_extras(stack: Sequence[str], *, torch_threads: int | None) -> omp.Footprint:
    """What a study's own process adds to a training stack's calibrated baseline.

    ``STUDY_IMPORTS`` (both stacks measured by the calibration, the difference taken) and the guard's
    monitor thread, which lives in the trial's process while the trial runs.
    """
    from optuna_memprune.estimate import process

    mods = tuple(stack)
    full = process(mods + STUDY_IMPORTS, torch_threads=torch_threads)
    bare = process(mods, torch_threads=torch_threads)
    return (omp.Footprint.of(ram=max(0, full.ram - bare.ram), threads=max(0, full.threads - bare.threads),
                             name="study imports (optuna, its RDB storage, the guard)", kind=omp.Kind.BASELINE)
            + MONITOR_THREAD)


@dataclass
class Study:
    """One study from the field: what the common runner needs to build, run and summarise it.

    ``footprint`` is what the guard decides on; ``as_ran`` (optional, given the finished trial) predicts the
    run the trial really did when that differs from what the guard budgets (a shortened run of a training
    meant to go on for hours): prediction errors are computed against it. ``show`` names the params
    printed per trial.
    """

    name: str
    space: dict[str, BaseDistribution]
    objective: Callable[[optuna.Trial], float]
    footprint: Callable[[dict[str, Any]], omp.Footprint]
    budget: omp.Budget
    show: Sequence[str]
    direction: str = "maximize"
    policy: str = "clamp"
    clamp: Sequence[str] | None = None
    enqueue: Sequence[dict[str, Any]] = ()
    as_ran: Callable[[optuna.trial.FrozenTrial], omp.Footprint] | None = None
    n_startup_trials: int = 6
    median_pruner: bool = True   # False: only the guard's soft line prunes
    headline: str = ""


def run(study_def: Study, args: argparse.Namespace) -> optuna.Study:
    """Create (or recreate) the study in the storage, run it in this process under the guard, print the
    per-trial lines and the summary; returns the Optuna study."""
    start = time.perf_counter()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    s = study_def
    guard = omp.MemoryGuard(s.footprint, s.budget, on_infeasible=s.policy,
                            clamp=list(s.clamp) if s.clamp is not None else None, search_space=s.space)
    storage = args.storage or f"sqlite:///{ROOT / 'studies' / (s.name + '.db')}"
    try:
        optuna.delete_study(study_name=s.name, storage=storage)
    except KeyError:
        pass
    study = optuna.create_study(
        study_name=s.name, storage=storage, direction=s.direction,
        sampler=guard.wrap_sampler(optuna.samplers.TPESampler(seed=args.seed, n_startup_trials=s.n_startup_trials)),
        pruner=guard.wrap_pruner(optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=1)
                                 if s.median_pruner else None),
    )
    for params in s.enqueue:
        study.enqueue_trial(params, skip_if_exists=True)
    mode = "smoke" if args.smoke else "full"
    print(f"{s.name} ({mode}): {s.budget}, policy {s.policy}, {args.trials} trials; {s.headline}", flush=True)
    print("pred/peak: predicted and recorded peak RSS of the process tree; err = (peak - pred) / peak", flush=True)
    study.optimize(guard.wrap_objective(s.objective), n_trials=args.trials,
                   callbacks=[lambda _study, t: print(line(t, s), flush=True)])
    print(summary(study, s, wall_s=time.perf_counter() - start, storage=storage), flush=True)
    return study


# -- figures per trial ------------------------------------------------------------------------------

def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}M" if value < 2**30 else f"{value / 2**30:.2f}G"


def predicted_as_ran(trial: optuna.trial.FrozenTrial, s: Study) -> tuple[int | None, int | None]:
    """(ram, threads) predicted for the run the trial really did: ``as_ran`` if the study has one, else
    the guard's prediction on the record."""
    record = read_record(trial.user_attrs)
    if s.as_ran is not None and record is not None and record.decision is not Decision.REJECTED:
        fp = s.as_ran(trial)
        return fp.ram, fp.threads
    return (None, None) if record is None else (record.pred_ram, record.pred_threads)


def ram_error(trial: optuna.trial.FrozenTrial, s: Study) -> float | None:
    """(peak - pred) / peak of a COMPLETE trial's RSS (positive: under-predicted); None if unknown."""
    record = read_record(trial.user_attrs)
    if trial.state is not optuna.trial.TrialState.COMPLETE or record is None or not record.peak_ram:
        return None
    pred, _ = predicted_as_ran(trial, s)
    return None if pred is None else (record.peak_ram - pred) / record.peak_ram


def line(trial: optuna.trial.FrozenTrial, s: Study) -> str:
    """One line per finished trial: state, decision, the shown params, predictions, peaks, value."""
    record = read_record(trial.user_attrs)
    decision = record.decision.value if record else "-"
    params = " ".join(f"{k}={_short(trial.params.get(k, '-'))}" for k in s.show)
    pred = _mib(record.pred_ram) if record else "-"
    if s.as_ran is not None and record and record.decision is not Decision.REJECTED:
        pred += f" (as run {_mib(predicted_as_ran(trial, s)[0])})"
    err = ram_error(trial, s)
    threads = f"thr {record.pred_threads}/{record.peak_threads if record.peak_threads is not None else '-'}" \
        if record else ""
    if record and record.budget_vram is not None:
        threads = f"vram {_mib(record.pred_vram)}/{_mib(record.peak_vram)} " + threads
    value = f"{trial.value:.3g}" if trial.value is not None else "-"
    moved = " ".join(f"{k}<-{_short(v)}" for k, v in record.clamped_from.items()) if record else ""
    seconds = f"{trial.duration.total_seconds():.0f}s" if trial.duration is not None else "-"
    return (f"#{trial.number:<3} {trial.state.name:8} {decision:11} {seconds:>4} {params}  pred {pred} peak "
            f"{_mib(record.peak_ram) if record else '-'}" + (f" err {err:+.1%}" if err is not None else "")
            + f" {threads} value {value} {moved}").rstrip()


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10_000 and value % 1000 == 0:
        return f"{value / 1000:g}k"
    return str(value)


# -- checks and the summary -------------------------------------------------------------------------

def violations(study: optuna.Study) -> list[str]:
    """Decisions of the guard that the run shows to be wrong (acceptance point 3), in words.

    A trial that ran with a prediction under the soft line (admitted or clamped at launch) and whose
    recorded peak exceeds the budget of some resource; a rejected trial with no predicted resource over
    the soft line. Unchecked trials (no prediction before launch) are not judged.
    """
    out = []
    for t in study.trials:
        r = read_record(t.user_attrs)
        if r is None:
            out.append(f"#{t.number}: no memprune record")
            continue
        budgets = {k: getattr(r, f"budget_{k}") for k in ("ram", "vram", "threads")}
        over_soft = [k for k, b in budgets.items()
                     if b is not None and getattr(r, f"pred_{k}") is not None
                     and getattr(r, f"pred_{k}") > int(r.soft * b)]
        if r.decision is Decision.REJECTED:
            if not over_soft:
                out.append(f"#{t.number}: rejected, but no predicted resource is over {r.soft:.0%} of its budget")
            continue
        if r.decision is Decision.UNCHECKED or over_soft:
            continue
        for k, b in budgets.items():
            peak = getattr(r, f"peak_{k}")
            if b is not None and peak is not None and peak > b:
                out.append(f"#{t.number}: {r.decision.value} at launch (predicted under the soft line), "
                           f"but its peak {k} {peak} exceeded the budget {b}")
    return out


def launch_decision(trial: optuna.trial.FrozenTrial) -> str:
    """What the guard decided before the trial ran: admitted, clamped, rejected or unchecked."""
    r = read_record(trial.user_attrs)
    if r is None:
        return "none"
    if r.decision in (Decision.REJECTED, Decision.UNCHECKED):
        return r.decision.value
    if r.clamped_from:
        return "clamped"
    if r.decision in (Decision.STOPPED, Decision.SOFT_PRUNED) and r.pred_ram is None:
        return "unchecked"
    return "admitted"


def summary(study: optuna.Study, s: Study, *, wall_s: float, storage: str) -> str:
    """Counts by launch decision and by how trials ended, prediction errors of COMPLETE trials, the
    acceptance check, and one final ``STUDY ...`` line."""
    trials = study.trials
    launch = Counter(launch_decision(t) for t in trials)
    ends = Counter(f"{t.state.name} {read_record(t.user_attrs).decision.value}"
                   for t in trials if read_record(t.user_attrs) is not None)
    errors = [e for t in trials if (e := ram_error(t, s)) is not None]
    thread_gaps = []
    for t in trials:
        r = read_record(t.user_attrs)
        if t.state is optuna.trial.TrialState.COMPLETE and r is not None and r.peak_threads is not None:
            _, pred_threads = predicted_as_ran(t, s)
            if pred_threads is not None:
                thread_gaps.append(r.peak_threads - pred_threads)
    bad = violations(study)
    stopped = sum(1 for t in trials if (r := read_record(t.user_attrs)) and r.decision is Decision.STOPPED)
    soft = sum(1 for t in trials if (r := read_record(t.user_attrs)) and r.decision is Decision.SOFT_PRUNED)
    kinds = ("admitted", "clamped", "rejected", "unchecked")
    lines = ["", "at launch: " + ", ".join(f"{k} {launch[k]}" for k in kinds if launch[k]),
             "at the end: " + ", ".join(f"{k} {v}" for k, v in sorted(ends.items()))]
    if errors:
        lines.append(f"RSS prediction error of the {len(errors)} COMPLETE trials: median "
                     f"{statistics.median(errors):+.1%}, min {min(errors):+.1%}, max {max(errors):+.1%} "
                     "(positive = under-predicted)")
    if thread_gaps:
        lines.append(f"threads measured - predicted: {sorted(Counter(thread_gaps).items())} (gap, trials)")
    example = next((t for t in trials if launch_decision(t) == "rejected"), None)
    if example is not None:
        lines.append(f"why #{example.number} was rejected: {read_record(example.user_attrs).reason}")
    example = next((t for t in trials if launch_decision(t) == "clamped"), None)
    if example is not None:
        lines.append(f"why #{example.number} was clamped: {read_record(example.user_attrs).reason}")
    lines += [f"decisions the run shows wrong: {len(bad)}"] + [f"  {b}" for b in bad]
    lines.append(f"stored in {storage.replace(str(ROOT) + '/', '')}")
    med = f"{statistics.median(errors):+.1%}" if errors else "n/a"
    worst = f"{max(errors, key=abs):+.1%}" if errors else "n/a"
    lines.append(
        f"STUDY {s.name} trials={len(trials)} admitted={launch['admitted']} clamped={launch['clamped']} "
        f"rejected={launch['rejected']} unchecked={launch['unchecked']} stopped={stopped} soft_pruned={soft} "
        f"complete={sum(1 for t in trials if t.state is optuna.trial.TrialState.COMPLETE)} "
        f"ram_err_median={med} ram_err_worst={worst} wrong={len(bad)} wall_s={wall_s:.0f}"
    )
    return "\n".join(lines)


def finite_or(value: float, default: float) -> float:
    """``value`` if finite, else ``default`` (an objective must not return NaN: the trial would FAIL)."""
    return value if math.isfinite(value) else default
