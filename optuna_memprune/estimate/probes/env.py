"""Probe: what one env instance and one SubprocVecEnv worker process cost, the env built as SB3 builds it.

Its env workers re-run this module as their main (same stack, ALE registered); knows nothing of the cache.
"""

from __future__ import annotations

import gc
import importlib
import os
import time
from typing import Any

from ...procfs import descendants, own_status, status
from . import emit, spec


def load_stack(args: dict[str, Any]) -> None:
    """Import what the trial's process imports, and register ALE's envs with Gymnasium where it is there."""
    for mod in args["imports"]:
        importlib.import_module(mod)
    import gymnasium as gym
    import numpy  # noqa: F401
    import stable_baselines3.common.env_util
    import stable_baselines3.common.vec_env  # noqa: F401

    try:
        import ale_py

        gym.register_envs(ale_py)
    except ImportError:  # not an Atari stack
        pass


def describe(s: Any) -> dict[str, Any]:
    """A Gymnasium space as plain data: type, shape, dtype, and n / nvec / sub-spaces."""
    import gymnasium as gym
    import numpy as np

    d: dict[str, Any] = {
        "type": type(s).__name__,
        "shape": list(s.shape or ()),
        "dtype": str(s.dtype) if s.dtype is not None else None,
    }
    if hasattr(s, "n") and not hasattr(s, "nvec"):
        d["n"] = int(s.n)
    if hasattr(s, "nvec"):
        d["nvec"] = [int(x) for x in np.ravel(s.nvec)]
    if isinstance(s, gym.spaces.Dict):
        d["spaces"] = {k: describe(v) for k, v in s.spaces.items()}
    return d


def main(args: dict[str, Any]) -> None:
    """Build 1 and then 3 more envs in this process (DummyVecEnv), then 2 SubprocVecEnv workers, measuring."""
    import numpy as np
    from stable_baselines3.common.env_util import make_atari_env, make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack

    def make(n: int, cls: type[DummyVecEnv] | type[SubprocVecEnv]) -> Any:
        if args["atari"]:
            env = make_atari_env(args["env_id"], n_envs=n, seed=0, vec_env_cls=cls)
        else:
            env = make_vec_env(args["env_id"], n_envs=n, seed=0, vec_env_cls=cls)
        if args["frame_stack"]:
            env = VecFrameStack(env, args["frame_stack"])
        return env

    def run(env: Any, steps: int) -> None:
        env.reset()
        for _ in range(steps):
            env.step(np.array([env.action_space.sample() for _ in range(env.num_envs)]))

    before = own_status()
    e1 = make(1, DummyVecEnv)
    run(e1, args["steps"])
    one = own_status()
    e3 = make(3, DummyVecEnv)
    run(e3, args["steps"])
    four = own_status()
    result: dict[str, Any] = {
        "before": before,
        "one": one,
        "four": four,
        "observation_space": describe(e1.observation_space),
        "action_space": describe(e1.action_space),
    }
    e1.close()
    e3.close()
    del e1, e3
    gc.collect()
    if args["subproc"]:
        me = os.getpid()
        main_before = own_status()
        sv = make(2, SubprocVecEnv)
        run(sv, args["steps"])
        during = {pid: status(pid) for pid in descendants(me)}
        main_during = own_status()
        sv.close()
        time.sleep(0.3)
        remaining = set(descendants(me))
        workers = [s for pid, s in during.items() if pid not in remaining and s]
        helpers = [s for pid, s in during.items() if pid in remaining and s]
        result["subproc"] = {
            "workers": workers,
            "helpers": helpers,
            "main_delta": main_during["VmRSS"] - main_before["VmRSS"],
        }
    emit(result)


if __name__ in ("__main__", "__mp_main__"):  # the probe, and each env worker re-running it as its main module
    SPEC = spec()
    load_stack(SPEC)
    if __name__ == "__main__":
        main(SPEC)
