"""The SB3 recipe: a Stable-Baselines3 run's footprint (DQN, QR-DQN, PPO, A2C, SAC, TD3) from rl-zoo3 params.

SB3's own policies built on the meta device, env calibrated once, buffers and process added; knows no Optuna.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import importlib
import math
import threading
from typing import Any, Mapping

from ...exceptions import EstimateError
from ..baselines import EnvProfile
from ..buffers import replay_buffer, rollout_buffer
from ..calibration import Calibration, load
from ..checks import check_count, check_total
from ..footprint import Footprint
from ..processes import Stack, env_instances, env_workers, process

#: Libraries whose versions key this recipe's calibrated stacks and env profiles.
VERSIONED = ("stable-baselines3", "sb3-contrib", "gymnasium", "ale-py", "opencv-python-headless")


def sb3_imports(atari: bool) -> tuple[str, ...]:
    """What a process training SB3 imports (Atari adds ALE and OpenCV): the stack its baseline is."""
    return ("torch", "stable_baselines3", "gymnasium") + (("ale_py", "cv2") if atari else ())


#: The stacks this recipe's processes load, by the names ``process()`` takes; ``memprune calibrate``
#: measures each of them.
STACKS = {
    "sb3": Stack(sb3_imports(atari=False), VERSIONED),
    "sb3-atari": Stack(sb3_imports(atari=True), VERSIONED),
}
#: One line for ``memprune predict --help``.
HELP = "Stable-Baselines3 (dqn, qrdqn, ppo, a2c, sac, td3) with rl-zoo3-style params"

#: algo -> (family, the defaults SB3 uses for the memory params when a trial leaves them out)
ALGOS: dict[str, tuple[str, dict[str, Any]]] = {
    "dqn": ("offpolicy", {"buffer_size": 1_000_000, "batch_size": 32, "optimize_memory_usage": False}),
    "qrdqn": ("offpolicy", {"buffer_size": 1_000_000, "batch_size": 32, "optimize_memory_usage": False}),
    "sac": ("offpolicy", {"buffer_size": 1_000_000, "batch_size": 256, "optimize_memory_usage": False}),
    "td3": ("offpolicy", {"buffer_size": 1_000_000, "batch_size": 256, "optimize_memory_usage": False}),
    "ppo": ("onpolicy", {"n_steps": 2048, "batch_size": 64}),
    "a2c": ("onpolicy", {"n_steps": 5}),
}
_KNOWN_PARAMS = {
    "buffer_size", "batch_size", "n_steps", "optimize_memory_usage", "net_arch", "n_quantiles",
    "torch_threads", "learning_starts", "gradient_steps", "train_freq", "n_epochs", "learning_rate", "gamma",
    "tau", "target_update_interval", "exploration_fraction", "exploration_final_eps", "ent_coef", "vf_coef",
    "max_grad_norm", "gae_lambda", "clip_range", "activation_fn", "ortho_init", "policy_delay",
    "target_policy_noise", "use_sde", "sde_sample_freq", "normalize_advantage", "handle_timeout_termination",
    "total_timesteps", "n_timesteps", "policy", "features_dim",
}
_NET_ARCH = {  # rl-zoo3's names for net_arch choices
    "tiny": [64], "small": [64, 64], "medium": [256, 256], "big": [400, 300], "large": [256, 256, 256],
    "verybig": [512, 512, 512],
}
_build_lock = threading.Lock()


def is_atari(env_id: str) -> bool:
    """Whether SB3 builds ``env_id`` with its Atari wrappers (84x84 grey)."""
    return env_id.startswith("ALE/") or "NoFrameskip" in env_id


def check_env(env_id: object) -> str:
    """``env_id`` if Gymnasium knows it (ALE's envs registered first for an Atari id, the module of a
    ``module:Env-v0`` id imported), else ``EstimateError`` "unknown env id" with close matches: checked before
    any probe is started for it."""
    if not isinstance(env_id, str) or not env_id.strip():
        raise EstimateError(f"env_id must be a Gymnasium env id such as 'CartPole-v1', but got {env_id!r}.")
    try:
        import gymnasium as gym
    except ImportError:
        raise EstimateError("the sb3 recipe needs gymnasium: pip install stable-baselines3") from None
    if is_atari(env_id):
        try:
            import ale_py
        except ImportError:
            raise EstimateError(f"env id {env_id!r} is an Atari env: pip install ale-py") from None
        gym.register_envs(ale_py)
    from gymnasium.envs.registration import find_highest_version, parse_env_id

    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EstimateError(f"unknown env id {env_id!r}: its module {module!r} cannot be imported "
                                f"({exc}).") from None
    if name in gym.registry:
        return env_id
    try:  # an id without a version means its latest version, as gymnasium.make reads it
        namespace, base, version = parse_env_id(name)
        if version is None and find_highest_version(namespace, base) is not None:
            return env_id
    except gym.error.Error:  # not even shaped like an id
        pass
    close = difflib.get_close_matches(name, list(gym.registry), n=3)
    raise EstimateError(f"unknown env id {env_id!r}: not in Gymnasium's registry"
                        + (f" (close matches: {', '.join(map(repr, close))})" if close else "") + ".")


def env_profile(env_id: str, frame_stack: int | None, calibration: Calibration | None = None) -> EnvProfile:
    """``env_id`` as SB3 builds it (its spaces, one instance, one worker process), measured once per host."""
    check_env(env_id)
    if frame_stack is not None:
        check_count(frame_stack, "frame_stack", "dimension")
    atari = is_atari(env_id)
    stack = STACKS["sb3-atari" if atari else "sb3"]
    return (calibration or load()).env(env_id, atari=atari, frame_stack=frame_stack, imports=stack.imports,
                                       versioned=stack.versioned)


def calibrate_env(env_id: str, calibration: Calibration | None = None) -> EnvProfile:
    """What ``memprune calibrate --env`` measures: ``env_id`` as the zoo trains it (Atari: 4 frames stacked)."""
    return env_profile(env_id, 4 if is_atari(env_id) else None, calibration)


#: The memory params (those that size an array or a tensor) and the kind of value each is (``checks.CEILINGS``).
_COUNTS = {"buffer_size": "items", "n_steps": "items", "total_timesteps": "items", "n_timesteps": "items",
           "batch_size": "dimension", "n_quantiles": "dimension", "features_dim": "dimension",
           "torch_threads": "processes"}
#: The memory params that are switches: ``bool()`` of any other value (the text "maybe") would be a guess.
_FLAGS = ("optimize_memory_usage",)


def _check_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The memory params checked (each an int within its kind's ceiling; ``net_arch`` widths too), the rest as
    given; before any probe runs."""
    out = dict(params)
    for name, kind in _COUNTS.items():
        if out.get(name) is not None:
            out[name] = check_count(out[name], f"param {name!r}", kind)
    for name in _FLAGS:
        value = out.get(name)
        if value is not None and type(value).__name__ not in ("bool", "bool_"):  # numpy's too
            raise EstimateError(f"param {name!r} must be True or False, but got {value!r}.")
    arch = _net_arch(out.get("net_arch"))
    layers = arch if isinstance(arch, list) else [w for v in (arch or {}).values()
                                                  for w in (v if isinstance(v, list) else [v])]
    for width in layers:
        check_count(width, "param 'net_arch' layer width", "dimension")
    out["net_arch"] = arch
    return out


