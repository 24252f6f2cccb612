"""The studies people already have, run unchanged under ``memprune run``, against the same programs unguarded.

Five real programs (``scripts/_clients/``), none written for this project (no footprint, no reference to
it); each reads ``N_TRIALS``, ``N_JOBS``, ``SEED``, ``OPTUNA_STORAGE`` and ``STUDY_NAME`` from the
environment, as a user's script reads its settings:

- ``hf_gpt2``: Hugging Face ``Trainer.hyperparameter_search(backend="optuna")`` on GPT-2s built from
  ``GPT2Config`` (width 64-1024, 1-8 layers, batch 8-128, a learning rate, 3 steps); no main guard;
- ``lightning_mlp``: PyTorch Lightning with optuna-integration's ``PyTorchLightningPruningCallback`` and
  ``MedianPruner`` (an MLP, widths 32-8192, 1-6 layers, batch, learning rate);
- ``lightgbm_regression``: LightGBM on generated data (rows, ``num_leaves``, ``max_bin``, learning rate);
- ``keras_mlp``: a Keras (TensorFlow CPU) MLP (width, layers, batch, learning rate);
- ``plain_torch``: a plain torch MLP training script (width, depth, batch, learning rate); no main guard.

Each runs in process (``n_jobs=1``) and with ``n_jobs=2``, ``--trials`` trials (20), seed ``--seed``, and a
per-trial RAM budget that about a third of its space exceeds (``BUDGETS``), twice:

- guarded: ``memprune run --ram BUDGET -- python PROGRAM`` (learned footprint), the trials kept on a SQLite
  file: with ``memprune run --storage URL`` where the command has it (the program then makes its study in
  memory, as written), else through the program's own ``OPTUNA_STORAGE``;
- unguarded: the same program in a cgroup whose hard limit is the budget (its whole process tree, both
  modes); a run the kernel kills is restarted with the trials still to make and the next seed, as a user
  would restart it, and the trials it left RUNNING are told FAIL. Without a cgroup memory controller the
  bench says so and polls the tree's RSS instead, killing it at the budget.

From the stored trials (``optuna_memprune.records.read``), per run: trials made, warm-up (trials before the
first one predicted), the fit's error and the bound's excess over the peak on the trials completed after the
warm-up, as admission compares them: in a shared process the process's usage at the trial's start plus the
fit or bound against the process's peak (the line before the last gives them on the trial's own increment,
``peak - start``, where an increment of 1 MiB makes any bound hundreds of percent over), launches after
the warm-up that ended over the budget, false rejections (rejected assignments, at most 5 per run sampled,
rerun alone and unguarded in a fresh process through the program's own code, ``_clients/_replay.py``, whose
peak stays under the soft line), clamps that moved only memoryless params (by name: learning rates,
dropout, seeds, ...), lost trials and the wasted compute: guarded, the seconds of trials that ended over the
budget; unguarded, those of the trials the kill ended (the other one running with ``n_jobs=2`` included) and
of each restarted program up to its first trial (its imports, data and study load, redone because the kill
ended the program; a guarded run is never restarted). The line before the last splits the unguarded
seconds and gives the ratio on the killed trials alone.
Last line::

    CLIENTS programs=<k> runs=<r> trials_as_asked=<r>/<r> warmup_max=<n> fit_median_err=<x>%
    bound_median_over=<x>% over_budget_after_warmup=<x>% false_rejects=<x>% memoryless_clamps=<n> lost=<n>
    wasted_compute_ratio=<x>

Targets (issue 24): every run makes exactly the trials asked with the unguarded run's failures, warm-up <= 4,
fit error <= 10%, bound <= 20% over, over-budget launches after warm-up <= 5%, false rejections <= 5%, no
memoryless clamp, nothing lost, wasted compute <= 0.25 of unguarded.

Packages (not in the project's extras): a venv of your own made from the project venv's python, seeing the
project venv's packages (torch, optuna) through a ``.pth`` file, since ``--system-site-packages`` reaches
only the base interpreter's. The ``.pth`` names a folder of links to the project venv's packages without
``torchvision``: the registry's torchvision 0.28.0 is built against the CUDA torch and fails to import with
the CPU torch 2.13.0, and transformers and torchmetrics import it whenever it is installed. Write the
``.pth`` before installing, so pip sees torch there and installs none::

    $PROJECT_VENV/bin/python -m venv --system-site-packages $BENCH_VENV
    SITE=$($PROJECT_VENV/bin/python -c "import site; print(site.getsitepackages()[0])")
    mkdir $BENCH_VENV/project-site
    for f in $SITE/*; do case $(basename $f) in torchvision*) ;; *) ln -s $f $BENCH_VENV/project-site/;; esac; done
    echo $BENCH_VENV/project-site > $BENCH_VENV/lib/python3.11/site-packages/project-venv.pth
    $BENCH_VENV/bin/pip install transformers==5.24.0 accelerate==1.15.0 lightning==2.6.6 \\
        optuna-integration==5.0.0 lightgbm==4.7.0 tensorflow-cpu==2.21.0
    PYTHONPATH=$PWD $BENCH_VENV/bin/python scripts/bench_clients.py --smoke

Run: ``python scripts/bench_clients.py [--smoke] [--programs a,b] [--trials N] [--seed S] [--json PATH]
[--logs DIR] [--measure K]`` (``--smoke``: plain_torch and lightgbm_regression, 6 trials; ``--measure K``:
each program's peak on K random draws, each alone in a fresh process, to set ``BUDGETS``). A program whose
packages are missing is skipped with the reason (``programs=`` counts the ones run). Needs root for the
cgroups (else the polling fallback). The programs' output goes to one log file per run in ``--logs``, beside the runs' SQLite files.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = ROOT / "scripts" / "_clients"
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

import optuna_memprune as omp  # noqa: E402
from optuna_memprune import cgroups, records  # noqa: E402
from optuna_memprune.records import Decision  # noqa: E402

MiB = 2**20
#: Per-trial RAM budgets (the whole process, imports included): about a third of each space exceeds them.
#: Measured with ``--measure 30``: thirty random draws of each space (the program's own first draw, seeds
#: 1000-1029), each alone in a fresh process with its study on a SQLite file as in the runs (``_replay.py``),
#: peak = the process's max RSS; the budget is ``third`` of the peaks, and beside each how many of the 30
#: exceed it. The budgets first set from six draws, replayed in memory, let 40-53% of the thirty exceed
#: (plain_torch 450 MiB, lightgbm_regression 245, hf_gpt2 620, keras_mlp 780) and lightning_mlp's 23% (520
#: MiB, from its space: its six draws had all stayed at its imports' level); the RDB storage adds about 30 MiB.
BUDGETS = {
    "plain_torch": "680MiB",  # 10 of 30 exceed (peaks 357-515, then 844-2597 MiB)
    "lightgbm_regression": "341MiB",  # 11 (183-335, then 347-1825)
    "hf_gpt2": "805MiB",  # 10 (469-755, then 856-1673)
    "lightning_mlp": "499MiB",  # 11 (480-486, then 513-1890)
    "keras_mlp": "1053MiB",  # 10 (705-876, then 1229-3049)
}
NEEDS = {
    "plain_torch": ("torch",),
    "lightgbm_regression": ("lightgbm",),
    "hf_gpt2": ("transformers", "accelerate"),
    "lightning_mlp": ("lightning", "optuna_integration"),
    "keras_mlp": ("tensorflow", "keras"),
}
SMOKE = ("plain_torch", "lightgbm_regression")
OVER = (Decision.STOPPED, Decision.OUT_OF_MEMORY)
PREDICTED = (Decision.ADMITTED, Decision.CLAMPED, Decision.REJECTED)
#: Params with no memory effect, by name (a clamp that moves only these moved nothing the budget depends on).
MEMORYLESS = re.compile(r"(^|_)(lr|learning_rate|dropout|seed|weight_decay|gamma|momentum|clip|eps|beta\d?)($|_)")
#: At most this many rejected assignments per run are rerun alone to judge false rejections.
REPLAYS = 5
#: A run that takes longer than this per trial asked is killed (and counted lost).
SECONDS_PER_TRIAL = 120
#: A guarded run whose storage holds more than this many times the trials asked is killed: its program was
#: re-executed by its trial processes (issue 24: 52 trials made of 8 asked), and would not end in time.
RUNAWAY = 2


@dataclass
class Run:
    """One program in one mode: what the guarded and the unguarded runs made, and the figures of the row."""

    program: str
    n_jobs: int
    budget: int
    trials: int = 0
    asked: int = 0
    exit_code: int | None = None
    unguarded_exit: int | None = None  # the program's own exit code unguarded (None: every run killed)
    unguarded_restarts: int = 0
    unguarded_trials: int = 0
    unguarded_failed: int = 0
    unguarded_killed: int = 0
    failed: int = 0
    decisions: dict[str, int] = field(default_factory=dict)
    warmup: int = 0
    fit_errors: list[float] = field(default_factory=list)
    bound_over: list[float] = field(default_factory=list)
    fit_errors_own: list[float] = field(default_factory=list)
    bound_over_own: list[float] = field(default_factory=list)
    launched_after: int = 0
    over_after: int = 0
    rejected: int = 0
    replayed: int = 0
    false_rejects: int = 0
    memoryless_clamps: int = 0
    lost: int = 0
    wasted: float = 0.0
    wasted_unguarded: float = 0.0
    restarts_unguarded: float = 0.0  # seconds each restarted program took to its first trial (setup redone)
    wall: float = 0.0
    wall_unguarded: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def as_asked(self) -> bool:
        """Exactly the trials asked, failing only where the unguarded run failed, and no crash of its own."""
        return (
            self.trials == self.asked
            and self.failed <= self.unguarded_failed
            and (self.exit_code == 0 or self.unguarded_exit not in (0, None))
        )


def own_peak(record: Any) -> int | None:
    """The trial's own RAM: its peak less the process's usage at its start where the record has it."""
    if record.peak_ram is None:
        return None
    start = getattr(record, "start_ram", None)
    return record.peak_ram - start if start else record.peak_ram


def _ram(figure: Any) -> float | None:
    if isinstance(figure, dict):
        figure = figure.get("ram")
    return None if figure is None else float(figure)


def predicted(record: Any) -> bool:
    """Whether the trial was admitted, clamped or rejected on a prediction at launch: its decision says so,
    or it ended over the budget (stopped) with the prediction it was launched on in its record (a trial run
    unchecked has none). Counting decisions alone, a first predicted trial that crossed the budget was
    counted in the warm-up, and its crossing was not counted after it."""
    return record.decision in PREDICTED or record.pred_ram is not None


def _seconds(trial: optuna.trial.FrozenTrial) -> float:
    if trial.datetime_start is None or trial.datetime_complete is None:
        return 0.0
    return (trial.datetime_complete - trial.datetime_start).total_seconds()


def score(run: Run, trials: Iterable[optuna.trial.FrozenTrial]) -> list[tuple[int, dict[str, Any], float]]:
    """Fill ``run``'s figures from the guarded run's trials; returns the rejected ``(number, params, soft
    line)`` to rerun alone. The warm-up is the number of trials before the first predicted one (admitted,
    clamped or rejected at launch, ``predicted``; all of them when none was); every later trial not rejected
    is a launch after it."""
    trials = sorted(trials, key=lambda t: t.number)
    run.trials = len(trials)
    first = next(
        (i for i, t in enumerate(trials) if (r := records.read(t.user_attrs)) is not None and predicted(r)),
        len(trials),
    )
    run.warmup = first
    rejected = []
    for i, t in enumerate(trials):
        record = records.read(t.user_attrs)
        run.failed += t.state == optuna.trial.TrialState.FAIL
        if record is None or not t.state.is_finished():
            run.lost += 1
            continue
        run.decisions[record.decision.value] = run.decisions.get(record.decision.value, 0) + 1
        over = record.decision in OVER
        if over:
            run.wasted += _seconds(t)
        if (
            record.decision is Decision.CLAMPED
            and record.clamped_from
            and all(MEMORYLESS.search(name) for name in record.clamped_from)
        ):
            run.memoryless_clamps += 1
        if i < first:
            continue
        if record.decision is Decision.REJECTED:
            run.rejected += 1
            soft = record.soft * (record.budget_ram or run.budget)
            rejected.append((t.number, dict(t.params), soft))
            continue
        run.launched_after += 1
        run.over_after += over
        own, start = own_peak(record), getattr(record, "start_ram", None) or 0
        center = _ram(record.learned.get("center"))
        bound = _ram(record.learned.get("bound")) or _ram(record.pred_ram)
        if t.state == optuna.trial.TrialState.COMPLETE and own and own > 0:
            for figure, errors, errors_own in (
                (center, run.fit_errors, run.fit_errors_own),
                (bound, run.bound_over, run.bound_over_own),
            ):
                if figure is None:
                    continue
                absolute = errors is run.fit_errors  # the fit's error; the bound's excess is signed
                errors_own.append(abs(own - figure) / own if absolute else (figure - own) / own)
                peak, level = record.peak_ram, start + figure
                errors.append(abs(peak - level) / peak if absolute else (level - peak) / peak)
    return rejected


@dataclass
class Totals:
    """The CLIENTS line's figures over runs."""

    programs: set[str] = field(default_factory=set)
    runs: list[Run] = field(default_factory=list)

    def line(self) -> str:
        runs = self.runs
        fit = [e for r in runs for e in r.fit_errors]
        bound = [e for r in runs for e in r.bound_over]
        launched, over = sum(r.launched_after for r in runs), sum(r.over_after for r in runs)
        replayed, false = sum(r.replayed for r in runs), sum(r.false_rejects for r in runs)
        wasted_trials = sum(r.wasted_unguarded for r in runs)
        restarts = sum(r.restarts_unguarded for r in runs)
        wasted_u = wasted_trials + restarts

        def pct(values: list[float]) -> str:
            return f"{100 * statistics.median(values):.1f}%" if values else "-"

        wasted = sum(r.wasted for r in runs)
        ratio = f"{wasted / wasted_u:.2f}" if wasted_u > 0 else "-"
        return (
            f"CLIENTS_WASTE guarded={wasted:.1f}s unguarded={wasted_u:.1f}s (killed trials {wasted_trials:.1f}s, "
            f"restarts {restarts:.1f}s) trials_only_ratio="
            f"{f'{wasted / wasted_trials:.2f}' if wasted_trials > 0 else '-'}\n"
            f"CLIENTS_OWN fit_median_err={pct([e for r in runs for e in r.fit_errors_own])} "
            f"bound_median_over={pct([e for r in runs for e in r.bound_over_own])} (on each trial's own "
            f"increment in a shared process)\n"
            f"CLIENTS programs={len(self.programs)} runs={len(runs)} "
            f"trials_as_asked={sum(r.as_asked for r in runs)}/{len(runs)} "
            f"warmup_max={max((r.warmup for r in runs), default=0)} fit_median_err={pct(fit)} "
            f"bound_median_over={pct(bound)} "
            f"over_budget_after_warmup={100 * over / launched if launched else 0.0:.1f}% "
            f"false_rejects={100 * false / replayed if replayed else 0.0:.1f}% "
            f"memoryless_clamps={sum(r.memoryless_clamps for r in runs)} lost={sum(r.lost for r in runs)} "
            f"wasted_compute_ratio={ratio}"
        )


