"""rl-zoo3's files and names, read without running it: the algos the recipe models, the zoo's fixed
hyperparameters (its installed ``hyperparams/<algo>.yml``, as ``ExperimentManager.read_hyperparameters``
picks a section), its sampled names and their mappings to SB3's, ``-params key:value`` text, and the checks of
an algo, of param names and of the env wrappers a yml names.

Knows no Optuna, imports neither rl-zoo3 nor torch, and builds no footprint (``rlzoo3.py``, which re-exports
the public names here).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from ...exceptions import EstimateError
from ..checks import check_count
from . import sb3 as sb3_recipe
from .kwargs_text import read_kwargs, read_value

__all__ = [
    "ALGOS",
    "MANAGER",
    "SAMPLED",
    "check_algo",
    "check_names",
    "check_wrappers",
    "fixed_hyperparams",
    "hyperparams_file",
    "read_params",
    "zoo_to_sb3",
]

#: The algos rl-zoo3 tunes that the SB3 recipe models.
ALGOS = ("dqn", "qrdqn", "ppo", "a2c", "trpo", "sac", "td3", "ddpg", "tqc")
_ON_POLICY_ARCH = {
    "tiny": {"pi": [64], "vf": [64]},
    "small": {"pi": [64, 64], "vf": [64, 64]},
    "medium": {"pi": [256, 256], "vf": [256, 256]},
}
#: rl-zoo3's sampled names (``hyperparams_opt.py``) that are not SB3's; their mapping is in ``zoo_to_sb3``.
SAMPLED = (
    "batch_size_pow",
    "n_steps_pow",
    "one_minus_gamma",
    "one_minus_gae_lambda",
    "subsample_steps",
    "noise_type",
    "noise_std",
    "n_sampled_goal",
    "goal_selection_strategy",
)
#: yml keys the zoo's manager takes for itself (``_preprocess_hyperparams``), never passed to SB3.
MANAGER = (
    "n_envs",
    "n_timesteps",
    "frame_stack",
    "env_wrapper",
    "normalize",
    "vec_env_wrapper",
    "callback",
    "monitor_kwargs",
    "env_kwargs",
)
_SAME_OBS_WRAPPERS = ("rl_zoo3.wrappers.FrameSkip",)  # wrappers that leave the observation as it is
_ATARI_WRAPPER = "stable_baselines3.common.atari_wrappers.AtariWrapper"
_ATARI_SAME_OBS = {"noop_max", "frame_skip", "terminal_on_life_loss", "clip_reward", "action_repeat_probability"}


def hyperparams_file(algo: str) -> Path:
    """rl-zoo3's own ``hyperparams/<algo>.yml``, found without importing rl-zoo3 (``EstimateError`` if it is
    not installed)."""
    algo = check_algo(algo)
    spec = find_spec("rl_zoo3")
    if spec is None or not spec.submodule_search_locations:
        raise EstimateError("the rlzoo3 recipe reads rl-zoo3's hyperparameter files: pip install rl-zoo3")
    return Path(list(spec.submodule_search_locations)[0]) / "hyperparams" / f"{algo}.yml"


def fixed_hyperparams(algo: str, env_id: str, path: str | Path | None = None) -> dict[str, Any]:
    """The hyperparameters rl-zoo3 fixes for ``algo`` on ``env_id``: the env's section of the yml file, else
    ``atari`` for an Atari env, else ``default`` (``read_hyperparameters``); ``path`` is another yml file
    (``--conf-file``). Values as yml gives them (``policy_kwargs`` still text).

    Examples:
        >>> fixed_hyperparams("dqn", "PongNoFrameskip-v4")["buffer_size"]   # doctest: +SKIP
        100000
    """
    import yaml

    file = Path(path) if path is not None else hyperparams_file(algo)
    try:
        data = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise EstimateError(f"cannot read rl-zoo3 hyperparameters from {file}: {exc}") from None
    if not isinstance(data, dict):
        raise EstimateError(f"{file} holds no hyperparameter sections.")
    if env_id in data:
        section = data[env_id]
    elif sb3_recipe.is_atari(env_id) and "atari" in data:
        section = data["atari"]
    elif "default" in data:
        section = data["default"]
    else:
        raise EstimateError(
            f"no hyperparameters for {algo} on {env_id!r} in {file} (no env, atari or default section)."
        )
    return dict(section)


def zoo_to_sb3(algo: str, sampled: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's params under rl-zoo3's sampled names (``trial.params``: ``batch_size_pow``, ``net_arch="small"``,
    ``one_minus_gamma``, ``train_freq``/``subsample_steps``, ``n_quantiles``...) mapped as rl-zoo3's converters
    map them; names already SB3's (what its sampler returns) pass as they are. Policy names found (``net_arch``,
    ``activation_fn``, ``n_quantiles``) make a new ``policy_kwargs``, as the zoo's sampler output replaces the
    yml's.

    Examples:
        >>> zoo_to_sb3("ppo", {"batch_size_pow": 6, "n_steps_pow": 9, "net_arch": "tiny", "activation_fn": "relu"})
        {'batch_size': 64, 'n_steps': 512,
         'policy_kwargs': {'net_arch': {'pi': [64], 'vf': [64]}, 'activation_fn': 'relu'}}
    """
    algo = check_algo(algo)
    out = dict(sampled)
    for name in ("batch_size", "n_steps"):
        if f"{name}_pow" in out:
            power = check_count(out.pop(f"{name}_pow"), f"param '{name}_pow'", "dimension")
            if power > 40:
                raise EstimateError(f"param '{name}_pow' must be at most 40 (2**40 {name}), but got {power}.")
            out[name] = 2**power
    for name in ("gamma", "gae_lambda"):
        if f"one_minus_{name}" in out:
            out[name] = 1 - out.pop(f"one_minus_{name}")
    if "train_freq" in out and "gradient_steps" not in out and isinstance(out["train_freq"], int):
        out["gradient_steps"] = max(out["train_freq"] // int(out.pop("subsample_steps", 1) or 1), 1)
    out.pop("subsample_steps", None)
    policy = {k: out.pop(k) for k in ("net_arch", "activation_fn", "n_quantiles") if k in out}
    if "net_arch" in policy and isinstance(policy["net_arch"], str) and algo in ("ppo", "a2c", "trpo"):
        arch = policy["net_arch"]
        if arch not in _ON_POLICY_ARCH:
            raise EstimateError(
                f"param 'net_arch' of {algo} must be one of {sorted(_ON_POLICY_ARCH)} or a list/dict "
                f"of widths, but got {arch!r}."
            )
        policy["net_arch"] = {k: list(v) for k, v in _ON_POLICY_ARCH[arch].items()}
    if policy:
        given = read_kwargs(out.get("policy_kwargs"), "param 'policy_kwargs'")
        out["policy_kwargs"] = {**given, **policy}
    return out


def read_params(items: list[str]) -> dict[str, Any]:
    """``-params key:value ...`` as ``rl_zoo3.train`` takes them, read without running code."""
    hyperparams = {}
    for item in items:
        key, sep, text = item.partition(":")
        if not sep or not key.isidentifier():
            raise EstimateError(f"-params are written key:value (buffer_size:50000), but got {item!r}.")
        hyperparams[key] = read_value(text, f"-params {key}") if text.strip() else text
    return hyperparams


def check_algo(algo: Any) -> str:
    """``algo`` in lower case if the recipe models it (``ALGOS``), else ``EstimateError``."""
    if not isinstance(algo, str) or algo.lower() not in ALGOS:
        raise EstimateError(f"algo must be one of {list(ALGOS)}, but got {algo!r}.")
    return algo.lower()


def check_names(algo: str, params: Mapping[str, Any], what: str) -> dict[str, Any]:
    """``params`` as a dict if every name is SB3's, rl-zoo3's sampled or its manager's, else ``EstimateError``
    naming the unknown ones in ``what``."""
    known = set(sb3_recipe.known_params()) | set(SAMPLED) | set(MANAGER)
    unknown = sorted(set(params) - known)
    if unknown:
        raise EstimateError(f"unknown rl-zoo3 param(s) {unknown} in {what} for {algo}; known: {sorted(known)}.")
    return dict(params)


def check_wrappers(env_id: str, wrappers: Any) -> None:
    """``EstimateError`` unless the env wrappers are ones the env profile reproduces: AtariWrapper at 84x84 on
    an Atari env (and only there), and wrappers that leave the observation unchanged."""
    items = wrappers if isinstance(wrappers, list) else [] if wrappers is None else [wrappers]
    names = {}
    for item in items:
        if isinstance(item, dict) and len(item) == 1:
            ((name, kwargs),) = item.items()
            names[name] = kwargs or {}
        elif isinstance(item, str):
            names[item] = {}
        else:
            raise EstimateError(f"env_wrapper must be a wrapper name or {{name: kwargs}}, but got {item!r}.")
    atari = sb3_recipe.is_atari(env_id)
    if atari != (_ATARI_WRAPPER in names):
        raise EstimateError(
            f"{env_id}: the env profile applies SB3's AtariWrapper to Atari envs only, but the "
            f"zoo's env_wrapper is {list(names) or None}."
        )
    extra = set(names.get(_ATARI_WRAPPER, {})) - _ATARI_SAME_OBS
    if extra:
        raise EstimateError(f"AtariWrapper {sorted(extra)} change the observation; not modelled.")
    other = [n for n in names if n != _ATARI_WRAPPER and n not in _SAME_OBS_WRAPPERS]
    if other:
        raise EstimateError(f"env_wrapper {other} may change the observation of {env_id}; not modelled.")
