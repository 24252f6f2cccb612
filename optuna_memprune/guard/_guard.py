"""MemoryGuard: the user's footprint, budget and choices, checked, and the wrappers that apply them.

Owns argument checking; what one guard holds (its policy, trial registry and warnings) is its base class's,
``Guard`` (``_core.py``), and not the user's. The sampler, pruner and objective wrappers do the Optuna-facing
work and know nothing of each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from ..budget import RAM_FLOOR, Budget
from ..estimate.learn import Learned, learned
from ..monitor import gpu_reader
from ..units import check_number, format_bytes
from ._core import Guard
from ._forecast_stop import check_horizon
from ._learning import Learning
from ._objective import GuardedObjective
from ._policy import Policy
from ._pruner import GuardedPruner
from ._sampler import GuardedSampler

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

    from ..estimate.footprint import Footprint

_POLICIES = ("clamp", "reject")
_ON_ERROR = ("warn", "raise")
MIN_INTERVAL_S = 0.001  # faster readings burn a core reading /proc
MAX_INTERVAL_S = 10.0  # slower ones let a trial allocate and free far over its budget unseen
#: Threads every guarded process runs: its main thread and the guard's monitor thread (in process).
PROCESS_THREADS = 2


class MemoryGuard(Guard):
    """Keeps Optuna trials inside a per-process memory and thread budget.

    Before a trial launches, the wrapped sampler draws the trial's whole assignment over the known search
    space, predicts its footprint and admits, clamps or rejects it; while the trial runs, the wrapped
    objective watches this process and stops the trial that crosses the budget; the wrapped pruner answers
    True once the process crossed the soft line (``soft`` x budget). A trial predicted above the soft line
    would be pruned at its first ``should_prune()``, so that line is what a prediction must stay under to
    be admitted, what clamping aims at, and what the constraints measure. Every trial gets a record (user
    attrs ``memprune:*``) and the constraints ``memprune_ram`` / ``memprune_vram`` / ``memprune_threads``
    (one per budgeted resource, GiB or threads over the soft line), so TPE and GP learn the infeasible
    region.

    The budget is the process's: readings are the whole process (interpreter and imports included), so a
    footprint should include the baseline (``optuna_memprune.estimate.process``). With
    ``study.optimize(n_jobs>1)`` the trials share the process and the budget applies to it as a whole.

    Notes:
        - The footprint function must be pure (same params, same footprint): results are cached.
        - A footprint that raises, returns something other than a Footprint or takes longer than
          ``footprint_timeout`` does not stop the study: that trial runs unchecked under the monitor, its
          record says why, and once ``3`` trials in a row failed the same way a warning says so (once).
          ``on_footprint_error="raise"`` raises the footprint's error instead (the trial ends FAIL and the
          error leaves ``optimize``).
        - The time limit: in the main thread (``study.optimize`` with ``n_jobs=1``), where the program does
          not use SIGALRM itself, the footprint runs in that thread and a SIGALRM timer interrupts it when
          the limit passes (at its next bytecode, with an exception ``except Exception`` lets through; a
          sleep or a lock wait is cut short too). After such an interruption, in other threads, and where
          the program handles SIGALRM or has a timer set, it runs in a worker thread abandoned when the
          limit passes (a thread cannot be stopped): its late answer still fills the cache, and until it
          returns every prediction fails at once rather than queueing behind it. Until the footprint has
          answered once, a call may take 15 s (a cold start imports torch and traces a network; in the
          worker); time spent calibrating this host (a recipe's first prediction, seconds to a minute) is
          not counted.
        - Without ``search_space=`` the guard learns the space from the study's trials: the first trial, and
          the first trial of each conditional branch (a param no earlier trial suggested), run unchecked,
          with "param 'x' was first seen in this trial" as the reason. Declare the whole space, branches
          included, to check them all.
        - With conditional params the footprint receives a value for every param of the known space,
          including branches the objective will not take; gate on the branch params.
        - Name clampable params that appear only in some branches in ``search_space=`` too, or the first
          trial that lacks them raises ValueError.
        - A budget the guarded process cannot run in is refused: the soft line must hold 32 MiB of RAM and
          2 threads (the process's main thread and the guard's monitor thread).
        - A VRAM budget where no GPU is visible to NVML is predicted only, never measured: it warns once.

    Learned footprints: ``footprint=None`` learns each trial's peak RAM, VRAM and threads from the study's
    own trials (``optuna_memprune.estimate.learned``: monotone in each param, an upper bound missed by about
    ``miss_rate`` of trials). Until ``warmup`` trials ran to the end, trials run unchecked under the monitor
    and their record says "warming up" (a trial whose params are all at least those of a trial stopped over
    the budget is rejected even then); after, admission, clamping and the constraints use the bound. With a
    footprint function, ``learn=True`` (or ``learn=learned(...)``) corrects its figures by the ratio learned
    from the observed peaks (before the warm-up: x1.10, or the largest ratio seen). The model is rebuilt from
    the trial records, so it survives a restart and is shared by every worker of a storage.

    Args:
        footprint: ``params dict -> Footprint``; the predicted peak of a trial run with those params; or
            ``None``: learned from the study's trials.
        budget: the per-process limits (at least one resource).
        on_infeasible: ``"clamp"`` (default) lowers clampable params to the nearest assignment that fits,
            and rejects the trial when none does; ``"reject"`` ends every infeasible trial PRUNED.
        clamp: names of the params that may be lowered. Default: every param whose lowering reduces the
            footprint (found by evaluating it at the param's low end).
        search_space: ``{name: distribution}`` known before the first trial, conditional params included
            (otherwise learned from the study's trials; the first trial runs unchecked).
        monitor_interval: seconds between readings of the process, from 0.001 to 10 (default 0.1).
        soft: the soft line as a fraction of the budget, in (0, 1] (default 0.9); 1.0 admits predictions up
            to the budget itself.
        footprint_timeout: seconds one footprint call may take, > 0, or ``None`` for no limit (default 5;
            the first call at least 15).
        on_footprint_error: ``"warn"`` (default: the trial runs unchecked, and repeated failures warn) or
            ``"raise"``.
        horizon: a trial's last step, for the forecast stop: a trial that reports steps (``trial.report``)
            and whose RSS, fitted over the recent part of its run, is projected over the RAM budget at that
            step with high confidence is stopped early, PRUNED with decision ``forecast_stopped``
            (``optuna_memprune.monitor.forecast`` says when). ``None`` (default): the trial's
            ``n_timesteps`` or ``total_timesteps`` param where it has one, else no forecast; a positive int;
            a param name; a callable ``params -> int``; ``False``: no forecast.
        learn: ``True`` or the settings of ``optuna_memprune.estimate.learned(...)`` to learn from observed
            peaks; default: learn when ``footprint`` is ``None``, else use the footprint as it is.

    Examples:
        >>> import optuna, optuna_memprune as omp
        >>> guard = omp.MemoryGuard(lambda p: omp.Footprint.of(ram=p["n"] * 2**20), omp.Budget(ram="4GiB"),
        ...                         search_space={"n": optuna.distributions.IntDistribution(1, 8192)})
        >>> study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler()))
        >>> study.optimize(guard.wrap_objective(lambda t: t.suggest_int("n", 1, 8192)), n_trials=3)
    """

    def __init__(
        self,
        footprint: Callable[[dict[str, Any]], Footprint] | None,
        budget: Budget,
        *,
        on_infeasible: str = "clamp",
        clamp: Iterable[str] | None = None,
        search_space: dict[str, BaseDistribution] | None = None,
        monitor_interval: float = 0.1,
        soft: float = 0.9,
        footprint_timeout: float | None = 5.0,
        on_footprint_error: str = "warn",
        horizon: Any = None,
        learn: bool | Learned | None = None,
    ) -> None:
        from optuna.distributions import BaseDistribution

        if footprint is not None and not callable(footprint):
            raise TypeError(
                "footprint must be a callable params dict -> Footprint, or None (learned from the study's "
                f"trials), but got {type(footprint).__name__}."
            )
        learning = _learning(footprint, learn)
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be an optuna_memprune.Budget, but got {type(budget).__name__}.")
        if not budget.resources:
            raise ValueError(f"budget must limit at least one of ram, vram, threads, but got {budget}.")
        if on_infeasible not in _POLICIES:
            raise ValueError(f"on_infeasible must be 'clamp' or 'reject', but got {on_infeasible!r}.")
        if clamp is not None:
            if isinstance(clamp, str):
                raise TypeError(f"clamp must be a list of param names, but got the string {clamp!r}.")
            clamp = tuple(clamp)
            if not all(isinstance(n, str) for n in clamp):
                raise TypeError(f"clamp must be a list of param names, but got {clamp!r}.")
            if on_infeasible != "clamp":
                raise ValueError(f"clamp={list(clamp)} has no effect with on_infeasible={on_infeasible!r}.")
        if search_space is not None:
            if not isinstance(search_space, dict) or not all(
                isinstance(k, str) and isinstance(d, BaseDistribution) for k, d in search_space.items()
            ):
                raise TypeError(
                    f"search_space must be a dict of param name -> optuna distribution, but got {search_space!r}."
                )
            search_space = dict(search_space)
            if clamp is not None:
                Policy.check_clamp_names(clamp, search_space)
        check_number(
            monitor_interval,
            "monitor_interval",
            minimum=MIN_INTERVAL_S,
            maximum=MAX_INTERVAL_S,
            expected=f"a number of seconds in [{MIN_INTERVAL_S}, {MAX_INTERVAL_S}] (1 ms to 10 s)",
        )
        check_number(soft, "soft", minimum=0, maximum=1, open_min=True)
        check_number(
            footprint_timeout,
            "footprint_timeout",
            minimum=0,
            open_min=True,
            optional=True,
            expected="a positive number of seconds",
        )
        if on_footprint_error not in _ON_ERROR:
            raise ValueError(f"on_footprint_error must be 'warn' or 'raise', but got {on_footprint_error!r}.")
        _check_soft_line(budget, float(soft))
        checked_horizon = check_horizon(horizon)
        policy = Policy(
            footprint,
            budget,
            on_infeasible=on_infeasible,
            clamp=clamp,
            search_space=search_space,
            interval=float(monitor_interval),
            soft=float(soft),
            footprint_timeout=None if footprint_timeout is None else float(footprint_timeout),
            on_footprint_error=on_footprint_error,
            learning=learning,
        )
        super().__init__(policy, checked_horizon)
        if budget.vram is not None and not _gpu_visible():
            why = (
                'nvidia-ml-py is not installed: pip install "optuna-memprune[gpu]"'
                if find_spec("pynvml") is None
                else "no driver or no GPU"
            )
            self._warnings.once(
                "vram-unmeasured",
                (
                    f"Budget.vram is set ({format_bytes(budget.vram)}) but no GPU is visible to NVML here ({why}): "
                    "VRAM is predicted only, never measured, and no trial is stopped for its VRAM."
                ),
            )

    def __repr__(self) -> str:
        policy = self._policy
        return f"MemoryGuard({policy.budget}, on_infeasible={policy.on_infeasible!r}, soft={policy.soft})"

    @property
    def budget(self) -> Budget:
        return self._policy.budget

    @property
    def horizon(self) -> Any:
        """The ``horizon=`` of the forecast stop, as given (checked)."""
        return self._horizon

    # -- the wrappers -------------------------------------------------------------------------------

    def wrap_sampler(self, sampler: optuna.samplers.BaseSampler) -> GuardedSampler:
        """``sampler`` with the pre-launch check; see ``GuardedSampler``."""
        return GuardedSampler(sampler, self)

    def wrap_pruner(self, pruner: optuna.pruners.BasePruner | None = None) -> GuardedPruner:
        """``pruner`` (or none) that also answers True over the soft line; see ``GuardedPruner``."""
        return GuardedPruner(pruner, self)

    def wrap_objective(self, objective: Callable[[optuna.Trial], Any]) -> GuardedObjective:
        """``objective`` run under the monitor, with rejection and the trial record; see GuardedObjective."""
        return GuardedObjective(objective, self)


def _check_soft_line(budget: Budget, soft: float) -> None:
    """ValueError when the soft line (``soft`` x budget) is below what the guarded process itself takes:
    every trial would be pruned at its first reading."""
    if budget.threads is not None and soft * budget.threads < PROCESS_THREADS:
        need = math.ceil(PROCESS_THREADS / soft)
        need += soft * need < PROCESS_THREADS  # float rounding
        raise ValueError(
            f"Budget.threads must be at least {need} with soft={soft:g} (the guarded process runs "
            f"{PROCESS_THREADS} threads itself, its main thread and the guard's monitor, and soft x threads "
            f"must hold them), but got {budget.threads}."
        )
    if budget.ram is not None and soft * budget.ram < RAM_FLOOR:
        raise ValueError(
            f"The RAM soft line (soft={soft:g} x Budget.ram {format_bytes(budget.ram)}) must be at least "
            f"{format_bytes(RAM_FLOOR)} (a Python process running an Optuna trial takes more): raise ram or "
            f"soft."
        )


def _learning(footprint: Any, learn: Any) -> Learning | None:
    """The learned model ``learn=`` asks for (checked), or ``None``."""
    if learn is None:
        learn = footprint is None
    if learn is False:
        if footprint is None:
            raise ValueError("learn=False needs a footprint function: with footprint=None the footprint is learned.")
        return None
    if learn is True:
        learn = learned()
    if not isinstance(learn, Learned):
        raise TypeError(
            f"learn must be True, False, None or optuna_memprune.estimate.learned(...), but got {type(learn).__name__}."
        )
    return Learning(learn, corrected=footprint is not None)


def _gpu_visible() -> bool:
    """Whether NVML sees a GPU here (what the monitor reads VRAM with); loads pynvml only when asked."""
    reader = gpu_reader()
    if reader is None:
        return False
    reader.close()
    return True