def row(run: Run) -> str:
    def med(values: list[float]) -> str:
        return f"{100 * statistics.median(values):.1f}%" if values else "-"

    return (
        f"{run.program} n_jobs={run.n_jobs} budget={run.budget // MiB}MiB: guarded {run.trials}/{run.asked} "
        f"trials (exit {run.exit_code}, {run.failed} FAIL) {run.decisions}, warm-up {run.warmup}, fit err "
        f"{med(run.fit_errors)}, bound over {med(run.bound_over)} (n={len(run.fit_errors)}), over budget after "
        f"warm-up {run.over_after}/{run.launched_after}, false rejects {run.false_rejects}/{run.replayed} of "
        f"{run.rejected} rejected, memoryless clamps {run.memoryless_clamps}, lost {run.lost}, wasted "
        f"{run.wasted:.1f} s, {run.wall:.0f} s | unguarded {run.unguarded_trials} trials, "
        f"{run.unguarded_killed} killed at the limit, {run.unguarded_failed} FAIL otherwise, "
        f"{run.unguarded_restarts} restarts ({run.restarts_unguarded:.1f} s to their first trials), wasted "
        f"{run.wasted_unguarded:.1f} s in killed trials, {run.wall_unguarded:.0f} s"
        + "".join(f"; {n}" for n in run.notes)
    )


