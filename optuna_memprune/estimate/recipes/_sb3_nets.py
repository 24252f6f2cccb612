"""The SB3 recipe's networks: SB3's (and sb3-contrib's) own policy classes built on the meta device from the
trial's ``policy_kwargs``, and one training step of them traced (weights, gradients, optimizer state,
activations).

Owns which policy class each algo builds, which ``policy_kwargs`` it forwards, checks or only accepts, and
each algo's training step; knows nothing of buffers, envs, processes or rl-zoo3's names.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

from ..._extras import MissingExtra
from ...exceptions import EstimateError
from ..checks import check_count
from ..footprint import Footprint

#: rl-zoo3's names for net_arch choices (``hyperparams_opt.py``); on-policy algos read a list as pi and vf alike.
NET_ARCH = {
    "tiny": [64],
    "small": [64, 64],
    "medium": [256, 256],
    "big": [400, 300],
    "large": [256, 256, 256],
    "verybig": [512, 512, 512],
}
#: policy_kwargs forwarded to the policy class (it must take them; they may change the networks' memory).
FORWARDED = (
    "net_arch",
    "activation_fn",
    "n_quantiles",
    "n_critics",
    "features_extractor_kwargs",
    "share_features_extractor",
    "use_sde",
    "log_std_init",
    "use_expln",
    "squash_output",
    "full_std",
    "clip_mean",
    "ortho_init",
    "normalize_images",
)
#: policy_kwargs read by the recipe itself (the optimizer's state size), not forwarded.
OPTIMIZER = ("optimizer_class", "optimizer_kwargs")
#: algo -> (module, Cnn class, Mlp class); module "" is SB3's common policies.
_CLASSES = {
    "dqn": ("stable_baselines3.dqn.policies", "CnnPolicy", "DQNPolicy"),
    "qrdqn": ("sb3_contrib.qrdqn.policies", "CnnPolicy", "QRDQNPolicy"),
    "sac": ("stable_baselines3.sac.policies", "CnnPolicy", "SACPolicy"),
    "td3": ("stable_baselines3.td3.policies", "CnnPolicy", "TD3Policy"),
    "ddpg": ("stable_baselines3.td3.policies", "CnnPolicy", "TD3Policy"),
    "tqc": ("sb3_contrib.tqc.policies", "CnnPolicy", "TQCPolicy"),
    "ppo": ("stable_baselines3.common.policies", "ActorCriticCnnPolicy", "ActorCriticPolicy"),
    "a2c": ("stable_baselines3.common.policies", "ActorCriticCnnPolicy", "ActorCriticPolicy"),
    "trpo": ("stable_baselines3.common.policies", "ActorCriticCnnPolicy", "ActorCriticPolicy"),
}
_ARCH_KEYS = {
    "ppo": {"pi", "vf"},
    "a2c": {"pi", "vf"},
    "trpo": {"pi", "vf"},
    "sac": {"pi", "qf"},
    "td3": {"pi", "qf"},
    "ddpg": {"pi", "qf"},
    "tqc": {"pi", "qf"},
}
_build_lock = threading.Lock()


def net_arch(value: Any, algo: str) -> Any:
    """``net_arch`` as SB3 takes it for ``algo``: a list of widths, a dict of lists (``pi``/``vf`` on-policy,
    ``pi``/``qf`` for SAC, TD3, DDPG, TQC) or one of rl-zoo3's names; every width checked."""
    if value is None:
        return None
    if isinstance(value, str) and value in NET_ARCH:
        value = list(NET_ARCH[value])
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, dict) and algo in _ARCH_KEYS and set(value) <= _ARCH_KEYS[algo]:
        value = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in value.items()}
        widths = [w for v in value.values() for w in (v if isinstance(v, list) else [v])]
    elif isinstance(value, list):
        widths = value
    else:
        keys = f", a dict with keys {sorted(_ARCH_KEYS[algo])}" if algo in _ARCH_KEYS else ""
        raise EstimateError(
            f"param 'net_arch' of {algo} must be a list of layer widths{keys} or one of "
            f"{sorted(NET_ARCH)}, but got {value!r}."
        )
    for width in widths:
        check_count(width, "param 'net_arch' layer width", "dimension")
    return value


