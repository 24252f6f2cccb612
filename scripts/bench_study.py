"""Same adversarial study, same wall time: plain Optuna with process workers vs ``omp.optimize``.

The objective grows real memory to ``mb`` MiB (plus 400 MiB more when ``leak`` is set, which the footprint
does not know about), holds it, and scores higher the more it used, so TPE keeps pushing towards the
infeasible region. Some configurations are over the per-trial budget, and the host budget is smaller than
n_workers x the largest trial.

(a) Unguarded: n_workers processes each run ``study.optimize`` on a shared SQLite study. A watchdog plays
    the kernel's OOM killer: whenever the workers' summed PSS crosses the host budget, it SIGKILLs the
    process with the largest RSS; the trial it ran is lost (left RUNNING) and, as when workers are started
    by hand or by a job array, the worker stays dead. ``--restart-killed`` plays a supervisor instead,
    which starts a new worker in its place (the kinder case for plain Optuna).
(b) Guarded: ``omp.optimize(n_jobs=...)`` with the guard (clamp) and the host ledger. The same watchdog
    watches its whole process tree; each kill it has to make counts in ``guarded_over_budget``.

Last line: ``STUDY guarded_completed=<n> unguarded_completed=<n> completed_ratio=<x> guarded_over_budget=<k>
guarded_lost=<k> unguarded_lost=<k> stop_latency_p95_ms=<x>``.

    python scripts/bench_study.py                   # 2 x 120 s
    python scripts/bench_study.py --restart-killed  # plain Optuna's workers restarted after each kill
    python scripts/bench_study.py --smoke           # 2 x 25 s
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import optuna
import psutil

from optuna_memprune.monitor import MonitorError, read_tree

MiB = 2**20
BUDGET_MIB = 700  # per trial
HOST_MIB = 1600  # all trials of the host together
N_WORKERS = 4
LEAK_MIB = 400  # what `leak` adds, unknown to the footprint
BASE_MIB = 110  # a child's interpreter, optuna, numpy (measured here: about 95 MiB)
STEP_MIB, STEP_S = 20, 0.1  # a trial grows at 200 MiB/s, as a replay buffer filling
HOLD_S = 2.0  # then trains on what it holds


def objective(trial: optuna.Trial) -> float:
    """Grows to ``mb`` (+ ``LEAK_MIB``) MiB in 20 MiB steps, holds, and scores the memory it used."""
    mb = trial.suggest_int("mb", 40, 1400, step=10)
    leak = trial.suggest_categorical("leak", [False, True])
    target = mb + (LEAK_MIB if leak else 0)
    blocks = []
    while len(blocks) * STEP_MIB < target:
        blocks.append(np.ones(STEP_MIB * MiB, dtype=np.uint8))
        time.sleep(STEP_S)
    time.sleep(HOLD_S)
    return float(mb) / 100 + float(np.random.default_rng(trial.number).normal(0, 0.5))


def footprint(params: dict) -> "object":
    import optuna_memprune as omp

    return omp.Footprint.of(ram=(BASE_MIB + params["mb"]) * MiB, name="grown blocks + baseline")


# -- the OOM-killer stand-in -------------------------------------------------------------------------


def _pss_of_tree(pid: int) -> int:
    try:
        return read_tree(pid, pss=True).pss or 0
    except MonitorError:  # gone meanwhile
        return 0


def _tree(roots: list[psutil.Process]) -> list[psutil.Process]:
    procs = []
    for root in roots:
        try:
            procs += [root, *root.children(recursive=True)]
        except psutil.Error:
            pass
    return procs


def watchdog(roots: "callable", until: float, victims: "callable") -> list[int]:
    """Until ``until``, every 50 ms: when the PSS of every process under ``roots()`` sums over the host
    budget, SIGKILL the largest (by RSS) of ``victims(procs)``. Returns the pids it killed."""
    killed = []
    while time.monotonic() < until:
        tops = roots()
        if sum(_pss_of_tree(r.pid) for r in tops) > HOST_MIB * MiB:
            procs = _tree(tops)
            sizes = []
            for p in victims(procs):
                try:
                    sizes.append((p.memory_info().rss, p))
                except psutil.Error:
                    pass
            if sizes:
                victim = max(sizes, key=lambda s: s[0])[1]
                try:
                    victim.send_signal(signal.SIGKILL)
                    killed.append(victim.pid)
                except psutil.Error:
                    pass
        time.sleep(0.05)
    return killed


# -- the two runs ----------------------------------------------------------------------------------


def run_unguarded(storage: str, seconds: float, restart: bool) -> tuple[int, int]:
    optuna.create_study(storage=storage, study_name="plain", direction="maximize")
    cmd = [sys.executable, __file__, "--role", "plain-worker", "--storage", storage]
    until = time.monotonic() + seconds
    workers = [subprocess.Popen(cmd) for _ in range(N_WORKERS)]

    def roots() -> list[psutil.Process]:
        for i, w in enumerate(workers):  # with a supervisor, a killed worker is started again
            if restart and w.poll() is not None and time.monotonic() < until - 2:
                workers[i] = subprocess.Popen(cmd)
        return [psutil.Process(w.pid) for w in workers if w.poll() is None]

    kills = watchdog(roots, until, lambda procs: procs)
    for w in workers:
        w.kill()
        w.wait()
    trials = optuna.load_study(storage=storage, study_name="plain").trials
    completed = sum(t.state is optuna.trial.TrialState.COMPLETE for t in trials)
    lost = sum(t.state is optuna.trial.TrialState.RUNNING for t in trials)
    print(f"unguarded: {len(trials)} trials, {completed} complete, {lost} lost, {len(kills)} OOM kills", flush=True)
    return completed, lost


def run_guarded(storage: str, seconds: float, ledger_dir: str) -> tuple[int, int, int, list[float]]:
    cmd = [
        sys.executable,
        __file__,
        "--role",
        "guarded",
        "--storage",
        storage,
        "--seconds",
        str(seconds),
        "--ledger-dir",
        ledger_dir,
    ]
    runner = subprocess.Popen(cmd)
    root = psutil.Process(runner.pid)
    # only trial processes are victims: the runner and its fork server are not what the kernel would pick
    kills = watchdog(
        lambda: [root] if runner.poll() is None else [],
        time.monotonic() + seconds + 30,
        lambda procs: [p for p in procs if p.pid != root.pid and _is_trial(p)],
    )
    runner.wait(timeout=120)
    trials = optuna.load_study(storage=storage, study_name="guarded").trials
    from optuna_memprune.guard import read_record

    records = [read_record(t.user_attrs) for t in trials]
    completed = sum(t.state is optuna.trial.TrialState.COMPLETE for t in trials)
    lost = sum(not t.state.is_finished() or r is None for t, r in zip(trials, records))
    over = len(kills) + sum(
        1
        for t, r in zip(trials, records)
        if r is not None
        and r.peak_ram is not None
        and t.state is optuna.trial.TrialState.COMPLETE
        and r.peak_ram > BUDGET_MIB * MiB
    )
    latencies = [r.breach["stop_ms"] for r in records if r is not None and "stop_ms" in r.breach]
    decisions = {}
    for r in records:
        if r is not None:
            decisions[r.decision.value] = decisions.get(r.decision.value, 0) + 1
    print(
        f"guarded: {len(trials)} trials, {completed} complete, {lost} lost, {len(kills)} OOM kills, "
        f"decisions {decisions}",
        flush=True,
    )
    return completed, lost, over, latencies


def _is_trial(proc: psutil.Process) -> bool:
    try:
        return (
            proc.parent() is not None
            and "forkserver" in " ".join(proc.parent().cmdline())
            and "forkserver" in " ".join(proc.cmdline())
        )
    except psutil.Error:
        return False


def _guarded_role(storage: str, seconds: float, ledger_dir: str) -> None:
    import optuna_memprune as omp

    guard = omp.MemoryGuard(footprint, omp.Budget(ram=f"{BUDGET_MIB}MiB"), on_infeasible="clamp", clamp=["mb"])
    study = optuna.create_study(
        storage=storage,
        study_name="guarded",
        direction="maximize",
        sampler=guard.wrap_sampler(optuna.samplers.TPESampler()),
        pruner=guard.wrap_pruner(),
    )
    ledger = omp.Ledger(
        omp.HostBudget(ram=f"{HOST_MIB}MiB", gpus=None, headroom=0.0),
        url=f"sqlite:///{ledger_dir}/ledger.sqlite",
        host="bench",
    )
    omp.optimize(study, objective, guard=guard, timeout=seconds, n_jobs=N_WORKERS, host=ledger, show_progress_bar=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="25 s per side instead of 120 s")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument(
        "--restart-killed",
        action="store_true",
        help="restart an unguarded worker the OOM stand-in killed (a supervisor)",
    )
    parser.add_argument("--role", choices=["plain-worker", "guarded"], help=argparse.SUPPRESS)
    parser.add_argument("--storage", help=argparse.SUPPRESS)
    parser.add_argument("--ledger-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.role == "plain-worker":
        study = optuna.load_study(storage=args.storage, study_name="plain")
        study.optimize(objective, n_trials=10_000)
        return
    if args.role == "guarded":
        _guarded_role(args.storage, args.seconds, args.ledger_dir)
        return
    seconds = args.seconds or (25.0 if args.smoke else 120.0)
    with tempfile.TemporaryDirectory(prefix="memprune-bench-study-") as tmp:
        plain, lost_plain = run_unguarded(f"sqlite:///{tmp}/plain.db", seconds, args.restart_killed)
        guarded, lost, over, latencies = run_guarded(f"sqlite:///{tmp}/guarded.db", seconds, tmp)
    ratio = guarded / plain if plain else float("inf")
    p95 = float(np.percentile(latencies, 95)) if latencies else float("nan")
    print(
        f"STUDY guarded_completed={guarded} unguarded_completed={plain} completed_ratio={ratio:.2f} "
        f"guarded_over_budget={over} guarded_lost={lost} unguarded_lost={lost_plain} "
        f"stop_latency_p95_ms={p95:.0f}"
    )


if __name__ == "__main__":
    main()