class Limit:
    """A hard memory limit on a process tree: a cgroup below this process's own, or, where none can be made,
    a watchdog that kills the tree's process group once its RSS crosses the limit."""

    def __init__(self, place: "cgroups.Place | None", hard: int) -> None:
        self.place, self.hard, self.group, self.crossed = place, hard, None, False
        self._stop = threading.Event()

    def preexec(self) -> Any:
        if self.place is None:
            return os.setsid
        self.group, why = cgroups.TrialGroup.create(self.place, random.randrange(10**9))
        if self.group is None:
            raise RuntimeError(why)
        self.group.limit(self.hard)
        group = self.group

        def enter() -> None:
            os.setsid()
            group.add(os.getpid())

        return enter

    def watch(self, proc: subprocess.Popen) -> None:
        if self.place is not None:
            return
        from optuna_memprune.monitor import Monitor

        def reading(r: Any) -> None:
            if r.rss > self.hard and not self.crossed:
                self.crossed = True
                os.killpg(proc.pid, signal.SIGKILL)

        self.monitor = Monitor(proc.pid, interval=0.1, on_reading=reading).start()

    def killed(self) -> bool:
        return self.crossed or (self.group is not None and self.group.oom_kills() > 0)

    def close(self) -> None:
        if self.place is None and hasattr(self, "monitor"):
            self.monitor.stop()
        if self.group is not None:
            self.group.remove()