def activation_name(value: Any) -> str:
    """The ``torch.nn`` class name of an activation given as a class, ``"nn.ReLU"`` or rl-zoo3's ``"relu"``."""
    import torch.nn as nn

    zoo = {"tanh": "Tanh", "relu": "ReLU", "elu": "ELU", "leaky_relu": "LeakyReLU", "gelu": "GELU"}
    if isinstance(value, type):
        name = value.__name__ if value.__module__.startswith("torch.nn") else ""
    else:
        name = zoo.get(value, str(value).rpartition(".")[2]) if isinstance(value, str) else ""
    cls = getattr(nn, name, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise EstimateError(
            f"policy_kwargs 'activation_fn' must be a torch.nn activation (nn.ReLU, 'tanh', ...), but got {value!r}."
        )
    return name


def optimizer_of(algo: str, kwargs: Mapping[str, Any], use_rms_prop: bool) -> Any:
    """The optimizer SB3 gives ``algo`` (A2C: RMSprop unless ``use_rms_prop=False``), or the one
    ``optimizer_class`` names, as ``torchnet.torch_training`` takes it."""
    cls = kwargs.get("optimizer_class")
    if cls is None:
        return "rmsprop" if algo == "a2c" and use_rms_prop else "adam"
    name = (cls.__name__ if isinstance(cls, type) else str(cls).rpartition(".")[2]).lower()
    extra = kwargs.get("optimizer_kwargs") or {}
    if name in ("adam", "adamw", "rmsprop", "rmsproptflike"):
        return name[:7] if name.startswith("rmsprop") else name
    if name == "sgd":
        return ("sgd", {"momentum": float(extra.get("momentum", 0.0))})
    raise EstimateError(
        f"policy_kwargs 'optimizer_class' must be Adam, AdamW, RMSprop, RMSpropTFLike or SGD, but got {cls!r}."
    )


def policy_class(algo: str, cnn: bool) -> type[Any]:
    """The SB3 policy class ``algo`` builds (``cnn``: its CnnPolicy)."""
    import importlib

    module, cnn_name, mlp_name = _CLASSES[algo]
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:  # sb3-contrib's algorithms, or torch under either: names the extra
        raise (MissingExtra.of(exc, f"the sb3 recipe's {algo}") or exc) from None
    cls: type[Any] = getattr(mod, cnn_name if cnn else mlp_name)
    return cls


def check_forwarded(algo: str, cnn: bool, kwargs: Mapping[str, Any]) -> None:
    """``EstimateError`` for a forwarded policy kwarg that ``algo``'s policy class does not take."""
    taken = set(inspect.signature(policy_class(algo, cnn).__init__).parameters)
    wrong = sorted(k for k in kwargs if k not in taken)
    if wrong:
        raise EstimateError(f"policy_kwargs {wrong} are not parameters of {algo}'s {policy_class(algo, cnn).__name__}.")


@functools.lru_cache(maxsize=64)
def _policy_on_meta(algo: str, cnn: bool, obs_key: str, act_key: str, kwargs_key: str) -> Any:
    """SB3's policy class built on the meta device (its ``device`` property pinned to meta, so the
    ``.to(self.device)`` calls inside SB3 become no-ops); cached per architecture."""
    import gymnasium as gym
    import numpy as np
    import torch

    obs, act, kwargs = json.loads(obs_key), json.loads(act_key), json.loads(kwargs_key)
    shape = tuple(obs["shape"])
    if len(shape) == 3 and obs["dtype"] == "uint8" and shape[-1] < shape[0]:
        shape = (shape[-1], *shape[:-1])
    low, high = (0, 255) if obs["dtype"] == "uint8" else (-np.inf, np.inf)
    obs_space = gym.spaces.Box(low, high, shape, np.dtype(obs["dtype"]))
    act_space: gym.spaces.Space[Any]
    if act["type"] == "Discrete":
        act_space = gym.spaces.Discrete(act["n"])
    elif act["type"] == "MultiDiscrete":
        act_space = gym.spaces.MultiDiscrete(act["nvec"])
    elif act["type"] == "MultiBinary":
        act_space = gym.spaces.MultiBinary(act["shape"][0])
    else:
        act_space = gym.spaces.Box(-1.0, 1.0, tuple(act["shape"]), np.float32)
    cls = policy_class(algo, cnn)
    meta_cls = type("Meta" + cls.__name__, (cls,), {"device": property(lambda self: torch.device("meta"))})
    if "activation_fn" in kwargs:
        kwargs["activation_fn"] = getattr(torch.nn, kwargs["activation_fn"])
    with _build_lock, torch.device("meta"):
        return meta_cls(obs_space, act_space, lambda _: 1e-4, **kwargs)


class Networks(TypedDict):
    """The policy built on meta and its cache key (algo, cnn, then the spaces and kwargs as JSON)."""

    policy: Any
    key: tuple[str, bool, str, str, str]


def networks(algo: str, cnn: bool, obs: dict[str, Any], act: dict[str, Any], kwargs: Mapping[str, Any]) -> Networks:
    """The policy of ``algo`` on meta with the forwarded ``kwargs`` (JSON-able: activation by name), and its
    cache key."""
    key = (
        algo,
        cnn,
        json.dumps(obs, sort_keys=True),
        json.dumps(act, sort_keys=True),
        json.dumps(dict(kwargs), sort_keys=True),
    )
    try:
        policy = _policy_on_meta(*key)
    except (TypeError, ValueError, KeyError, AssertionError) as exc:
        raise EstimateError(f"SB3 could not build a {algo} policy with policy_kwargs={dict(kwargs)!r}: {exc}") from exc
    return {"policy": policy, "key": key}


def train_step(
    algo: str,
    nets: Networks,
    obs_shape: tuple[int, ...],
    obs_dtype: str,
    act_shape: tuple[int, ...],
    batch: int,
    device: str,
    optimizer: Any,
) -> Footprint:
    """The networks' weights, gradients, optimizer state and one training step's activations (traced)."""
    import torch.nn as nn

    from ..torchnet.api import torch_training

    policy, key = nets["policy"], nets["key"]

    class _Eval(nn.Module):
        """What PPO/A2C/TRPO differentiate: features -> policy logits and value (distribution math is O(B))."""

        def __init__(self, p: Any) -> None:
            super().__init__()
            self.p = p

        def forward(self, x: Any) -> tuple[Any, Any]:
            lp, lv = self.p.mlp_extractor(self.p.extract_features(x))
            return self.p.action_net(lp), self.p.value_net(lv)

    class _Actor(nn.Module):
        """SAC's/TQC's actor up to the distribution's parameters (its Normal would validate values: .item())."""

        def __init__(self, actor: Any) -> None:
            super().__init__()
            self.actor = actor

        def forward(self, x: Any) -> tuple[Any, Any]:
            mean, log_std, _ = self.actor.get_action_dist_params(x)
            return mean, log_std

    class _Critic(nn.Module):
        def __init__(self, critic: Any) -> None:
            super().__init__()
            self.critic = critic

        def forward(self, x: Any, a: Any) -> Any:
            return self.critic(x, a)

    act_dim = max(1, math.prod(act_shape)) if act_shape else 1
    models: dict[str, Callable[[], Any]]
    frozen: int | dict[str, int]
    shapes: list[tuple[int, ...]] | dict[str, list[tuple[int, ...]]]
    if algo in ("dqn", "qrdqn"):
        q_net = policy.quantile_net if algo == "qrdqn" else policy.q_net
        models, frozen, shapes = {"q_net": lambda: q_net}, {"q_net": 1}, [obs_shape]
    elif algo in ("ppo", "a2c", "trpo"):
        models, frozen, shapes = {"policy": lambda: _Eval(policy)}, 0, [obs_shape]
    else:
        actor = (lambda: _Actor(policy.actor)) if algo in ("sac", "tqc") else (lambda: policy.actor)
        models = {"actor": actor, "critic": lambda: _Critic(policy.critic)}
        frozen = {"critic": 1, "actor": 1 if algo in ("td3", "ddpg") else 0}
        shapes = {"actor": [obs_shape], "critic": [obs_shape, (act_dim,)]}
    return torch_training(
        models,
        shapes,
        batch_size=batch,
        input_dtype=obs_dtype,
        optimizer=optimizer,
        frozen=frozen,
        device=device,
        cache_key=("sb3", str(optimizer)) + key,
        name=algo,
    )
