"""rl-zoo3's own hyperparameter search, unchanged, under ``memprune run``; and the same command under a hard
memory limit without it.

``python studies/rlzoo3_run.py [--smoke] [--case NAME] [--ram SIZE] [--trials N] [--timesteps N] [--n-jobs K]
[--dir DIR] [--hard-limit]`` runs ``memprune run --ram SIZE [--clamp-fixed buffer_size] -- python -m
rl_zoo3.train --algo ALGO --env ENV -optimize --n-jobs K ...`` in DIR (a SQLite study there), then reads the
study back and prints one line per trial and a last line::

    RLZOO3RUN case=dqn-cartpole exit=0 report=1 trials=2 records=2 predicted=2 admitted=2 clamped=0
    rejected=0 over_budget=0 rejected_under_line=0 median_error=+1.2% lowered=- seconds=25.1

``exit`` is rl-zoo3's exit status, ``report`` whether it wrote its own report (``report_*.csv``),
``over_budget`` the trials whose peak crossed their budget, ``rejected_under_line`` the rejected or clamped
trials predicted under the soft line (both must be 0), ``median_error`` the median of (peak - predicted) /
peak over the admitted trials that completed. With ``--hard-limit`` it then runs the same rl-zoo3 command
without ``memprune run`` in a cgroup v1/v2 memory group below this process's own, limited to SIZE (root, or a
delegated cgroup), and prints ``HARDLIMIT case=... exit=... oom_kills=... trials=... complete=...
peak=...``. Cases: ``dqn-cartpole`` (``--smoke``: 2 trials of 1,000 steps, 2 jobs, about 30 s on 2 loaded
cores), ``dqn-pong`` (``--clamp-fixed buffer_size``), ``ppo-atari`` (Breakout, the yml's 8 envs and sampled
``n_steps``), ``sac-pendulum``.

Needs the ``rl`` extra and rl-zoo3 2.9 with pandas (``pip install rl-zoo3==2.9.2 pandas``), ale-py for the
Atari cases.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

from optuna_memprune import cgroups, records  # noqa: E402
from optuna_memprune.records import Decision  # noqa: E402
from optuna_memprune.units import format_bytes, parse_bytes  # noqa: E402

#: case -> (algo, env, extra memprune run options, extra rl_zoo3.train options, trials, timesteps)
CASES = {
    "dqn-cartpole": ("dqn", "CartPole-v1", [], [], 4, 2000),
    "dqn-pong": ("dqn", "PongNoFrameskip-v4", ["--clamp-fixed", "buffer_size"], ["--eval-episodes", "1"], 4, 45000),
    "ppo-atari": ("ppo", "BreakoutNoFrameskip-v4", [], ["--eval-episodes", "1"], 4, 4096),
    "sac-pendulum": ("sac", "Pendulum-v1", [], ["--eval-episodes", "2"], 4, 2000),
}


def zoo_command(case: str, trials: int, timesteps: int, n_jobs: int, study: str, storage: str,
                logs: str = "logs") -> list[str]:
    algo, env, _, extra, _, _ = CASES[case]
    return [sys.executable, "-m", "rl_zoo3.train", "--algo", algo, "--env", env, "-optimize", "--n-trials",
            str(trials), "--n-timesteps", str(timesteps), "--n-jobs", str(n_jobs), "--sampler", "random",
            "--pruner", "none", "--seed", "0", "--num-threads", "1", "--no-optim-plots", "--n-evaluations", "1",
            *extra, "-f", logs, "--storage", storage, "--study-name", study]


def guarded(case: str, args: argparse.Namespace, workdir: Path) -> int:
    """Run the case under ``memprune run``; print the trials and the RLZOO3RUN line; 0 if everything holds."""
    storage = f"sqlite:///{workdir / 'zoo.db'}"
    command = [sys.executable, "-m", "optuna_memprune.cli", "run", "--ram", args.ram, *CASES[case][2], "--",
               *zoo_command(case, args.trials, args.timesteps, args.n_jobs, case, storage)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    started = time.monotonic()
    proc = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    (workdir / "stdout.txt").write_text(proc.stdout)
    (workdir / "stderr.txt").write_text(proc.stderr)
    for line in proc.stderr.splitlines():
        if line.startswith("memprune: "):
            print(line)
    report = any((workdir / "logs").glob("*/report_*.csv"))
    try:
        trials = optuna.load_study(study_name=case, storage=storage).get_trials(deepcopy=False)
    except KeyError:
        trials = []
    footprint = _recipe(case, trials, args.timesteps)
    counts = {d: 0 for d in Decision}
    errors, over, under_line, predicted, lowered = [], 0, 0, 0, set()
    for t in trials:
        r = records.read(t.user_attrs)
        fixed = records.read_overrides(t.user_attrs)
        lowered.update(f"{k}:{v[0]}->{v[1]}" for k, v in fixed.items())
        if r is None:
            print(f"  #{t.number} {t.state.name} no record")
            continue
        counts[r.decision] += 1
        predicted += r.pred_ram is not None
        if r.peak_ram is not None and r.budget_ram is not None and r.peak_ram > r.budget_ram:
            over += 1
        if r.decision in (Decision.REJECTED, Decision.CLAMPED) and r.budget_ram:
            # a rejected trial's record predicts its sampled params; a clamped one's the lowered params, so
            # its sampled params are predicted again here with the recipe the guard used
            need = r.pred_ram if r.decision is Decision.REJECTED else footprint({**t.params, **r.clamped_from}).ram
            under_line += need is None or need <= r.soft * r.budget_ram
        error = None
        complete = t.state is optuna.trial.TrialState.COMPLETE
        if r.decision is Decision.ADMITTED and complete and r.peak_ram and r.pred_ram:
            error = (r.peak_ram - r.pred_ram) / r.peak_ram
            errors.append(error)
        print(f"  #{t.number} {t.state.name} {r.decision.value} predicted {format_bytes(r.pred_ram or 0)} peak "
              f"{format_bytes(r.peak_ram or 0)}" + ("" if error is None else f" error {error:+.1%}")
              + (f" {r.reason[:160]}" if r.decision is not Decision.ADMITTED else ""))
    median = f"{statistics.median(errors):+.1%}" if errors else "-"
    print(f"RLZOO3RUN case={case} exit={proc.returncode} report={int(report)} trials={len(trials)} "
          f"records={sum(counts.values())} predicted={predicted} admitted={counts[Decision.ADMITTED]} "
          f"clamped={counts[Decision.CLAMPED]} rejected={counts[Decision.REJECTED]} over_budget={over} "
          f"rejected_under_line={under_line} median_error={median} lowered={','.join(sorted(lowered)) or '-'} "
          f"seconds={seconds:.1f}")
    ok = proc.returncode == 0 and report and trials and sum(counts.values()) == len(trials) and not over
    return 0 if ok and not under_line else 1


def _recipe(case: str, trials: list, timesteps: int) -> "Callable":
    """The rl-zoo3 recipe's footprint of the case's trials, with the fixed values the guard lowered."""
    import importlib

    rlzoo3 = importlib.import_module("optuna_memprune.estimate.recipes.rlzoo3")
    algo, env = CASES[case][:2]
    fixed = {k: v[1] for t in trials for k, v in records.read_overrides(t.user_attrs).items()}
    return rlzoo3.for_command(rlzoo3.with_params(["--algo", algo, "--env", env, "-n", str(timesteps)], fixed))[1]


def hard_limit(case: str, args: argparse.Namespace, workdir: Path) -> None:
    """The same rl-zoo3 command, no memprune, in a memory cgroup limited to ``--ram``: the HARDLIMIT line."""
    where, why = cgroups.place()
    if where is None or not where.memory:
        print(f"HARDLIMIT case={case} skipped: no memory cgroup can be made here ({why or 'no memory controller'})")
        return
    group, why = cgroups.TrialGroup.create(where, 0)
    if group is None:
        print(f"HARDLIMIT case={case} skipped: {why}")
        return
    limit = parse_bytes(args.ram, name="--ram")
    storage = f"sqlite:///{workdir / 'hard.db'}"
    try:
        group.limit(limit)
        started = time.monotonic()
        command = zoo_command(case, args.trials, args.timesteps, args.n_jobs, case, storage, "hard-logs")
        proc = subprocess.run(command, cwd=workdir,
                              capture_output=True, text=True, preexec_fn=lambda: group.add(os.getpid()))
        seconds = time.monotonic() - started
        peak, kills = group.peak(), group.oom_kills()
    finally:
        group.kill()
        group.remove()
    (workdir / "hard-stderr.txt").write_text(proc.stderr)
    try:
        trials = optuna.load_study(study_name=case, storage=storage).get_trials(deepcopy=False)
    except Exception:  # noqa: BLE001 - the study may not exist if the process died early
        trials = []
    states = {s.name: sum(t.state is s for t in trials) for s in optuna.trial.TrialState}
    print(f"HARDLIMIT case={case} limit={format_bytes(limit)} exit={proc.returncode} oom_kills={kills} "
          f"trials={len(trials)} complete={states['COMPLETE']} running={states['RUNNING']} fail={states['FAIL']} "
          f"report={int(any((workdir / 'hard-logs').glob('*/report_*.csv')))} peak={format_bytes(peak or 0)} "
          f"seconds={seconds:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), default="dqn-cartpole")
    parser.add_argument("--smoke", action="store_true", help="dqn-cartpole, 2 trials of 1,000 steps, 2 jobs")
    parser.add_argument("--ram", default="3GiB")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--timesteps", type=int, default=None)
    parser.add_argument("--n-jobs", type=int, default=2)
    parser.add_argument("--dir", default=None, help="the working directory (default: studies/rlzoo3_run/CASE)")
    parser.add_argument("--hard-limit", action="store_true", help="then run it without memprune under a hard limit")
    args = parser.parse_args(argv)
    if args.smoke:
        args.case, args.trials, args.timesteps = "dqn-cartpole", args.trials or 2, args.timesteps or 1000
    args.trials = args.trials or CASES[args.case][4]
    args.timesteps = args.timesteps or CASES[args.case][5]
    workdir = Path(args.dir or ROOT / "studies" / "rlzoo3_run" / args.case).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    status = guarded(args.case, args, workdir)
    if args.hard_limit:
        hard_limit(args.case, args, workdir)
    return status


if __name__ == "__main__":
    sys.exit(main())