def launch(
    argv: list[str],
    env: dict[str, str],
    log: Path,
    timeout: float,
    limit: Limit | None = None,
    runaway: Callable[[], str | None] | None = None,
) -> tuple[int, float, int]:
    """Run ``argv`` with its output appended to ``log``; ``(exit code, seconds, max RSS of its largest
    process in bytes)``; a run past ``timeout``, or once ``runaway()`` (asked every 10 s) says why, has its
    process group killed (exit code -9, the reason in the log)."""
    start = time.monotonic()
    done = threading.Event()

    def watch(proc: subprocess.Popen, out: Any) -> None:
        while not done.wait(10):
            why = "past the time limit" if time.monotonic() - start > timeout else runaway() if runaway else None
            if why:
                out.write(f"[stopped by the bench: {why}]\n")
                out.flush()
                os.killpg(proc.pid, signal.SIGKILL)
                return

    with open(log, "a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=limit.preexec() if limit else os.setsid
        )
        if limit:
            limit.watch(proc)
        watcher = threading.Thread(target=watch, args=(proc, out), daemon=True)
        watcher.start()
        _, status, usage = os.wait4(proc.pid, 0)
        done.set()
        watcher.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.write(f"[exit {proc.returncode}]\n")
    return proc.returncode, time.monotonic() - start, usage.ru_maxrss * 1024


