"""Learned footprints on real studies with no footprint function, guarded against unguarded, same seed.

Three studies (``scripts/_learned_workloads.py``): a Keras (TensorFlow CPU) DQN on CartPole with a
``deque`` replay memory (``maxlen``, width, batch size tuned), LightGBM (rows, ``num_leaves``, ``max_bin``)
and a torch MLP whose widths and batches include sizes that cannot fit. Each runs twice under the same
per-trial RAM budget (about a third of its space exceeds it), with the same TPE seed, in the process-per-
trial runner (``omp.optimize``) with the budget held by a cgroup v1 hard limit (``enforce="cgroup"``):

- guarded: ``MemoryGuard(None, budget, learn=learned(miss_rate=...))``: trials run unchecked through the
  warm-up (4 trials observed), then are admitted, clamped or rejected by the learned upper bound (or run
  unchecked to explore below every observed trial, where the fit is under the line; these count as
  launches after the warm-up);
- unguarded (``--baseline plain``, the default): the study as plain Optuna runs it, the same TPE sampler
  unwrapped, each trial in a process of the same fork server held to the budget by the same cgroup hard
  limit and the runner's rule (killed once its tree's RSS crosses the budget); a trial killed is told
  FAIL, as a plain study records a trial whose process died. TPE leaves FAIL trials out of its model, so
  it proposes the same sizes again (and they count to no startup trial): the failure this project exists
  for;
- ``--baseline monitor``: the runner with a guard whose footprint predicts nothing (``MonitorOnly``):
  every trial launches, the kernel's limit (or the watchdog) ends the ones over the budget, and they are
  told PRUNED with the ``memprune_*`` constraint, so TPE learns to avoid them: a baseline that already
  has this project's bookkeeping, kept to compare.

Measured per study: launches after the warm-up that ended over the budget (stopped, out of memory), trials
lost (left RUNNING, or a study that raised), wasted compute (seconds of trials that ended over the budget),
the learned prediction's median error ``(peak - pred) / peak`` over the guarded trials that ran to the
end after the warm-up, and clamps that moved a param named as a rate, a coefficient or a seed (which takes
no memory: ``estimate.learn.role``). Last line::

    LEARNED studies=<k> over_budget_launches_after_warmup=<x>% lost=<n> wasted_compute_guarded=<s>
    wasted_compute_unguarded=<s> learned_median_err=<x>% memoryless_clamps=<n>

Targets: over-budget launches after warm-up <= 5%, nothing lost, guarded wasted compute <= a quarter of
unguarded. 60 trials per study by default: the warm-up's breaches are a fixed cost of the guarded study
(its first trials run unchecked, the same first draws the plain study makes), while the plain study keeps
proposing sizes over the budget, so the ratio depends on the study's length; a shorter study is closer.
A study whose package is missing is skipped with the reason (``studies=`` counts the ones run).

Packages (not in the project's extras): a venv of your own, made from the project venv's python, that also
sees the project venv's packages (torch, optuna, gymnasium) through a ``.pth`` file, since
``--system-site-packages`` reaches only the base interpreter's::

    $PROJECT_VENV/bin/python -m venv --system-site-packages $BENCH_VENV
    $BENCH_VENV/bin/pip install tensorflow-cpu==2.21.0 lightgbm==4.7.0
    $PROJECT_VENV/bin/python -c "import site; print(site.getsitepackages()[0])" \
        > $BENCH_VENV/lib/python3.11/site-packages/project-venv.pth
    $BENCH_VENV/bin/python scripts/bench_learned.py

Run: ``python scripts/bench_learned.py [--smoke] [--trials N] [--studies a,b] [--seed S] [--miss-rate R]
[--baseline plain|monitor]`` (``--smoke``: the torch study only, 8 trials). Needs a cgroup v1 or v2 memory
controller this process may make groups in (root); without one it says so and runs with the watchdog's
polling instead (and the monitor baseline: the plain one needs the group).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import optuna  # noqa: E402

import _learned_workloads as workloads  # noqa: E402
import optuna_memprune as omp  # noqa: E402
from optuna_memprune import cgroups  # noqa: E402
from optuna_memprune.guard._call import MonitorOnly  # noqa: E402
from optuna_memprune.guard._oom import out_of_memory  # noqa: E402
from optuna_memprune.runner._forkserver import fork_server, stop_fork_server  # noqa: E402
from optuna_memprune.monitor import Monitor  # noqa: E402
from optuna_memprune.ledger import HostBudget, Ledger  # noqa: E402
from optuna_memprune.estimate.learn import Role, role  # noqa: E402
from optuna_memprune.records import Decision  # noqa: E402

MiB = 2**20
#: Per-trial RAM budgets: about a third of each space exceeds them, measured on 21 random draws of each space
#: (seed 1, unguarded): keras_dqn 7/21 peaked over 820 MiB (its baseline, TensorFlow loaded, is ~667 MiB),
#: lightgbm 7/21 over 190 MiB, torch_mlp 7 of the first 17 over 600 MiB (all of them at a 2 GiB cap). Over 60
#: trials, seed 0, the plain study (FAIL trials out of TPE's model) then ran 23 keras_dqn, 36 lightgbm and 4
#: torch_mlp trials over the budget: TPE drifts towards the sizes that score best, which for the first two
#: lie at the budget.
BUDGETS = {"keras_dqn": "820MiB", "lightgbm": "190MiB", "torch_mlp": "600MiB"}
NEEDS = {"keras_dqn": ("tensorflow", "gymnasium"), "lightgbm": ("lightgbm",), "torch_mlp": ("torch",)}
OVER = (Decision.STOPPED, Decision.OUT_OF_MEMORY)


def run_one(name: str, guarded: bool, args: argparse.Namespace, where: Path, enforce: str) -> dict:
    budget = omp.Budget(ram=BUDGETS[name])
    space = workloads.SPACES[name]
    if guarded:
        guard = omp.MemoryGuard(None, budget, search_space=space, learn=omp.estimate.learned(miss_rate=args.miss_rate))
    else:
        guard = omp.MemoryGuard(
            MonitorOnly("unguarded baseline: every trial launches, held by the hard limit"), budget, search_space=space
        )
    kind = "guarded" if guarded else "unguarded"
    study = optuna.create_study(
        storage=f"sqlite:///{where / f'{name}-{kind}.db'}",
        study_name=name,
        sampler=guard.wrap_sampler(optuna.samplers.TPESampler(seed=args.seed, n_startup_trials=8)),
        pruner=guard.wrap_pruner(None),
    )
    ledger = Ledger(
        HostBudget(ram="6GiB", headroom=0.0),
        url=f"sqlite:///{where / f'ledger-{name}-{kind}.db'}",
        host=f"bench-{name}-{kind}",
    )
    error = None
    start = time.monotonic()
    try:
        omp.optimize(
            study,
            workloads.OBJECTIVES[name],
            guard=guard,
            n_trials=args.trials,
            host=ledger,
            enforce=enforce,
            show_progress_bar=False,
        )
    except Exception as exc:  # noqa: BLE001 - a study that raised counts as lost
        error = f"{type(exc).__name__}: {exc}"
    wall = time.monotonic() - start
    return summarize(study, budget, guarded, error, wall)


def run_plain(name: str, args: argparse.Namespace, where: Path, place: "cgroups.Place") -> dict:
    """The unguarded study as plain Optuna runs it: the TPE sampler unwrapped; each trial's params sampled
    here (``study.ask`` on the space), its objective run in a process of the runner's fork server (the same
    preloads, so the same start) in a cgroup whose hard limit is the budget, and watched as the runner
    watches a trial: killed once its tree's RSS crosses the budget (the cgroup charges no page another
    group brought into the page cache, such as a library an earlier trial loaded, so the RSS may pass the
    budget where the charge does not); a trial killed, or that raised, is told FAIL, as a plain study
    records a trial whose process died, and TPE leaves FAIL trials out of its model (it proposes the same
    sizes again, and they count to no startup trial)."""
    budget = omp.Budget(ram=BUDGETS[name])
    study = optuna.create_study(
        storage=f"sqlite:///{where / f'{name}-plain.db'}",
        study_name=name,
        sampler=optuna.samplers.TPESampler(seed=args.seed, n_startup_trials=8),
    )
    ctx = fork_server(workloads.OBJECTIVES[name])
    start, error = time.monotonic(), None
    try:
        for _ in range(args.trials):
            trial = study.ask(workloads.SPACES[name])
            group, why = cgroups.TrialGroup.create(place, trial.number)
            if group is None:
                raise RuntimeError(why)
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=workloads.plain_trial,
                args=(send, name, trial.params, trial.number, group.join_spec(budget.ram, None)),
            )
            proc.start()
            send.close()
            crossed: list[int] = []

            def watch(reading, group=group, crossed=crossed):  # the runner's rule: the tree's RSS at the budget
                if reading.rss > budget.ram and not crossed:
                    crossed.append(reading.rss)
                    group.kill()

            monitor = Monitor(proc.pid, interval=0.1, on_reading=watch).start()
            try:
                result = recv.recv()
            except EOFError:  # killed at the hard limit, or by the watchdog
                result = None
            proc.join()
            monitor.stop()
            over = (
                bool(crossed)
                or group.oom_kills() > 0
                or (result is not None and result[0] != "complete" and out_of_memory(None, result[1]) is not None)
            )
            group.kill()
            group.remove()
            trial.set_user_attr("bench:over_budget", bool(over))
            if result is not None and result[0] == "complete":
                study.tell(trial, result[1])
            else:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
    except Exception as exc:  # noqa: BLE001 - a study that raised counts as lost
        error = f"{type(exc).__name__}: {exc}"
    finally:
        stop_fork_server()
    wall = time.monotonic() - start
    trials = study.trials
    over = [t for t in trials if t.user_attrs.get("bench:over_budget")]
    return {
        "trials": len(trials),
        "lost": sum(not t.state.is_finished() for t in trials) + (error is not None),
        "error": error,
        "stopped": len(over),
        "wall": wall,
        "wasted": sum(
            (t.datetime_complete - t.datetime_start).total_seconds()
            for t in over
            if t.datetime_start and t.datetime_complete
        ),
    }


def summarize(study: optuna.Study, budget: omp.Budget, guarded: bool, error: str | None, wall: float) -> dict:
    trials = study.trials
    lost = sum(not t.state.is_finished() for t in trials) + (error is not None)
    wasted, wasted_warm, launched_after, over_after, errors, stopped = 0.0, 0.0, 0, 0, [], 0
    memoryless = 0
    for t in trials:
        record = omp.read_record(t.user_attrs)
        if record is None:
            continue
        memoryless += any(role(n) is Role.NONE for n in record.clamped_from or {})
        over = record.decision in OVER
        stopped += over
        if over and t.datetime_start and t.datetime_complete:
            wasted += (t.datetime_complete - t.datetime_start).total_seconds()
            if record.learned.get("phase") == "warm-up":
                wasted_warm += (t.datetime_complete - t.datetime_start).total_seconds()
        # after the warm-up: launched on the bound, or unchecked to explore below every observed trial
        if guarded and record.learned.get("phase") in ("bound", "explore") and record.decision is not Decision.REJECTED:
            launched_after += 1
            over_after += over
            if t.state == optuna.trial.TrialState.COMPLETE and record.pred_ram and record.peak_ram:
                errors.append((record.peak_ram - record.pred_ram) / record.peak_ram)
    decisions: dict[str, int] = {}
    for t in trials:
        record = omp.read_record(t.user_attrs)
        key = record.decision.value if record else "no record"
        decisions[key] = decisions.get(key, 0) + 1
    return {
        "trials": len(trials),
        "lost": lost,
        "error": error,
        "wasted": wasted,
        "wasted_warm": wasted_warm,
        "stopped": stopped,
        "launched_after": launched_after,
        "over_after": over_after,
        "errors": errors,
        "wall": wall,
        "decisions": decisions,
        "memoryless": memoryless,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the torch study only, 8 trials")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--studies", default=None, help="comma-separated: keras_dqn,lightgbm,torch_mlp")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--miss-rate", type=float, default=0.2)
    parser.add_argument(
        "--baseline",
        choices=("plain", "monitor"),
        default="plain",
        help="the unguarded study: plain Optuna (FAIL, sampler unwrapped; the default) or the "
        "runner with a guard that predicts nothing (PRUNED, constraints told)",
    )
    args = parser.parse_args()
    args.trials = args.trials or (8 if args.smoke else 60)
    # torch is not loaded here: the runner's fork server, started at the first study, would preload it, and a
    # trial forked from a process holding torch starts ~180 MiB in (LightGBM's crossed a 171 MiB soft line at
    # start); each torch trial imports it itself
    order = ["lightgbm", "keras_dqn", "torch_mlp"]
    names = sorted(
        args.studies.split(",") if args.studies else (["torch_mlp"] if args.smoke else order),
        key=lambda n: order.index(n) if n in order else -1,
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    place, why = cgroups.place()
    enforce = "cgroup" if place is not None and place.memory else "polling"
    if enforce != "cgroup" and args.baseline == "plain":
        print(f"the plain baseline needs a cgroup memory controller ({why}): the monitor baseline instead")
        args.baseline = "monitor"
    print(
        f"hard limit: {'cgroup v%d memory group per trial' % place.version if enforce == 'cgroup' else why}; "
        f"{args.trials} trials per study, seed {args.seed}, miss rate {args.miss_rate:g} "
        f"(warm-up {omp.estimate.learned(miss_rate=args.miss_rate).warmup}), {args.baseline} baseline"
    )
    totals = {
        "studies": 0,
        "lost": 0,
        "wasted_g": 0.0,
        "wasted_u": 0.0,
        "launched": 0,
        "over": 0,
        "errors": [],
        "memoryless": 0,
    }
    with tempfile.TemporaryDirectory(prefix="bench-learned-") as tmp:
        for name in names:
            missing = [m for m in NEEDS[name] if importlib.util.find_spec(m) is None]
            if missing:
                print(f"{name}: skipped, {', '.join(missing)} not installed (see this script's docstring)")
                continue
            g = run_one(name, True, args, Path(tmp), enforce)
            u = (
                run_plain(name, args, Path(tmp), place)
                if args.baseline == "plain"
                else run_one(name, False, args, Path(tmp), enforce)
            )
            totals["studies"] += 1
            totals["lost"] += g["lost"] + u["lost"]
            totals["wasted_g"] += g["wasted"]
            totals["wasted_u"] += u["wasted"]
            totals["launched"] += g["launched_after"]
            totals["over"] += g["over_after"]
            totals["errors"] += g["errors"]
            totals["memoryless"] += g["memoryless"]
            med = f"{100 * statistics.median(g['errors']):+.1f}%" if g["errors"] else "-"
            print(
                f"{name} (budget {BUDGETS[name]}): unguarded {u['stopped']}/{u['trials']} over budget, "
                f"wasted {u['wasted']:.1f} s, {u['wall']:.0f} s; guarded {g['decisions']}, over budget after "
                f"warm-up {g['over_after']}/{g['launched_after']} launches, wasted {g['wasted']:.1f} s "
                f"({g['wasted_warm']:.1f} s in the warm-up), median "
                f"error {med}, {g['wall']:.0f} s"
                + "".join(f"; {k} raised {r['error']}" for k, r in (("guarded", g), ("unguarded", u)) if r["error"])
            )
    rate = 100 * totals["over"] / totals["launched"] if totals["launched"] else 0.0
    err = 100 * statistics.median(totals["errors"]) if totals["errors"] else float("nan")
    print(
        f"LEARNED studies={totals['studies']} over_budget_launches_after_warmup={rate:.1f}% lost={totals['lost']} "
        f"wasted_compute_guarded={totals['wasted_g']:.1f} wasted_compute_unguarded={totals['wasted_u']:.1f} "
        f"learned_median_err={err:+.1f}% memoryless_clamps={totals['memoryless']}"
    )


if __name__ == "__main__":
    main()
