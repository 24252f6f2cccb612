"""Bad input to the estimators (issue 14): each is one ``EstimateError`` line naming the argument, with the
same ceilings and wording as ``memprune predict``'s params (``estimate.checks.CEILINGS``)."""

from __future__ import annotations

import pytest

from optuna_memprune.estimate import replay_buffer, rollout_buffer
from optuna_memprune.exceptions import EstimateError


def _one_line_error(call, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(EstimateError) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_a_buffer_size_beyond_any_machine_is_refused_with_the_items_ceiling() -> None:
    assert _one_line_error(replay_buffer, (4,), "float32", (1,), "int64", buffer_size=10**30) == (
        "buffer_size must be an int in [1, 2**50], but got 1e+30: more items of a byte or more would fill over "
        "1 PiB, more memory than any real machine has."
    )
    assert _one_line_error(rollout_buffer, (4,), "float32", (1,), "float32", n_steps=1e20).startswith(
        "n_steps must be an int in [1, 2**50], but got 1e+20"
    )
    assert _one_line_error(replay_buffer, (4,), "float32", (1,), "int64", buffer_size=100, batch_size=2**40) == (
        "batch_size must be an int in [1, 2**24], but got 1099511627776: a tensor with two such dimensions would "
        "hold over 2**48 elements, over 1 PiB in float32."
    )
    # Sizes as YAML files write them still pass, and so do numpy ints.
    np = pytest.importorskip("numpy")
    assert replay_buffer((4,), "float32", (1,), "int64", buffer_size=1e5).ram > 0
    assert replay_buffer((4,), "float32", (1,), "int64", buffer_size=np.int64(10**5)).ram > 0


def test_a_torch_batch_size_beyond_any_tensor_is_refused_with_the_dimension_ceiling() -> None:
    torch = pytest.importorskip("torch")
    from optuna_memprune.estimate import torch_training

    assert _one_line_error(torch_training, lambda: torch.nn.Linear(4, 2), (4,), batch_size=10**15) == (
        "batch_size must be an int in [1, 2**24], but got 1e+15: a tensor with two such dimensions would hold "
        "over 2**48 elements, over 1 PiB in float32."
    )
    assert _one_line_error(torch_training, lambda: torch.nn.Linear(4, 2), (4,), batch_size=2.5) == (
        "batch_size must be a positive int, but got 2.5."
    )


def test_an_input_shape_the_network_cannot_take_names_input_shape() -> None:
    torch = pytest.importorskip("torch")
    from optuna_memprune.estimate import torch_training

    message = _one_line_error(torch_training, lambda: torch.nn.Linear(4, 2), (8,), batch_size=8)
    assert message.startswith("tracing the network's step on the meta device failed: RuntimeError: "), message
    assert message.endswith("; check input_shape=(8,) against the network's first layer."), message


def test_a_switch_param_given_anything_but_a_bool_is_one_line_naming_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    from optuna_memprune.estimate.recipes.sb3 import sb3

    expected = "param 'optimize_memory_usage' must be True or False, but got 'maybe'."
    assert _one_line_error(sb3, "dqn", "CartPole-v1", {"optimize_memory_usage": "maybe"}) == expected
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "optuna_memprune.cli",
            "predict",
            "sb3",
            "--algo",
            "dqn",
            "--env",
            "CartPole-v1",
            "optimize_memory_usage=maybe",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MEMPRUNE_CACHE_DIR": str(tmp_path)},
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(expected), done.stderr
    assert "Traceback" not in done.stderr