def program_env(program: str, trials: int, n_jobs: int, seed: int, storage: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPTUNA_STORAGE", "STUDY_NAME")}
    env.update(
        N_TRIALS=str(trials),
        N_JOBS=str(n_jobs),
        SEED=str(seed),
        STUDY_NAME=program,
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    if storage:
        env["OPTUNA_STORAGE"] = storage
    return env


def load_trials(url: str) -> list[optuna.trial.FrozenTrial]:
    names = optuna.get_all_study_names(url)
    return [t for name in names for t in optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)]


def has_storage_flag() -> bool:
    """Whether ``memprune run`` takes ``--storage`` (being added): then the program keeps its in-memory study."""
    out = subprocess.run(
        [sys.executable, "-m", "optuna_memprune.cli", "run", "--help"],
        capture_output=True,
        text=True,
        env=program_env("", 0, 1, 0, None),
    )
    return "--storage" in out.stdout


def fresh(where: Path, name: str) -> str:
    """The URL of a new SQLite file ``name`` in ``where`` (an earlier run's file is removed: the programs load
    an existing study)."""
    (where / name).unlink(missing_ok=True)
    return f"sqlite:///{where / name}"


def guarded(run: Run, args: argparse.Namespace, where: Path, storage_flag: bool) -> str:
    url = fresh(where, f"{run.program}-{run.n_jobs}-guarded.db")
    path = str(CLIENTS / f"{run.program}.py")
    argv = [
        sys.executable,
        "-m",
        "optuna_memprune.cli",
        "run",
        "--ram",
        str(run.budget),
        *(["--storage", url] if storage_flag else []),
        "--",
        sys.executable,
        path,
    ]
    env = program_env(run.program, args.trials, run.n_jobs, args.seed, None if storage_flag else url)
    log = Path(args.logs) / f"{run.program}-{run.n_jobs}-guarded.log"

    def runaway() -> str | None:  # a program re-executed by its trial processes makes trials without end
        try:
            made = len(load_trials(url)) if optuna.get_all_study_names(url) else 0
        except Exception:  # noqa: BLE001 - the file is being written; ask again later
            return None
        if made > RUNAWAY * args.trials:
            run.notes.append(f"stopped by the bench at {made} trials (more than {RUNAWAY}x the trials asked)")
            return f"{made} trials in the storage, more than {RUNAWAY}x the {args.trials} asked"
        return None

    run.exit_code, run.wall, _ = launch(argv, env, log, SECONDS_PER_TRIAL * args.trials, runaway=runaway)
    return url


def unguarded(run: Run, args: argparse.Namespace, where: Path, place: "cgroups.Place | None") -> None:
    """The program under the hard limit, restarted after each kill with the trials still to make."""
    url = fresh(where, f"{run.program}-{run.n_jobs}-unguarded.db")
    log = Path(args.logs) / f"{run.program}-{run.n_jobs}-unguarded.log"
    killed: set[int] = set()
    restarted: list[datetime.datetime] = []  # when each restart began
    for attempt in range(args.trials):
        made = len(load_trials(url)) if optuna.get_all_study_names(url) else 0
        if made >= args.trials:
            break
        if attempt:
            restarted.append(datetime.datetime.now())  # Optuna's datetime_start is local time too
        limit = Limit(place, run.budget)
        env = program_env(run.program, args.trials - made, run.n_jobs, args.seed + attempt, url)
        try:
            code, seconds, _ = launch(
                [sys.executable, str(CLIENTS / f"{run.program}.py")], env, log, SECONDS_PER_TRIAL * args.trials, limit
            )
        finally:
            was_killed = limit.killed()
            limit.close()
        run.wall_unguarded += seconds
        if not was_killed:  # the exit code of a run the limit did not end: the program's own
            run.unguarded_exit = code
            break
        run.unguarded_restarts += attempt < args.trials - 1
        study = optuna.load_study(study_name=run.program, storage=url)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)  # what a heartbeat would do
            killed.add(t.number)
    trials = load_trials(url) if optuna.get_all_study_names(url) else []
    run.unguarded_trials = len(trials)
    run.unguarded_killed = len(killed)
    run.unguarded_failed = sum(t.state == optuna.trial.TrialState.FAIL and t.number not in killed for t in trials)
    run.wasted_unguarded = sum(_seconds(t) for t in trials if t.number in killed)
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    run.restarts_unguarded = restart_seconds(restarted, starts, datetime.datetime.now())


