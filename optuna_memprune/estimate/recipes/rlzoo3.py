"""The rl-zoo3 recipe: a trial's footprint as RL Baselines3 Zoo 2.9 builds it, from the zoo's own fixed
hyperparameters (its installed ``hyperparams/<algo>.yml``) merged with the trial's sampled params.

Owns the zoo's hyperparameters preprocessed (as ``ExperimentManager._preprocess_hyperparams`` does, with no
code run), the eval env, the largest value of a fixed hyperparameter that fits a budget, and the recipe's
commands (``memprune predict rlzoo3``, ``memprune run -- python -m rl_zoo3.train``); reading the zoo's files and
its sampled names is ``_zoo_names``' (its public names re-exported here); the footprint itself is the SB3
recipe's. Knows no Optuna and imports neither rl-zoo3 nor torch at import time.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from ... import units
from ...exceptions import EstimateError
from ..calibration import Calibration, load
from ..checks import check_count
from ..footprint import Footprint
from ..processes import Stack, env_instances, env_workers
from . import sb3 as sb3_recipe
from ._zoo_names import ALGOS as ALGOS  # the zoo's names are re-exported: the recipe's own
from ._zoo_names import MANAGER as MANAGER
from ._zoo_names import SAMPLED as SAMPLED
from ._zoo_names import check_algo, check_names, check_wrappers, read_params
from ._zoo_names import fixed_hyperparams as fixed_hyperparams
from ._zoo_names import hyperparams_file as hyperparams_file
from ._zoo_names import zoo_to_sb3 as zoo_to_sb3
from .kwargs_text import read_kwargs

#: Libraries whose versions key this recipe's calibrated stacks (the SB3 recipe's and rl-zoo3).
VERSIONED = sb3_recipe.VERSIONED + ("rl-zoo3", "optuna")
_ZOO = ("sb3_contrib", "optuna", "rl_zoo3.exp_manager")  # what ``python -m rl_zoo3.train`` imports on top of SB3
#: The stacks of a process running ``python -m rl_zoo3.train`` (``memprune calibrate`` measures them).
STACKS = {
    "rlzoo3": Stack(sb3_recipe.sb3_imports(atari=False) + _ZOO, VERSIONED),
    "rlzoo3-atari": Stack(sb3_recipe.sb3_imports(atari=True) + _ZOO, VERSIONED),
}
#: One line for ``memprune predict --help``.
HELP = "an rl-zoo3 trial: the zoo's yml hyperparameters for --algo/--env merged with the trial's sampled params"


def rlzoo3(
    algo: str,
    env_id: str,
    params: Mapping[str, Any] | None = None,
    *,
    hyperparams: Mapping[str, Any] | None = None,
    n_timesteps: int | None = None,
    n_eval_envs: int = 1,
    vec_env: str = "dummy",
    device: str = "cpu",
    conf_file: str | Path | None = None,
    calibration: Calibration | None = None,
) -> Footprint:
    """The peak footprint of one rl-zoo3 trial of ``algo`` on ``env_id``.

    Args:
        algo: ``dqn``, ``qrdqn``, ``ppo``, ``a2c``, ``trpo``, ``sac``, ``td3``, ``ddpg`` or ``tqc``.
        env_id: the id given to ``rl_zoo3.train --env``.
        params: the trial's sampled params, under rl-zoo3's names (``trial.params``) or as its sampler returns
            them (SB3's names, ``policy_kwargs`` with classes); they override the fixed ones.
        hyperparams: ``train.py -params`` overrides of the fixed hyperparameters (``buffer_size``, ``n_envs``...).
        n_timesteps: ``train.py -n``; otherwise the yml's ``n_timesteps``. The replay buffer holds
            ``min(n_timesteps, buffer_size)`` transitions at the peak.
        n_eval_envs: ``--n-eval-envs``: the eval env the zoo makes next to the training envs (0: none).
        vec_env: ``--vec-env``, ``"dummy"`` or ``"subproc"``.
        device: ``"cpu"`` or ``"cuda"``.
        conf_file: ``--conf-file``: another yml file instead of the zoo's own.

    The fixed hyperparameters come from the yml (``fixed_hyperparams``), ``n_envs``, ``frame_stack`` and
    ``env_wrapper`` go to the envs, ``policy_kwargs`` text is read without running it, and the rest goes to
    ``sb3.sb3``. Unknown names are an ``EstimateError`` listing the known ones.

    Examples:
        >>> fp = rlzoo3("dqn", "PongNoFrameskip-v4", {"batch_size_pow": 5, "net_arch": "small"})  # doctest: +SKIP
    """
    algo = check_algo(algo)
    fixed = fixed_hyperparams(algo, env_id, conf_file)
    fixed.update(check_names(algo, hyperparams or {}, "hyperparams"))
    sampled = zoo_to_sb3(algo, check_names(algo, params or {}, "params"))
    if "policy_kwargs" in fixed:
        fixed["policy_kwargs"] = read_kwargs(fixed["policy_kwargs"], f"{algo}.yml policy_kwargs")
    kwargs = {**fixed, **sampled}
    n_envs = check_count(kwargs.pop("n_envs", 1), "n_envs", "processes")
    steps = kwargs.pop("n_timesteps", None) if n_timesteps is None else n_timesteps
    kwargs.pop("n_timesteps", None)
    if steps is not None:
        kwargs["n_timesteps"] = check_count(steps, "n_timesteps", "items")
    frame_stack = kwargs.pop("frame_stack", None)
    check_wrappers(env_id, kwargs.pop("env_wrapper", None))
    for name in ("vec_env_wrapper", "env_kwargs"):
        if kwargs.pop(name, None):
            raise EstimateError(f"{name} of the zoo's {algo} hyperparameters for {env_id} is not modelled.")
    for name in ("normalize", "callback", "monitor_kwargs"):  # running stats, callbacks: O(obs) or nothing
        kwargs.pop(name, None)
    for name in ("noise_type", "noise_std", "n_sampled_goal", "goal_selection_strategy"):
        kwargs.pop(name, None)  # the action noise is O(n_actions); HER's names come with HER's buffer (refused)
    check_count(n_eval_envs, "n_eval_envs", "processes", minimum=0)
    cal = calibration or load()
    atari = sb3_recipe.is_atari(env_id)
    stack = STACKS["rlzoo3-atari" if atari else "rlzoo3"]
    fp = sb3_recipe.sb3(
        algo,
        env_id,
        kwargs,
        n_envs=n_envs,
        frame_stack=frame_stack,
        vec_env=vec_env,
        device=device,
        stack=stack,
        calibration=cal,
    )
    if n_eval_envs:
        profile = sb3_recipe.env_profile(env_id, frame_stack, cal)
        evals = env_instances(profile, n_eval_envs) if vec_env == "dummy" else env_workers(profile, n_eval_envs)
        # subproc: the training envs already started multiprocessing's helpers; the eval env adds workers only
        fp = fp + Footprint(
            tuple(
                replace(c, name=f"eval env: {c.name}") for c in evals.components if c.name != "multiprocessing helpers"
            )
        )
    return fp


def largest_fitting(
    algo: str,
    env_id: str,
    budget: int | str,
    name: str = "buffer_size",
    params: Mapping[str, Any] | None = None,
    *,
    hyperparams: Mapping[str, Any] | None = None,
    **options: Any,
) -> int | None:
    """The largest value of the fixed hyperparameter ``name`` (default ``buffer_size``; any count the footprint
    grows with: ``n_envs``, ``n_steps``, ``batch_size``) at most its present value for which the trial's RAM
    fits ``budget`` (bytes or ``"4GiB"``); its present value if that fits, None if not even 1 does. Bisection
    over ``rlzoo3(...)`` (``options`` are its keyword arguments).

    Examples:
        >>> largest_fitting("dqn", "PongNoFrameskip-v4", "4GiB")   # doctest: +SKIP
        67253
    """
    limit = units.parse_bytes(budget, name="budget")
    fixed = {**fixed_hyperparams(algo, env_id, options.get("conf_file")), **(hyperparams or {})}
    sampled = zoo_to_sb3(algo, params or {})
    present = sampled.get(name, fixed.get(name))
    if present is None:
        raise EstimateError(f"{name!r} is not set for {algo} on {env_id}: give it in hyperparams.")
    present = check_count(present, name, "items")

    def ram(value: int) -> int:
        overrides = {**(hyperparams or {}), name: value}
        trial = {k: v for k, v in (params or {}).items() if k != name}
        return rlzoo3(algo, env_id, trial, hyperparams=overrides, **options).ram

    return _bisect(ram, present, limit)


def budget_advice(
    algo: str,
    env_id: str,
    budget: int | str,
    name: str = "buffer_size",
    params: Mapping[str, Any] | None = None,
    **options: Any,
) -> str | None:
    """None if the trial fits ``budget``, else one line: ``"buffer_size 100000 needs 5.72 GiB at 4.00 GiB;
    67000 fits"`` (the whole trial's RAM; the fitting value rounded down to two significant digits), or
    ``"...; no buffer_size fits"``. ``options`` are ``rlzoo3``'s keyword arguments."""
    advice = _advice(algo, env_id, budget, name, params, **options)
    return None if advice is None else advice[0]


def _advice(
    algo: str, env_id: str, budget: int | str, name: str, params: Mapping[str, Any] | None, **options: Any
) -> tuple[str, int | None] | None:
    """``budget_advice``'s line and the value it names as fitting (None: none fits); None if the trial fits."""
    limit = units.parse_bytes(budget, name="budget")
    hyperparams = options.pop("hyperparams", None)
    need = rlzoo3(algo, env_id, params, hyperparams=hyperparams, **options).ram
    if need <= limit:
        return None
    fits = largest_fitting(algo, env_id, limit, name, params, hyperparams=hyperparams, **options)
    merged = {**fixed_hyperparams(algo, env_id, options.get("conf_file")), **(hyperparams or {})}
    present = zoo_to_sb3(algo, params or {}).get(name, merged.get(name))
    head = f"{name} {present} needs {units.format_bytes(need)} at {units.format_bytes(limit)}"
    if fits is None:
        return f"{head}; no {name} fits", None
    return f"{head}; {_round_down(fits)} fits", _round_down(fits)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``memprune predict rlzoo3`` (the trial's sampled params come as ``name=value`` words)."""
    parser.add_argument("--algo", required=True, choices=ALGOS)
    parser.add_argument("--env", required=True, help="the env id given to rl_zoo3.train, e.g. PongNoFrameskip-v4")
    parser.add_argument(
        "-params",
        "--hyperparams",
        dest="hyperparams",
        nargs="+",
        default=[],
        metavar="KEY:VALUE",
        help="overrides of the zoo's fixed hyperparameters, as rl_zoo3.train takes them",
    )
    parser.add_argument("-n", "--n-timesteps", dest="n_timesteps", type=int, default=None)
    parser.add_argument("--n-eval-envs", type=int, default=1)
    parser.add_argument("--vec-env", choices=["dummy", "subproc"], default="dummy")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--conf-file", default=None, help="another hyperparameter yml file")


def from_args(args: argparse.Namespace, params: dict[str, Any]) -> tuple[str, Footprint]:
    """``memprune predict rlzoo3``: a title line and the footprint of the parsed options and params."""
    hyperparams = read_params(args.hyperparams)
    fp = rlzoo3(
        args.algo,
        args.env,
        params,
        hyperparams=hyperparams,
        n_timesteps=args.n_timesteps,
        n_eval_envs=args.n_eval_envs,
        vec_env=args.vec_env,
        device=args.device,
        conf_file=args.conf_file,
    )
    words = [f"{k}:{v}" for k, v in hyperparams.items()] + [f"{k}={v}" for k, v in params.items()]
    return f"rl-zoo3 {args.algo} on {args.env} " + " ".join(words), fp


def for_command(argv: list[str]) -> tuple[str, Callable[[Mapping[str, Any]], Footprint]]:
    """``memprune run -- python -m rl_zoo3.train ARGV``: a title and the footprint of a trial of that search
    as a function of its sampled params (picklable). ``ARGV`` is read as ``rl_zoo3.train`` reads it
    (``--algo``, ``--env``, ``-params``, ``-n``, ``--n-eval-envs``, ``--vec-env``, ``--device``,
    ``--conf-file``, ``--num-threads``; the rest is the search's own business); ``--device auto`` is CUDA
    where torch sees a GPU."""
    algo, env_id, options = _train_options(argv)
    return (
        f"the rlzoo3 recipe ({algo} on {env_id}, the zoo's yml merged with each trial's params)",
        partial(_trial, algo, env_id, options),
    )


def fixed_message(argv: list[str], budget: Any, soft: float = 0.9) -> str | None:
    """Before the first trial of ``rl_zoo3.train ARGV``: None when the search's fixed hyperparameters fit
    under the soft line (``soft`` x ``budget.ram``) with the yml's sampled defaults, else one line with the
    largest ``buffer_size`` (or ``n_envs``, for a search with no replay buffer) that fits."""
    ram = getattr(budget, "ram", budget)
    if ram is None:
        return None
    algo, env_id, options = _train_options(argv)
    line = soft * ram
    merged = {**fixed_hyperparams(algo, env_id, options["conf_file"]), **options["hyperparams"]}
    name = "buffer_size" if "buffer_size" in merged or algo not in ("ppo", "a2c", "trpo") else "n_envs"
    advice = _advice(algo, env_id, int(line), name, None, **dict(options))
    if advice is None:
        return None
    text, fits = advice
    fix = "" if fits is None else f": pass -params {name}:{fits}"
    return (
        f"every trial of this search is infeasible: {text} (the soft line, {soft:.0%} of the "
        f"{units.format_bytes(ram)} budget){fix}"
    )


def clamp_fixed(argv: list[str], budget: Any, names: list[str], soft: float = 0.9) -> dict[str, tuple[Any, int]]:
    """``memprune run --clamp-fixed NAME``: ``{name: (its value, the largest value that fits)}`` for each named
    fixed hyperparameter (a count in the zoo's model kwargs: ``buffer_size``, ``batch_size``, ``n_steps``...)
    that makes the search's trials infeasible under the soft line with the yml's defaults, lowered in turn;
    a name that already fits is left out. EstimateError for a name the search does not set, or none fits."""
    ram = getattr(budget, "ram", budget)
    algo, env_id, options = _train_options(argv)
    options = dict(options)
    hyperparams = dict(options.pop("hyperparams"))
    merged = {**fixed_hyperparams(algo, env_id, options["conf_file"]), **hyperparams}
    out: dict[str, tuple[Any, int]] = {}

    def count(key: str) -> bool:
        value = merged.get(key)
        return (
            key not in MANAGER
            and key != "torch_threads"
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and float(value).is_integer()
            and value >= 1
        )

    for name in names:
        if not count(name):
            raise EstimateError(
                f"--clamp-fixed {name!r}: not a fixed count of {algo} on {env_id}; the zoo's "
                f"fixed counts are {sorted(k for k in merged if count(k))}."
            )
        if ram is None:
            continue
        advice = _advice(algo, env_id, int(soft * ram), name, None, hyperparams=hyperparams, **options)
        if advice is None:
            continue
        if advice[1] is None:
            raise EstimateError(
                f"--clamp-fixed {name}: no value of it brings a trial under the soft line ({soft:.0%} "
                f"of {units.format_bytes(ram)}): {advice[0]}."
            )
        out[name] = (int(merged[name]), advice[1])
        hyperparams[name] = advice[1]
    return out


def with_params(argv: list[str], params: Mapping[str, Any]) -> list[str]:
    """``argv`` with ``params`` added to its ``-params`` (as one last ``-params``, which ``rl_zoo3.train``'s
    parser takes over an earlier one).

    Examples:
        >>> with_params(["--algo", "dqn", "-params", "gamma:0.9"], {"buffer_size": 5000})
        ['--algo', 'dqn', '-params', 'gamma:0.9', '-params', 'gamma:0.9', 'buffer_size:5000']
    """
    if not params:
        return list(argv)
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-params", "--hyperparams", dest="hyperparams", nargs="+", default=[])
    given = parser.parse_known_args(list(argv))[0].hyperparams
    kept = [item for item in given if item.partition(":")[0] not in params]
    return [*argv, "-params", *kept, *(f"{k}:{v}" for k, v in params.items())]


def _trial(algo: str, env_id: str, options: Mapping[str, Any], params: Mapping[str, Any]) -> Footprint:
    return rlzoo3(algo, env_id, params, **options)


def _train_options(argv: list[str]) -> tuple[str, str, dict[str, Any]]:
    """``rl_zoo3.train``'s arguments that shape a trial's memory, with its defaults; EstimateError for an
    algo the recipe does not model."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("-params", "--hyperparams", dest="hyperparams", nargs="+", default=[])
    parser.add_argument("-n", "--n-timesteps", dest="n_timesteps", type=int, default=-1)
    parser.add_argument("--n-eval-envs", type=int, default=1)
    parser.add_argument("--vec-env", default="dummy")
    parser.add_argument("--device", default="auto")
    parser.add_argument("-conf", "--conf-file", dest="conf_file", default=None)
    parser.add_argument("--num-threads", type=int, default=-1)
    args, _ = parser.parse_known_args(list(argv))
    device = args.device
    if device == "auto":
        import torch  # the search imports it anyway

        device = "cuda" if torch.cuda.is_available() else "cpu"
    threads = {"torch_threads": args.num_threads} if args.num_threads > 0 else {}  # train.py sets it
    options = {
        "hyperparams": {**threads, **read_params(args.hyperparams)},
        "n_timesteps": args.n_timesteps if args.n_timesteps > 0 else None,
        "n_eval_envs": args.n_eval_envs,
        "vec_env": args.vec_env,
        "device": "cuda" if device.startswith("cuda") else "cpu",
        "conf_file": args.conf_file,
    }
    return check_algo(args.algo), args.env, options


def _bisect(ram: Callable[[int], int], present: int, limit: int) -> int | None:
    if ram(present) <= limit:
        return present
    if ram(1) > limit:
        return None
    low, high = 1, present  # ram(low) fits, ram(high) does not
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if ram(mid) <= limit else (low, mid)
    return low


def _round_down(value: int) -> int:
    """``value`` rounded down to two significant digits (67253 -> 67000)."""
    step: int = 10 ** max(len(str(value)) - 2, 0)  # a power of 10 with a non-negative exponent: an int
    return value // step * step
