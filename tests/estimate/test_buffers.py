"""The buffers package as a whole: its errors name the argument and value, it is exported lazily and pure,
and every module's examples run (one test file per module: test_buffers_layouts, _fill, _sb3, _deque)."""

from __future__ import annotations

import doctest

import pytest
from _buffers_common import ATARI_OBS, run_python

from optuna_memprune.estimate.buffers import (
    array,
    deque,
    deque_buffer,
    fill,
    frame_stack,
    layouts,
    replay_buffer,
    rollout_buffer,
    sb3,
    sb3_dict_replay_layout,
)
from optuna_memprune.exceptions import EstimateError


def bad(call, *words: str) -> None:
    with pytest.raises(ValueError) as info:
        call()
    assert isinstance(info.value, EstimateError)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_bad_input_names_argument_and_value() -> None:
    atari = (ATARI_OBS, "uint8", (), "int64")
    bad(lambda: replay_buffer(*atari, buffer_size=0), "buffer_size", "0")
    bad(lambda: replay_buffer(*atari, buffer_size=-5), "buffer_size", "-5")
    bad(lambda: replay_buffer(*atari, buffer_size=1.5), "buffer_size", "1.5")
    bad(lambda: replay_buffer(*atari, buffer_size=10, n_envs=0), "n_envs", "0")
    bad(lambda: replay_buffer(ATARI_OBS, "uint9", (), "int64", buffer_size=10), "obs_dtype", "uint9")
    bad(lambda: replay_buffer(ATARI_OBS, None, (), "int64", buffer_size=10), "obs_dtype", "None")
    bad(lambda: replay_buffer(ATARI_OBS, "uint8", (), object, buffer_size=10), "action_dtype")
    bad(lambda: replay_buffer((4, 0), "uint8", (), "int64", buffer_size=10), "obs_shape", "(4, 0)")
    bad(lambda: replay_buffer(*atari, buffer_size=10, steps=-1), "steps", "-1")
    bad(lambda: replay_buffer(*atari, buffer_size=10, optimize_memory_usage=True), "handle_timeout_termination")
    bad(lambda: replay_buffer(*atari, buffer_size=10, batch_size=0), "batch_size", "0")
    bad(lambda: replay_buffer(*atari, buffer_size=10, device="tpu"), "device", "tpu")
    bad(lambda: replay_buffer(*atari, buffer_size=10, dict_obs={"a": ((2,), "float32")}), "dict_obs", "obs_shape")
    bad(
        lambda: sb3_dict_replay_layout(
            {"a": ((2,), "float32")}, (), "int64", buffer_size=10, optimize_memory_usage=True
        ),
        "optimize_memory_usage",
    )
    bad(lambda: sb3_dict_replay_layout({"a": (2,)}, (), "int64", buffer_size=10), "obs_spaces['a']")
    bad(lambda: rollout_buffer(*atari, n_steps=0), "n_steps", "0")
    bad(lambda: rollout_buffer(*atari, n_steps=8, n_envs=True), "n_envs", "True")
    bad(lambda: deque_buffer([((4,), "float32"), "reward"], maxlen=10), "transition[1]", "reward")
    bad(lambda: deque_buffer([], maxlen=10), "transition", "[]")
    bad(lambda: deque_buffer([float], maxlen=0), "maxlen", "0")
    bad(lambda: deque_buffer([float], maxlen=10, overheads={"float": 24}), "overheads")
    bad(lambda: array((4,), "float32", touched=1.5), "touched", "1.5")
    bad(lambda: frame_stack((84, 84, 1), 0), "n_stack", "0")


def test_exported_lazily_and_pure() -> None:
    from optuna_memprune import estimate

    assert estimate.replay_buffer is replay_buffer and estimate.deque_buffer is deque_buffer
    out = run_python("""
        import json, sys
        import optuna_memprune.estimate.buffers
        print(json.dumps({"mods": sorted(m for m in ("torch", "psutil", "optuna", "gymnasium") if m in sys.modules)}))
    """)
    assert out["mods"] == []


@pytest.mark.parametrize("module", [layouts, fill, sb3, deque], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_docstring_examples_run(module: object) -> None:
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0