def restart_seconds(
    restarted: list[datetime.datetime], starts: list[datetime.datetime], end: datetime.datetime
) -> float:
    """Seconds from each restart (``restarted``) to the first trial start after it (its imports, data and
    study load, redone because a kill ended the program); a restart that started no trial before the next
    restart (or ``end``) counts whole."""
    starts, total = sorted(starts), 0.0
    for i, began in enumerate(restarted):
        until = restarted[i + 1] if i + 1 < len(restarted) else end
        first = next((s for s in starts if s >= began), None)
        total += ((first if first is not None and first < until else until) - began).total_seconds()
    return total


def replay(
    program: str,
    params: dict[str, Any],
    seed: int,
    args: argparse.Namespace,
    place: Any,
    hard: int,
    out: Path | None = None,
) -> tuple[int, int, bool]:
    """The program alone for one trial with ``params`` (``{}``: its own first draw), unguarded, in a fresh
    process under a hard limit; ``(exit code, peak RSS bytes, killed at the limit)``."""
    limit = Limit(place, hard)
    argv = [sys.executable, str(CLIENTS / "_replay.py"), str(CLIENTS / f"{program}.py"), json.dumps(params)]
    try:
        code, _, peak = launch(
            argv + ([str(out)] if out else []),
            program_env(program, 1, 1, seed, None),
            Path(args.logs) / f"{program}-replays.log",
            SECONDS_PER_TRIAL,
            limit,
        )
    finally:
        killed = limit.killed()
        limit.close()
    return code, peak, killed


