"""The SB3 recipe: a Stable-Baselines3 run's footprint (DQN, QR-DQN, PPO, A2C, TRPO, SAC, TD3, DDPG, TQC) from
rl-zoo3-style params and SB3's ``policy_kwargs``.

SB3's own policies built on the meta device (``_sb3_nets``), env calibrated once, buffers and process added;
knows no Optuna and no rl-zoo3 file.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
from collections.abc import Mapping
from typing import Any

from ...exceptions import EstimateError
from ..baselines import EnvProfile
from ..buffers import replay_buffer, rollout_buffer
from ..calibration import Calibration, load
from ..checks import check_count, check_total
from ..footprint import Footprint
from ..processes import Stack, env_instances, env_workers, process
from . import _sb3_nets as nets
from .kwargs_text import read_kwargs

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
HELP = "Stable-Baselines3 (dqn, qrdqn, ppo, a2c, trpo, sac, td3, ddpg, tqc) with rl-zoo3-style params"

_OFF = {"buffer_size": 1_000_000, "optimize_memory_usage": False}
#: algo -> (family, the defaults SB3 uses for the memory params when a trial leaves them out)
ALGOS: dict[str, tuple[str, dict[str, Any]]] = {
    "dqn": ("offpolicy", {**_OFF, "batch_size": 32}),
    "qrdqn": ("offpolicy", {**_OFF, "batch_size": 32}),
    "sac": ("offpolicy", {**_OFF, "batch_size": 256}),
    "td3": ("offpolicy", {**_OFF, "batch_size": 256}),
    "ddpg": ("offpolicy", {**_OFF, "batch_size": 256}),
    "tqc": ("offpolicy", {**_OFF, "batch_size": 256}),
    "ppo": ("onpolicy", {"n_steps": 2048, "batch_size": 64}),
    "a2c": ("onpolicy", {"n_steps": 5}),
    "trpo": ("onpolicy", {"n_steps": 2048, "batch_size": 128}),
}
#: The algos whose classes come from sb3-contrib.
CONTRIB = ("qrdqn", "tqc", "trpo")
_CONTINUOUS = ("sac", "td3", "ddpg", "tqc")
#: Top-level names that are policy_kwargs (rl-zoo3's trial params name them flat).
_FLAT_POLICY = ("net_arch", "n_quantiles", "n_critics", "activation_fn", "ortho_init", "log_std_init")
#: SB3 params the recipe accepts by name: they change no array or tensor size.
_ACCEPTED = {
    "learning_starts",
    "gradient_steps",
    "train_freq",
    "n_epochs",
    "learning_rate",
    "gamma",
    "tau",
    "target_update_interval",
    "exploration_fraction",
    "exploration_initial_eps",
    "exploration_final_eps",
    "ent_coef",
    "vf_coef",
    "max_grad_norm",
    "gae_lambda",
    "clip_range",
    "clip_range_vf",
    "policy_delay",
    "target_policy_noise",
    "target_noise_clip",
    "sde_sample_freq",
    "use_sde_at_warmup",
    "normalize_advantage",
    "handle_timeout_termination",
    "target_entropy",
    "top_quantiles_to_drop_per_net",
    "cg_max_steps",
    "cg_damping",
    "line_search_shrinking_factor",
    "line_search_max_iter",
    "n_critic_updates",
    "target_kl",
    "rms_prop_eps",
    "action_noise",
    "stats_window_size",
    "seed",
    "verbose",
    "tensorboard_log",
}
_KNOWN_PARAMS = (
    _ACCEPTED
    | set(_FLAT_POLICY)
    | {
        "buffer_size",
        "batch_size",
        "n_steps",
        "optimize_memory_usage",
        "torch_threads",
        "use_sde",
        "use_rms_prop",
        "total_timesteps",
        "n_timesteps",
        "policy",
        "features_dim",
        "policy_kwargs",
        "sub_sampling_factor",
        "replay_buffer_class",
        "replay_buffer_kwargs",
    }
)
#: The policy_kwargs keys the recipe takes (forwarded to SB3's policy class, or the optimizer read).
POLICY_KWARGS = nets.FORWARDED + nets.OPTIMIZER
_POLICIES = ("MlpPolicy", "CnnPolicy")


def known_params() -> frozenset[str]:
    """Every top-level param name ``sb3()`` takes (memory params, policy names, SB3's others)."""
    return frozenset(_KNOWN_PARAMS)


def is_atari(env_id: str) -> bool:
    """Whether SB3 builds ``env_id`` with its Atari wrappers (84x84 grey)."""
    return env_id.startswith("ALE/") or "NoFrameskip" in env_id


def check_env(env_id: object) -> str:
    """``env_id`` if Gymnasium knows it (ALE's envs registered first for an Atari id, the module of a
    ``module:Env-v0`` id imported), with the version ``gymnasium.make`` reads into an id without one (its
    latest: ``CartPole`` is ``CartPole-v1``), else ``EstimateError`` "unknown env id" with close matches:
    checked before any probe is started for it."""
    if not isinstance(env_id, str) or not env_id.strip():
        raise EstimateError(f"env_id must be a Gymnasium env id such as 'CartPole-v1', but got {env_id!r}.")
    try:
        import gymnasium as gym
    except ImportError:
        raise EstimateError(
            "the sb3 recipe needs gymnasium and stable-baselines3, which are not installed: "
            'pip install "optuna-memprune[rl]"'
        ) from None
    if is_atari(env_id):
        try:
            import ale_py
        except ImportError:
            raise EstimateError(
                f'env id {env_id!r} is an Atari env, which needs ale-py: pip install "optuna-memprune[rl]"'
            ) from None
        gym.register_envs(ale_py)
    from gymnasium.envs.registration import find_highest_version, parse_env_id

    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EstimateError(
                f"unknown env id {env_id!r}: its module {module!r} cannot be imported ({exc})."
            ) from None
    if name in gym.registry:
        return env_id
    try:  # an id without a version means its latest version, as gymnasium.make reads it
        namespace, base, version = parse_env_id(name)
        if version is None and (latest := find_highest_version(namespace, base)) is not None:
            return f"{env_id}-v{latest}"
    except gym.error.Error:  # not even shaped like an id
        pass
    close = difflib.get_close_matches(name, list(gym.registry), n=3)
    raise EstimateError(
        f"unknown env id {env_id!r}: not in Gymnasium's registry"
        + (f" (close matches: {', '.join(map(repr, close))})" if close else "")
        + "."
    )


def env_profile(env_id: str, frame_stack: int | None, calibration: Calibration | None = None) -> EnvProfile:
    """``env_id`` as SB3 builds it (its spaces, one instance, one worker process), measured once per host (an
    id without a version, as the id of the version it means: one profile for both)."""
    env_id = check_env(env_id)
    if frame_stack is not None:
        check_count(frame_stack, "frame_stack", "dimension")
    atari = is_atari(env_id)
    stack = STACKS["sb3-atari" if atari else "sb3"]
    return (calibration or load()).env(
        env_id, atari=atari, frame_stack=frame_stack, imports=stack.imports, versioned=stack.versioned
    )


def calibrate_env(env_id: str, calibration: Calibration | None = None) -> EnvProfile:
    """What ``memprune calibrate --env`` measures: ``env_id`` as the zoo trains it (Atari: 4 frames stacked)."""
    return env_profile(env_id, 4 if is_atari(env_id) else None, calibration)


#: The memory params (those that size an array or a tensor) and the kind of value each is (``checks.CEILINGS``).
_COUNTS = {
    "buffer_size": "items",
    "n_steps": "items",
    "total_timesteps": "items",
    "n_timesteps": "items",
    "batch_size": "dimension",
    "n_quantiles": "dimension",
    "n_critics": "dimension",
    "features_dim": "dimension",
    "sub_sampling_factor": "dimension",
    "torch_threads": "processes",
}
#: The memory params that are switches: ``bool()`` of any other value (the text "maybe") would be a guess.
_FLAGS = ("optimize_memory_usage", "use_sde", "use_rms_prop")
_SDE = ("ppo", "a2c", "trpo", "sac", "tqc")  # SB3 passes the algo's use_sde to these policies


def _check_params(algo: str, params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """The params checked before any probe runs: the top-level ones (memory params each an int within its
    kind's ceiling), the policy kwargs forwarded to SB3's policy class (``policy_kwargs`` merged with the flat
    names rl-zoo3's trials use; widths, quantiles, critics checked) and the optimizer."""
    out = dict(params)
    for name, kind in _COUNTS.items():
        if out.get(name) is not None:
            out[name] = check_count(out[name], f"param {name!r}", kind)
    for name in _FLAGS:
        value = out.get(name)
        if value is not None and type(value).__name__ not in ("bool", "bool_"):  # numpy's too
            raise EstimateError(f"param {name!r} must be True or False, but got {value!r}.")
    if out.get("policy") is not None and out["policy"] not in _POLICIES:
        raise EstimateError(
            f"param 'policy' must be one of {list(_POLICIES)} (MultiInputPolicy and custom "
            f"policies are not modelled), but got {out['policy']!r}."
        )
    rb_class = out.get("replay_buffer_class")
    if rb_class is not None and str(getattr(rb_class, "__name__", rb_class)).rpartition(".")[2] != "ReplayBuffer":
        raise EstimateError(
            f"param 'replay_buffer_class' must be SB3's ReplayBuffer (others, HerReplayBuffer "
            f"included, are not modelled), but got {rb_class!r}."
        )
    rb_kwargs = read_kwargs(out.get("replay_buffer_kwargs"), "param 'replay_buffer_kwargs'")
    if set(rb_kwargs) - {"handle_timeout_termination"}:
        raise EstimateError(
            f"param 'replay_buffer_kwargs' may only hold handle_timeout_termination, but got {sorted(rb_kwargs)}."
        )
    pk = read_kwargs(out.pop("policy_kwargs", None), "param 'policy_kwargs'")
    unknown = sorted(set(pk) - set(POLICY_KWARGS))
    if unknown:
        raise EstimateError(f"unknown policy_kwargs key(s) {unknown} for {algo}; known: {sorted(POLICY_KWARGS)}.")
    for name in _FLAT_POLICY:
        if out.get(name) is not None:
            if name in pk and pk[name] != out[name]:
                raise EstimateError(
                    f"param {name!r} is given twice, {out[name]!r} and policy_kwargs {name}={pk[name]!r}."
                )
            pk[name] = out.pop(name)
    fe = read_kwargs(pk.get("features_extractor_kwargs"), "policy_kwargs 'features_extractor_kwargs'")
    if out.get("features_dim") is not None:
        fe["features_dim"] = out["features_dim"]
    if "features_dim" in fe:
        fe["features_dim"] = check_count(fe["features_dim"], "param 'features_dim'", "dimension")
    if fe:
        pk["features_extractor_kwargs"] = fe
    if algo in _SDE and out.get("use_sde") is not None:
        pk["use_sde"] = bool(out["use_sde"])
    if algo == "ddpg":
        pk.setdefault("n_critics", 1)  # as DDPG.__init__ sets it
    pk["net_arch"] = nets.net_arch(pk.get("net_arch"), algo)
    if pk["net_arch"] is None:
        del pk["net_arch"]
    for name in ("n_quantiles", "n_critics"):
        if name in pk:
            pk[name] = check_count(pk[name], f"param {name!r}", "dimension")
    if "activation_fn" in pk:
        pk["activation_fn"] = nets.activation_name(pk["activation_fn"])
    optimizer = nets.optimizer_of(algo, pk, out.get("use_rms_prop", True) is not False)
    return out, {k: v for k, v in pk.items() if k in nets.FORWARDED}, optimizer


def _positive_int(params: Mapping[str, Any], name: str, default: Any) -> int:
    return check_count(params.get(name, default), f"param {name!r}", _COUNTS[name])


def sb3(
    algo: str,
    env_id: str,
    params: Mapping[str, Any],
    *,
    n_envs: int = 1,
    frame_stack: int | None = None,
    vec_env: str = "dummy",
    device: str = "cpu",
    stack: Stack | None = None,
    calibration: Calibration | None = None,
) -> Footprint:
    """The peak footprint of training ``algo`` on ``env_id`` with rl-zoo3-style ``params``.

    Args:
        algo: one of ``dqn``, ``qrdqn``, ``ppo``, ``a2c``, ``trpo``, ``sac``, ``td3``, ``ddpg``, ``tqc``
            (``qrdqn``, ``trpo``, ``tqc`` need sb3-contrib).
        env_id: a Gymnasium id; ``ALE/...`` ids get SB3's Atari wrappers (84x84 grey).
        params: the trial's params as SB3 takes them: ``buffer_size``, ``batch_size``, ``n_steps``,
            ``optimize_memory_usage``, ``policy`` (``MlpPolicy``/``CnnPolicy``; default by the observation),
            ``policy_kwargs`` (a dict or its text ``"dict(net_arch=[64, 64])"``: ``net_arch`` as a list, a
            dict ``pi``/``vf`` or ``pi``/``qf``, or an rl-zoo3 name; ``n_quantiles``, ``n_critics``,
            ``activation_fn``, ``features_extractor_kwargs``, ``share_features_extractor``, ``use_sde`` and
            ``optimizer_class`` change memory; ``ortho_init``, ``log_std_init``, ``use_expln``... are taken
            too), the same policy names flat (``net_arch=small``, ``n_quantiles=50``: rl-zoo3's trials),
            ``use_rms_prop`` (A2C's RMSprop), ``sub_sampling_factor`` (TRPO), ``torch_threads``,
            ``total_timesteps`` (the replay buffer then holds ``min(total_timesteps, buffer_size)``
            transitions at the peak; otherwise it is assumed full), and SB3's other names (accepted; they
            do not change memory). An unknown name is an ``EstimateError`` listing the known ones.
        n_envs: parallel envs (``n_envs`` of the zoo's yml file).
        frame_stack: ``VecFrameStack`` depth (a positive int), or None.
        vec_env: ``"dummy"`` (envs in the trial's process) or ``"subproc"`` (one worker process each).
        device: ``"cpu"`` (networks in RAM) or ``"cuda"`` (networks in VRAM through the allocator model).
        stack: what the trial's process imports, its calibrated baseline (default: ``STACKS``' by the env, with
            sb3-contrib for its algos).

    Every count is checked against its kind's ceiling (``checks.CEILINGS``) and the env id against Gymnasium's
    registry before anything is measured; a total over 1 PiB is an error (beyond any real machine). TRPO's
    policy step runs on the whole rollout with its gradient graph kept (Hessian-vector products): it is
    traced as one training step at that batch, which leaves the double-backward graph out.

    Examples:
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
    params, policy_kwargs, optimizer = _check_params(algo, params)
    family, defaults = ALGOS[algo]
    cal = calibration or load()
    profile = env_profile(env_id, frame_stack, cal)
    obs, act = profile.observation_space, profile.action_space
    if obs["type"] != "Box" or act["type"] not in ("Discrete", "Box", "MultiDiscrete", "MultiBinary"):
        raise EstimateError(
            f"{env_id}: observation space {obs['type']} / action space {act['type']} "
            "is not supported by the sb3 recipe yet."
        )
    if algo in ("dqn", "qrdqn") and act["type"] != "Discrete":
        raise EstimateError(f"{algo} needs a Discrete action space; {env_id} has {act['type']}.")
    if algo in _CONTINUOUS and act["type"] != "Box":
        raise EstimateError(f"{algo} needs a Box action space; {env_id} has {act['type']}.")

    image = len(obs["shape"]) == 3 and obs["dtype"] == "uint8"
    obs_shape = tuple(obs["shape"])
    if image and obs_shape[-1] < obs_shape[0]:  # SB3 transposes channels-last images (VecTransposeImage)
        obs_shape = (obs_shape[-1], *obs_shape[:-1])
    act_shape = tuple(act["shape"]) if act["type"] != "Discrete" else ()
    act_dtype = act["dtype"] or "int64"

    torch_threads = params.get("torch_threads")
    if stack is None:
        stack = STACKS["sb3-atari" if profile.atari else "sb3"]
    if algo in CONTRIB and "sb3_contrib" not in stack.imports:
        stack = Stack(stack.imports + ("sb3_contrib",), stack.versioned)
    parts = [process(stack, torch_threads=torch_threads, calibration=cal)]
    parts.append(env_instances(profile, n_envs) if vec_env == "dummy" else env_workers(profile, n_envs))

    cnn = image if params.get("policy") is None else params["policy"] == "CnnPolicy"
    nets.check_forwarded(algo, cnn, policy_kwargs)
    built = nets.networks(algo, cnn, obs, act, policy_kwargs)
    if family == "offpolicy":
        batch = _positive_int(params, "batch_size", defaults["batch_size"])
        buffer_size = _positive_int(params, "buffer_size", defaults["buffer_size"])
        omu = bool(params.get("optimize_memory_usage", defaults["optimize_memory_usage"]))
        total = params.get("total_timesteps", params.get("n_timesteps"))
        steps = None if total is None else min(int(total), buffer_size)
        parts.append(
            replay_buffer(
                obs_shape,
                obs["dtype"],
                act_shape,
                act_dtype,
                buffer_size=buffer_size,
                n_envs=n_envs,
                optimize_memory_usage=omu,
                handle_timeout_termination=not omu,
                steps=steps,
                batch_size=batch,
                device=device,
            )
        )
    else:
        n_steps = _positive_int(params, "n_steps", defaults["n_steps"])
        rollout = n_steps * n_envs
        batch = (
            rollout
            if algo == "a2c" and "batch_size" not in params
            else _positive_int(params, "batch_size", defaults["batch_size"])
        )
        if algo == "trpo":  # the policy step takes the whole rollout (sub-sampled), the critic's minibatches less
            batch = max(batch, rollout // (params.get("sub_sampling_factor") or 1), 1)
        parts.append(
            rollout_buffer(
                obs_shape,
                obs["dtype"],
                act_shape,
                act_dtype,
                n_steps=n_steps,
                n_envs=n_envs,
                batch_size=None if algo in ("a2c", "trpo") else batch,
                device=device,
            )
        )
    parts.append(nets.train_step(algo, built, obs_shape, obs["dtype"], act_shape, batch, device, optimizer))
    fp = sum(parts, Footprint())
    hint = "buffer_size, n_steps, batch_size, n_envs, frame_stack and net_arch"
    check_total(fp.ram, f"the predicted RAM of {algo} on {env_id}", hint)
    check_total(fp.vram, f"the predicted VRAM of {algo} on {env_id}", hint)
    return fp


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``memprune predict sb3`` (the params come as ``name=value`` words)."""
    parser.add_argument("--algo", required=True, help=", ".join(ALGOS))
    parser.add_argument("--env", required=True, help="Gymnasium env id, e.g. ALE/Pong-v5")
    parser.add_argument("--n-envs", type=int, default=1)
    parser.add_argument("--frame-stack", type=int, default=None)
    parser.add_argument("--vec-env", choices=["dummy", "subproc"], default="dummy")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")


def from_args(args: argparse.Namespace, params: dict[str, Any]) -> tuple[str, Footprint]:
    """``memprune predict sb3``: a title line and the footprint of the parsed options and params."""
    fp = sb3(
        args.algo,
        args.env,
        params,
        n_envs=args.n_envs,
        frame_stack=args.frame_stack,
        vec_env=args.vec_env,
        device=args.device,
    )
    return f"sb3 {args.algo} on {args.env} " + " ".join(f"{k}={v}" for k, v in params.items()), fp
