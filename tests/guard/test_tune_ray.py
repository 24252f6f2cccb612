"""``omp.tune_with_resources`` on a real Ray Tune run on a one-machine Ray cluster started here: each trial
placed with the resources its footprint predicts (read back inside the trial from Ray's runtime context), and
a config predicted over the budget refused with the reason before it allocates anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import optuna_memprune as omp

MiB, GiB = 2**20, 2**30
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]


def footprint(params: dict) -> omp.Footprint:
    return omp.Footprint.of(ram=(150 + params["mb"]) * MiB, threads=params["threads"])


def train(config: dict) -> None:
    import ray
    from ray import tune

    block = np.ones(config["mb"] * MiB, dtype=np.uint8)
    assigned = ray.get_runtime_context().get_assigned_resources()
    tune.report({"memory": assigned.get("memory", 0.0), "cpu": assigned.get("CPU", 0.0), "held": int(block[0])})


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[test]')")
    ray.init(  # the workers import this module's trainable, as a user's cluster has the user's code installed
        address="local",
        num_cpus=3,
        object_store_memory=80 * MiB,
        include_dashboard=False,
        logging_level="error",
        runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).parent)}},
    )
    try:
        yield
    finally:
        ray.shutdown()


def test_tune_trials_ask_for_their_predicted_memory_and_threads_and_one_over_budget_is_refused(
    ray_cluster: None, tmp_path: Path
) -> None:
    from ray import tune

    guard = omp.MemoryGuard(footprint, omp.Budget(ram="1GiB", threads=4))
    tuner = tune.Tuner(
        omp.tune_with_resources(train, guard),
        param_space={"mb": tune.grid_search([40, 200, 3000]), "threads": 2},
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="t", verbose=0),
    )
    results = {r.config["mb"]: r for r in tuner.fit()}
    for mb in (40, 200):
        assert results[mb].error is None, results[mb].error
        assert results[mb].metrics["memory"] == (150 + mb) * MiB  # the prediction, as Ray's memory resource
        assert results[mb].metrics["cpu"] == 2.0 and results[mb].metrics["held"] == 1  # its predicted threads
    error = str(results[3000].error)
    assert "optuna-memprune refused this config before it started: predicted over the budget: RAM" in error
    assert "OverBudget" in error


def test_resources_of_a_config_and_what_cannot_be_guarded(ray_cluster: None) -> None:
    guard = omp.MemoryGuard(footprint, omp.Budget(ram="1GiB"))
    wrapped = omp.tune_with_resources(train, guard)
    # Tune's resources of one config: 1 CPU without a thread budget, no GPU on a cluster without GPUs
    assert wrapped._resources({"mb": 100, "threads": 8}).bundles == [{"CPU": 1.0, "memory": 250.0 * MiB}]
    assert wrapped._resources({"mb": 5000, "threads": 1}).bundles == [{"CPU": 1.0}]  # refused at its start
    # a class trainable: refused in its setup, before it holds anything
    from ray import tune

    class Hold(tune.Trainable):
        def setup(self, config: dict) -> None:
            self.block = np.ones(config["mb"] * MiB, dtype=np.uint8)

        def step(self) -> dict:
            return {"held": int(self.block[0])}

    wrapped_class = omp.tune_with_resources(Hold, guard)
    trainable = wrapped_class(config={"mb": 10, "threads": 1})
    assert trainable.train()["held"] == 1
    trainable.stop()
    with pytest.raises(omp.OverBudget, match=r"predicted over the budget: RAM 5\.03 GiB > 921\.60 MiB"):
        wrapped_class(config={"mb": 5000, "threads": 1})
    with pytest.raises(ValueError, match="tune_with_resources needs a guard with a footprint"):
        omp.tune_with_resources(train, omp.MemoryGuard(None, omp.Budget(ram="1GiB")))
    with pytest.raises(ValueError, match="gpu_memory_bytes must be None or a positive int of bytes, but got -1"):
        omp.tune_with_resources(train, guard, gpu_memory_bytes=-1)
    with pytest.raises(TypeError, match="trainable must be a Tune function trainable or a tune.Trainable class"):
        omp.tune_with_resources("train", guard)