def measure(names: list[str], args: argparse.Namespace, place: Any) -> None:
    for name in names:
        peaks = []
        for k in range(args.measure):
            out = Path(args.logs) / f"{name}-draw-{k}.json"
            code, peak, killed = replay(name, {}, 1000 + k, args, place, 8 * 2**30, out)
            params = json.loads(out.read_text()) if out.exists() else None
            peaks.append(peak)
            print(
                f"{name} draw {k}: exit {code}{' (killed)' if killed else ''}, peak {peak / MiB:.0f} MiB, {params}",
                flush=True,
            )
        ranked = sorted(peaks)
        print(
            f"{name}: peaks {[round(p / MiB) for p in ranked]} MiB; budget {third(ranked) / MiB:.0f} MiB",
            flush=True,
        )


def third(peaks: list[int]) -> int:
    """A budget that about a third of ``peaks`` exceed: the middle of the widest gap between two
    consecutive peaks (sorted) with 30-37% of them above it. The widest, not the gap at exactly a third:
    peaks bunched at a program's import level (lightning_mlp's 448-455 MiB) leave gaps of 1-2 MiB there,
    where a budget would be decided by a reading's noise."""
    ranked = sorted(peaks)
    n = len(ranked)
    gaps = [(ranked[i + 1] - ranked[i], i) for i in range(n - 1) if 0.30 <= (n - 1 - i) / n <= 0.37]
    if not gaps:  # too few draws for a gap in that share: the one at a third
        gaps = [(0, n - math.ceil(n / 3) - 1)]
    _, i = max(gaps)
    return (ranked[i] + ranked[min(i + 1, n - 1)]) // 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="plain_torch and lightgbm_regression, 6 trials")
    parser.add_argument("--programs", default=None, help="comma-separated: " + ",".join(BUDGETS))
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the runs and the totals here")
    parser.add_argument("--logs", default=None, help="the programs' output, one file per run (default: a temp dir)")
    parser.add_argument("--measure", type=int, default=0, help="measure each program's peak on K random draws")
    args = parser.parse_args()
    args.trials = args.trials or (6 if args.smoke else 20)
    args.logs = args.logs or tempfile.mkdtemp(prefix="bench-clients-logs-")
    Path(args.logs).mkdir(parents=True, exist_ok=True)
    names = args.programs.split(",") if args.programs else list(SMOKE if args.smoke else BUDGETS)
    unknown = [n for n in names if n not in BUDGETS]
    if unknown:
        parser.error(f"unknown programs {unknown}; known: {', '.join(BUDGETS)}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    place, why = cgroups.place()
    if place is not None and not place.memory:
        place, why = None, "the cgroup has no memory controller"
    storage_flag = has_storage_flag()
    print(
        f"hard limit: {'cgroup v%d memory group per run' % place.version if place else 'watchdog: ' + why}; "
        f"{args.trials} trials, seed {args.seed}; records through "
        f"{'memprune run --storage' if storage_flag else 'the program OPTUNA_STORAGE'}; logs in {args.logs}",
        flush=True,
    )
    ready = []
    for name in names:
        missing = [m for m in NEEDS[name] if importlib.util.find_spec(m) is None]
        if missing:
            print(f"{name}: skipped, {', '.join(missing)} not installed (see this script's docstring)", flush=True)
        else:
            ready.append(name)
    if args.measure:
        measure(ready, args, place)
        return
    totals = Totals()
    where = Path(args.logs)  # the runs' SQLite files stay beside their logs, for memprune report
    for name in ready:
        totals.programs.add(name)
        for n_jobs in (1, 2):
            run = Run(name, n_jobs, omp.Budget(ram=BUDGETS[name]).ram, asked=args.trials)
            url = guarded(run, args, where, storage_flag)
            trials = load_trials(url) if optuna.get_all_study_names(url) else []
            rejected = score(run, trials)
            unguarded(run, args, where, place)
            run.lost += run.exit_code != 0 and not run.unguarded_exit  # crashed where unguarded did not
            for number, params, soft in random.Random(args.seed).sample(rejected, min(REPLAYS, len(rejected))):
                code, peak, killed = replay(name, params, args.seed, args, place, run.budget)
                run.replayed += 1
                fits = code == 0 and not killed and peak < soft
                run.false_rejects += fits
                if fits:
                    run.notes.append(f"trial {number} rejected, ran alone at {peak / MiB:.0f} MiB")
            totals.runs.append(run)
            print(row(run), flush=True)
    line = totals.line()
    if args.json:
        Path(args.json).write_text(
            json.dumps({"runs": [asdict(r) | {"as_asked": r.as_asked} for r in totals.runs], "line": line}, indent=1)
        )
    print(line)


if __name__ == "__main__":
    main()
