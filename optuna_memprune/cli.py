"""The ``memprune`` command: predict, calibrate (and the commands later layers add).

The only module that prints or configures logging handlers; everything else returns data.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import sys
from typing import Any, Sequence

from ._units import format_bytes
from .exceptions import MemPruneError


def _param(text: str) -> tuple[str, Any]:
    """``name=value`` with value read as a Python literal when it is one (``32``, ``1e5``, ``[64,64]``,
    ``True``), else kept as text (``small``)."""
    name, sep, raw = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"params are written name=value, but got {text!r}")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = {"true": True, "false": False}.get(raw.lower(), raw)
    if isinstance(value, float) and value.is_integer() and ("e" in raw.lower()):
        value = int(value)  # 1e5 -> 100000: sizes are written that way
    return name, value


def _print_footprint(fp, budget_line: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_footer=True, box=None, pad_edge=False)
    rows = fp.rows()
    total = rows.pop()
    for head, foot, justify in (("component", total[0], "left"), ("kind", total[1], "left"),
                                ("RAM", total[2], "right"), ("VRAM", total[3], "right"),
                                ("threads", total[4], "right"), ("note", total[5], "left")):
        table.add_column(head, footer=foot, justify=justify, no_wrap=head != "note")
    for row in rows:
        table.add_row(*row)
    console = Console() if sys.stdout.isatty() else Console(width=200)  # pipes and files: no wrapping
    console.print(table)
    if budget_line:
        console.print(budget_line)


def _cmd_predict(args: argparse.Namespace) -> int:
    from .estimate import recipes

    params = dict(args.params)
    fp = recipes.sb3(args.algo, args.env, params, n_envs=args.n_envs, frame_stack=args.frame_stack,
                     vec_env=args.vec_env, device=args.device)
    if args.json:
        print(json.dumps(fp.to_dict(), indent=1))
    else:
        print(f"sb3 {args.algo} on {args.env} " + " ".join(f"{k}={v}" for k, v in params.items()))
        _print_footprint(fp)
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from .estimate import calibration

    cal, seconds = calibration.calibrate(env_ids=args.env, force=args.force)
    for key, _ in sorted(cal.data.get("stacks", {}).items()):
        mods = key.split(":")[1].split(",")
        base = cal.stack(mods, train=key.endswith(":1"))
        print(f"{', '.join(base.imports) or 'python':55s} {format_bytes(base.ram):>11s}  "
              f"threads {base.threads_at(1)} (+{base.threads_per_torch_thread:.1f} per torch thread)")
    for env_id in args.env:
        atari = env_id.startswith("ALE/")
        p = cal.env(env_id, atari=atari, frame_stack=4 if atari else None,
                    imports=calibration.sb3_imports(atari))
        print(f"{env_id:55s} env {format_bytes(p.env_ram):>10s} each, worker {format_bytes(p.worker_ram)}")
    print(f"calibrated in {seconds:.1f} s -> {cal.path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memprune", description="Predict, budget and guard Optuna trials.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the tool does")
    sub = parser.add_subparsers(dest="command", required=True)

    pred = sub.add_parser("predict", help="print the predicted footprint of a recipe and params")
    pred.add_argument("recipe", choices=["sb3"], help="which recipe (sb3: Stable-Baselines3)")
    pred.add_argument("--algo", required=True, help="dqn, qrdqn, ppo, a2c, sac or td3")
    pred.add_argument("--env", required=True, help="Gymnasium env id, e.g. ALE/Pong-v5")
    pred.add_argument("--n-envs", type=int, default=1)
    pred.add_argument("--frame-stack", type=int, default=None)
    pred.add_argument("--vec-env", choices=["dummy", "subproc"], default="dummy")
    pred.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    pred.add_argument("--json", action="store_true", help="print the footprint as JSON")
    pred.add_argument("params", nargs="*", type=_param, help="name=value params, e.g. buffer_size=100000")
    pred.set_defaults(func=_cmd_predict)

    cal = sub.add_parser("calibrate", help="measure this host's baselines now and cache them")
    cal.add_argument("--env", action="append", default=[], help="also profile this env id (repeatable)")
    cal.add_argument("--force", action="store_true", help="forget the cached figures first")
    cal.set_defaults(func=_cmd_calibrate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # name=value params may stand between options (argparse would take them as the empty positional first).
    args, extra = parser.parse_known_args(argv)
    if extra:
        if args.command != "predict" or any(e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        try:
            args.params = list(args.params) + [_param(e) for e in extra]
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    logging.getLogger("optuna_memprune").setLevel(logging.INFO)  # one-off calibration lines always show
    try:
        return args.func(args)
    except MemPruneError as exc:
        print(f"memprune: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
