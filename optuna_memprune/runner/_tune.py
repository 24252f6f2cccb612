"""Ray Tune trials admitted by prediction: ``tune_with_resources(trainable, guard)`` is Tune's
``tune.with_resources(trainable, resources)`` with each trial's resources from the guard's footprint of its
config, and a trainable that refuses, with the reason, a config predicted over the budget.

Owns turning one config into Tune's resource dict (``cpu``, ``gpu``, ``memory``) through the Ray backend's
figures (``_reserve``, ``_ray_nodes``) and the refusal's words; Tune's searchers, schedulers and its loop stay
Tune's. Knows nothing of Optuna studies: a Tune trial has no Optuna trial, no record and no learned margin.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

from ..guard.backend import policy_of
from ._ray_nodes import ask_for, gpu_memory
from ._reserve import figures as reserved

if TYPE_CHECKING:
    from ..estimate.footprint import Footprint
    from ..guard import MemoryGuard
    from ..guard.backend import Policy


class OverBudget(RuntimeError):
    """A Tune trial whose config is predicted over the guard's budget: raised at its start, so Tune ends it
    ERROR with this message before it allocates anything."""


def tune_with_resources(trainable: Any, guard: MemoryGuard, *, gpu_memory_bytes: int | None = None) -> Any:
    """``tune.with_resources(trainable, resources)`` where each trial's resources come from ``guard``'s
    footprint of its config: a Tune trial is placed by what it will really use, as ``optimize(backend="ray")``
    places an Optuna trial.

    For a config the footprint predicts, the trial asks Tune for ``memory`` = the predicted peak RAM (bytes,
    capped by the budget), ``cpu`` = the predicted threads where the budget limits threads (at least 1; else
    1), and ``gpu`` = the predicted VRAM as a fraction of a GPU's memory (``gpu_memory_bytes``, or the
    smallest GPU of the cluster, read once by NVML; 0 without VRAM or on a cluster without GPUs). A config
    predicted over the budget's soft line asks 1 CPU and is refused at its start: the trainable raises
    ``OverBudget`` naming what is over, and Tune ends that trial ERROR. Where the footprint fails for a
    config, the trial asks the whole budget (it runs unchecked, as in a study).

    Args:
        trainable: a Tune function trainable (``def train(config): ...``) or a ``tune.Trainable`` class.
        guard: a ``MemoryGuard`` with a footprint (a learned footprint learns from an
            Optuna study's trials, which Tune does not have: ``ValueError``); it must pickle (Tune sends the
            trainable to its workers).
        gpu_memory_bytes: one GPU's memory, when the cluster's is not to be read (a positive int).

    Notes:
        - The footprint is called with the trial's config as its params: the names it reads must be the
          config's keys (a nested config is passed as it is).
        - Tune's searchers, schedulers and stopping are unchanged. What runs is not watched: a Tune trial has no
          Optuna trial to prune or record (``optimize(backend="ray")`` watches and records each trial).

    Examples:
        >>> from ray import tune  # doctest: +SKIP
        >>> guard = omp.MemoryGuard(footprint, omp.Budget(ram="8GiB"))  # doctest: +SKIP
        >>> tuner = tune.Tuner(omp.tune_with_resources(train, guard), param_space=space)  # doctest: +SKIP
    """
    from ._ray import import_ray

    import_ray()
    from ray import tune

    policy = policy_of(guard)
    if policy.learning is not None:
        raise ValueError(
            "tune_with_resources needs a guard with a footprint: a learned footprint learns from an Optuna "
            "study's trials, and a Tune trial has none (write the footprint, or run the study with "
            "optimize(backend='ray'))."
        )
    if gpu_memory_bytes is not None and (not isinstance(gpu_memory_bytes, int) or gpu_memory_bytes <= 0):
        raise ValueError(f"gpu_memory_bytes must be None or a positive int of bytes, but got {gpu_memory_bytes!r}.")
    return tune.with_resources(_refusing(trainable, guard), _Resources(guard, gpu_memory_bytes))


class _Resources:
    """Tune's resources of one config (called on Tune's driver, where Ray is connected)."""

    def __init__(self, guard: MemoryGuard, gpu_memory_bytes: int | None) -> None:
        self._guard, self._gpu_memory = guard, gpu_memory_bytes
        self._probed = gpu_memory_bytes is not None

    def __call__(self, config: dict[str, Any]) -> Any:
        from ray.tune import PlacementGroupFactory

        from ._ray_nodes import alive_nodes

        policy = policy_of(self._guard)
        prediction, why = _predict(policy, config)
        if why:
            return PlacementGroupFactory([{"CPU": 1.0}])  # refused at its start: nothing to place
        nodes = alive_nodes()
        figures = reserved(policy.budget, prediction, {})
        if figures["vram"] > 0 and not self._probed:
            self._probed, self._gpu_memory = True, gpu_memory(nodes)
        ask = ask_for(
            figures,
            threads_budgeted=policy.budget.threads is not None,
            unchecked=prediction is None,
            nodes=nodes,
            gpu_memory=self._gpu_memory,
        )
        return PlacementGroupFactory([{"CPU": ask.num_cpus, "GPU": ask.num_gpus, "memory": float(ask.memory)}])


def _predict(policy: Policy, config: dict[str, Any]) -> tuple[Footprint | None, str]:
    """The footprint of ``config`` (None where the footprint failed: unchecked) and why it is refused
    (``""`` where it is not)."""
    try:
        prediction = policy.predict(config)
    except Exception:  # noqa: BLE001 - the trial runs unchecked, asking the whole budget
        return None, ""
    excess = policy.describe_excess(prediction) if policy.excess(prediction) else ""
    return prediction, excess and f"predicted over the budget: {excess}"


def _refusing(trainable: Any, guard: MemoryGuard) -> Any:
    """``trainable`` that first raises ``OverBudget`` for a config predicted over the budget."""

    def check(config: dict[str, Any]) -> None:
        _, why = _predict(policy_of(guard), config)
        if why:
            raise OverBudget(f"optuna-memprune refused this config before it started: {why}")

    if inspect.isclass(trainable):
        base: Any = trainable

        def setup(self: Any, config: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            check(config)
            return base.setup(self, config, *args, **kwargs)

        return type(base.__name__, (base,), {"setup": setup, "__module__": base.__module__})
    if not callable(trainable):
        raise TypeError(
            f"trainable must be a Tune function trainable or a tune.Trainable class, but got {trainable!r}."
        )

    @functools.wraps(trainable)
    def refusing(config: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        check(config)
        return trainable(config, *args, **kwargs)

    return refusing


__all__ = ["tune_with_resources", "OverBudget"]