def _positive_int(params: Mapping[str, Any], name: str, default: Any) -> int:
    return check_count(params.get(name, default), f"param {name!r}", _COUNTS[name])


def _net_arch(value: Any) -> Any:
    if value is None or isinstance(value, (list, dict)):
        return value
    if isinstance(value, str) and value in _NET_ARCH:
        return list(_NET_ARCH[value])
    raise EstimateError(f"param 'net_arch' must be a list of layer widths, a dict or one of "
                        f"{sorted(_NET_ARCH)}, but got {value!r}.")


def sb3(
    algo: str,
    env_id: str,
    params: Mapping[str, Any],
    *,
    n_envs: int = 1,
    frame_stack: int | None = None,
    vec_env: str = "dummy",
    device: str = "cpu",
    calibration: Calibration | None = None,
) -> Footprint:
    """The peak footprint of training ``algo`` on ``env_id`` with rl-zoo3-style ``params``.

    Args:
        algo: one of ``dqn``, ``qrdqn``, ``ppo``, ``a2c``, ``sac``, ``td3``.
        env_id: a Gymnasium id; ``ALE/...`` ids get SB3's Atari wrappers (84x84 grey).
        params: the trial's params: ``buffer_size``, ``batch_size``, ``n_steps``, ``optimize_memory_usage``,
            ``net_arch`` (list, dict or an rl-zoo3 name), ``n_quantiles``, ``torch_threads``,
            ``total_timesteps`` (the replay buffer then holds ``min(total_timesteps, buffer_size)``
            transitions at the peak; otherwise it is assumed full), and the rest of the zoo's names
            (accepted; they do not change memory).
        n_envs: parallel envs (``n_envs`` of the zoo's yml file).
        frame_stack: ``VecFrameStack`` depth (a positive int), or None.

    Every count is checked against its kind's ceiling (``checks.CEILINGS``) and the env id against Gymnasium's
    registry before anything is measured; a total over 1 PiB is an error (beyond any real machine).
        vec_env: ``"dummy"`` (envs in the trial's process) or ``"subproc"`` (one worker process each).
        device: ``"cpu"`` (networks in RAM) or ``"cuda"`` (networks in VRAM through the allocator model).

    Example:
        >>> fp = sb3("dqn", "ALE/Pong-v5", {"buffer_size": 100_000, "batch_size": 32}, frame_stack=4)
        >>> print(fp.table())   # doctest: +SKIP
    """
    algo = algo.lower()
    if algo not in ALGOS:
        raise EstimateError(f"algo must be one of {sorted(ALGOS)}, but got {algo!r}.")
    if vec_env not in ("dummy", "subproc"):
        raise EstimateError(f"vec_env must be 'dummy' or 'subproc', but got {vec_env!r}.")
    if device not in ("cpu", "cuda"):
        raise EstimateError(f"device must be 'cpu' or 'cuda', but got {device!r}.")
    check_count(n_envs, "n_envs", "processes")
    unknown = set(params) - _KNOWN_PARAMS
    if unknown:
        raise EstimateError(f"unknown SB3 param(s) {sorted(unknown)} for {algo}; known: {sorted(_KNOWN_PARAMS)}.")
    params = _check_params(params)
    family, defaults = ALGOS[algo]
    cal = calibration or load()
    profile = env_profile(env_id, frame_stack, cal)
    obs, act = profile.observation_space, profile.action_space
    if obs["type"] != "Box" or act["type"] not in ("Discrete", "Box", "MultiDiscrete", "MultiBinary"):
        raise EstimateError(f"{env_id}: observation space {obs['type']} / action space {act['type']} "
                            "is not supported by the sb3 recipe yet.")
    if algo in ("dqn", "qrdqn") and act["type"] != "Discrete":
        raise EstimateError(f"{algo} needs a Discrete action space; {env_id} has {act['type']}.")
    if algo in ("sac", "td3") and act["type"] != "Box":
        raise EstimateError(f"{algo} needs a Box action space; {env_id} has {act['type']}.")

    image = len(obs["shape"]) == 3 and obs["dtype"] == "uint8"
    obs_shape = tuple(obs["shape"])
    if image and obs_shape[-1] < obs_shape[0]:  # SB3 transposes channels-last images (VecTransposeImage)
        obs_shape = (obs_shape[-1], *obs_shape[:-1])
    act_shape = tuple(act["shape"]) if act["type"] != "Discrete" else ()
    act_dtype = act["dtype"] or "int64"

    torch_threads = params.get("torch_threads")
    stack = STACKS["sb3-atari" if profile.atari else "sb3"]
    if algo == "qrdqn":
        stack = Stack(stack.imports + ("sb3_contrib",), stack.versioned)
    parts = [process(stack, torch_threads=torch_threads, calibration=cal)]
    parts.append(env_instances(profile, n_envs) if vec_env == "dummy" else env_workers(profile, n_envs))

    net_arch = params.get("net_arch")
    nets = _networks(algo, obs, act, obs_shape, net_arch, params)
    if family == "offpolicy":
        batch = _positive_int(params, "batch_size", defaults["batch_size"])
        buffer_size = _positive_int(params, "buffer_size", defaults["buffer_size"])
        omu = bool(params.get("optimize_memory_usage", defaults["optimize_memory_usage"]))
        total = params.get("total_timesteps", params.get("n_timesteps"))
        steps = None if total is None else min(int(total), buffer_size)
        parts.append(replay_buffer(obs_shape, obs["dtype"], act_shape, act_dtype, buffer_size=buffer_size,
                                   n_envs=n_envs, optimize_memory_usage=omu,
                                   handle_timeout_termination=not omu, steps=steps, batch_size=batch,
                                   device=device))
    else:
        n_steps = _positive_int(params, "n_steps", defaults["n_steps"])
        rollout = n_steps * n_envs
        batch = rollout if algo == "a2c" and "batch_size" not in params else \
            _positive_int(params, "batch_size", defaults["batch_size"])
        parts.append(rollout_buffer(obs_shape, obs["dtype"], act_shape, act_dtype, n_steps=n_steps,
                                    n_envs=n_envs, batch_size=None if algo == "a2c" else batch, device=device))
    parts.append(_train_step(algo, nets, obs_shape, obs["dtype"], act_shape, batch, device))
    fp = sum(parts, Footprint())
    hint = "buffer_size, n_steps, batch_size, n_envs, frame_stack and net_arch"
    check_total(fp.ram, f"the predicted RAM of {algo} on {env_id}", hint)
    check_total(fp.vram, f"the predicted VRAM of {algo} on {env_id}", hint)
    return fp


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``memprune predict sb3`` (the params come as ``name=value`` words)."""
    parser.add_argument("--algo", required=True, help="dqn, qrdqn, ppo, a2c, sac or td3")
    parser.add_argument("--env", required=True, help="Gymnasium env id, e.g. ALE/Pong-v5")
    parser.add_argument("--n-envs", type=int, default=1)
    parser.add_argument("--frame-stack", type=int, default=None)
    parser.add_argument("--vec-env", choices=["dummy", "subproc"], default="dummy")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")


def from_args(args: argparse.Namespace, params: dict[str, Any]) -> tuple[str, Footprint]:
    """``memprune predict sb3``: a title line and the footprint of the parsed options and params."""
    fp = sb3(args.algo, args.env, params, n_envs=args.n_envs, frame_stack=args.frame_stack,
             vec_env=args.vec_env, device=args.device)
    return f"sb3 {args.algo} on {args.env} " + " ".join(f"{k}={v}" for k, v in params.items()), fp


@functools.lru_cache(maxsize=64)
def _policy_on_meta(algo: str, obs_key: str, act_key: str, arch_key: str, extra_key: str):
    """SB3's policy class built on the meta device (its ``device`` property pinned to meta, so the
    ``.to(self.device)`` calls inside SB3 become no-ops); cached per architecture."""
    import json

    import gymnasium as gym
    import numpy as np
    import torch

    obs, act = json.loads(obs_key), json.loads(act_key)
    net_arch, extra = json.loads(arch_key), json.loads(extra_key)
    shape = tuple(obs["shape"])
    if len(shape) == 3 and obs["dtype"] == "uint8" and shape[-1] < shape[0]:
        shape = (shape[-1], *shape[:-1])
    low, high = (0, 255) if obs["dtype"] == "uint8" else (-np.inf, np.inf)
    obs_space = gym.spaces.Box(low, high, shape, np.dtype(obs["dtype"]))
    if act["type"] == "Discrete":
        act_space = gym.spaces.Discrete(act["n"])
    elif act["type"] == "MultiDiscrete":
        act_space = gym.spaces.MultiDiscrete(act["nvec"])
    elif act["type"] == "MultiBinary":
        act_space = gym.spaces.MultiBinary(act["shape"][0])
    else:
        act_space = gym.spaces.Box(-1.0, 1.0, tuple(act["shape"]), np.float32)
    image = len(shape) == 3 and obs["dtype"] == "uint8"
    if algo == "qrdqn":
        from sb3_contrib.qrdqn.policies import CnnPolicy as Cnn, QRDQNPolicy as Mlp
    elif algo == "dqn":
        from stable_baselines3.dqn.policies import CnnPolicy as Cnn, DQNPolicy as Mlp
    elif algo == "sac":
        from stable_baselines3.sac.policies import CnnPolicy as Cnn, SACPolicy as Mlp
    elif algo == "td3":
        from stable_baselines3.td3.policies import CnnPolicy as Cnn, TD3Policy as Mlp
    else:
        from stable_baselines3.common.policies import ActorCriticCnnPolicy as Cnn, ActorCriticPolicy as Mlp
    cls = Cnn if image else Mlp
    meta_cls = type("Meta" + cls.__name__, (cls,), {"device": property(lambda self: torch.device("meta"))})
    kwargs: dict[str, Any] = {}
    if net_arch is not None:
        kwargs["net_arch"] = net_arch
    kwargs.update(extra)
    with _build_lock, torch.device("meta"):
        policy = meta_cls(obs_space, act_space, lambda _: 1e-4, **kwargs)
    return policy


def _networks(algo, obs, act, obs_shape, net_arch, params) -> dict:
    import json

    extra = {}
    if algo == "qrdqn" and "n_quantiles" in params:
        extra["n_quantiles"] = int(params["n_quantiles"])
    if "features_dim" in params:
        extra["features_extractor_kwargs"] = {"features_dim": int(params["features_dim"])}
    try:
        policy = _policy_on_meta(algo, json.dumps(obs, sort_keys=True), json.dumps(act, sort_keys=True),
                                 json.dumps(net_arch, sort_keys=True), json.dumps(extra, sort_keys=True))
    except (TypeError, ValueError, KeyError) as exc:
        raise EstimateError(f"SB3 could not build a {algo} policy with net_arch={net_arch!r}: {exc}") from exc
    return {"policy": policy, "key": (algo, json.dumps(obs, sort_keys=True), json.dumps(act, sort_keys=True),
                                      json.dumps(net_arch, sort_keys=True), json.dumps(extra, sort_keys=True))}


def _train_step(algo, nets, obs_shape, obs_dtype, act_shape, batch, device) -> Footprint:
    """The networks' weights, gradients, optimizer state and one training step's activations (traced)."""
    import torch.nn as nn

    from ..torchnet import torch_training

    policy, key = nets["policy"], nets["key"]

    class _Eval(nn.Module):
        """What PPO/A2C differentiate: features -> policy logits and value (distribution math is O(B))."""

        def __init__(self, p):
            super().__init__()
            self.p = p

        def forward(self, x):
            lp, lv = self.p.mlp_extractor(self.p.extract_features(x))
            return self.p.action_net(lp), self.p.value_net(lv)

    class _Actor(nn.Module):
        """SAC's actor up to the distribution's parameters (its Normal would validate values: .item())."""

        def __init__(self, actor):
            super().__init__()
            self.actor = actor

        def forward(self, x):
            mean, log_std, _ = self.actor.get_action_dist_params(x)
            return mean, log_std

    class _Critic(nn.Module):
        def __init__(self, critic):
            super().__init__()
            self.critic = critic

        def forward(self, x, a):
            return self.critic(x, a)

    act_dim = max(1, math.prod(act_shape)) if act_shape else 1
    if algo in ("dqn", "qrdqn"):
        q_net = policy.quantile_net if algo == "qrdqn" else policy.q_net
        models, frozen, shapes = {"q_net": lambda: q_net}, {"q_net": 1}, [obs_shape]
    elif algo in ("ppo", "a2c"):
        models, frozen, shapes = {"policy": lambda: _Eval(policy)}, 0, [obs_shape]
    else:
        actor = (lambda: _Actor(policy.actor)) if algo == "sac" else (lambda: policy.actor)
        models = {"actor": actor, "critic": lambda: _Critic(policy.critic)}
        frozen = {"critic": 1, "actor": 1 if algo == "td3" else 0}
        shapes = {"actor": [obs_shape], "critic": [obs_shape, (act_dim,)]}
    return torch_training(
        models, shapes, batch_size=batch, input_dtype=obs_dtype, optimizer="adam", frozen=frozen,
        device=device, cache_key=("sb3",) + key, name=algo,
    )
