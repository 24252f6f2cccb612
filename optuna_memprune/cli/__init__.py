"""The ``memprune`` command (predict, calibrate, worker, run, report), with the Optuna CLI's conventions.

The only module that prints or configures logging handlers; exits 0, 1 (runtime), 2 (usage) or 130 (Ctrl-C).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._extras import MissingExtra
from ..exceptions import EstimateError, MemPruneError
from ..storages import ENV_VAR, as_url, first_line, hint, shown
from ..units import format_bytes
from ._common import UsageError, output_format
from ._report import cmd_report
from ._worker import cmd_worker

if TYPE_CHECKING:
    from ..estimate.footprint import Footprint

EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


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


def _print_footprint(fp: Footprint, budget_line: str | None = None) -> None:
    from .._console import parts, show

    table = parts().Table(show_footer=True, box=None, pad_edge=False)
    rows = fp.rows()
    total = rows.pop()
    for head, foot, justify in (
        ("component", total[0], "left"),
        ("kind", total[1], "left"),
        ("RAM", total[2], "right"),
        ("VRAM", total[3], "right"),
        ("threads", total[4], "right"),
        ("note", total[5], "left"),
    ):
        table.add_column(head, footer=foot, justify=justify, no_wrap=head != "note")
    for row in rows:
        table.add_row(*row)
    show(table, *([budget_line] if budget_line else []))


def _cmd_predict(args: argparse.Namespace) -> int:
    from ..estimate.recipes import RECIPES

    params = dict(args.params)
    try:
        title, fp = RECIPES[args.recipe].from_args(args, params)
    except EstimateError as exc:  # the params or options given do not describe a run
        raise UsageError(str(exc)) from None
    if output_format(args) == "json":
        print(json.dumps(fp.to_dict(), indent=1))
    else:
        print(title)
        _print_footprint(fp)
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from ..estimate import recipes
    from ..estimate.recheck import stamp

    try:
        cal, profiles, seconds = recipes.calibrate(env_ids=args.env, force=args.force)
    except EstimateError as exc:  # an --env the recipes cannot profile (checked before any probe)
        raise UsageError(str(exc)) from None
    if output_format(args) == "json":
        print(
            json.dumps(
                {
                    "stacks": [dataclasses.asdict(b) for b in cal.stacks()],
                    "envs": [dataclasses.asdict(p) for p in profiles],
                    "seconds": round(seconds, 1),
                    "path": str(cal.path),
                },
                indent=1,
            )
        )
        return 0
    for base in cal.stacks():
        print(
            f"{', '.join(base.imports) or 'python':55s} {format_bytes(base.ram):>11s}  "
            f"threads {base.threads_at(1)} (+{base.threads_per_torch_thread:.1f} per torch thread)  "
            f"measured {stamp(base.measured_at)}, rechecked {stamp(base.checked_at)}"
        )
    for p in profiles:
        print(
            f"{p.env_id:55s} env {format_bytes(p.env_ram):>10s} each, worker {format_bytes(p.worker_ram)}  "
            f"measured {stamp(p.measured_at)}"
        )
    print(f"calibrated in {seconds:.1f} s -> {cal.path}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    """Check the command and options, then become the program (``exec``) with the guard injected; returns
    only for ``--dry-run``. How the injection works: ``optuna_memprune.run``."""
    from .. import run as inject

    url = args.storage or os.environ.get(ENV_VAR) or None
    url = None if url is None else as_url(url)
    try:
        options, label = inject.prepare(
            args.command[1:] if args.command[:1] == ["--"] else args.command,
            ram=args.ram,
            vram=args.vram,
            threads=args.threads,
            workers=args.workers,
            on_infeasible=args.on_infeasible,
            footprint=args.footprint,
            clamp_fixed=args.clamp_fixed,
            storage=url,
            ray=args.ray,
        )
        default = inject.default_params(options) if args.dry_run else None
        fixed = inject.fixed_message(options) if args.dry_run and not args.clamp_fixed else None
        if args.dry_run and args.clamp_fixed:
            lowered = inject.overrides(options)
            fixed = (
                "; ".join(f"--clamp-fixed: {k} {v[0]} -> {v[1]} on every trial" for k, v in lowered.items())
                or "--clamp-fixed: every named fixed hyperparameter fits as it is; nothing lowered"
            )
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if url is not None and not args.dry_run:
        _open_run_storage(url, "--storage" if args.storage else f"${ENV_VAR} (the default of --storage)")
    argv = list(options.program.argv)
    replayed = inject.replayed(options)
    if replayed is not None:  # a trial that ran with --clamp-fixed's values is replayed with them
        argv = list(replayed[0])
        print(f"memprune: {replayed[1]}", file=sys.stderr)
    if args.dry_run and output_format(args) == "json":
        print(
            json.dumps(
                {
                    "command": argv,
                    "budget": options.budget.resources,
                    "footprint": label,
                    "default_params": default and default[1].to_dict(),
                    "fixed": fixed,
                },
                indent=1,
            )
        )
    elif args.dry_run:
        print(
            f"memprune run would guard: {' '.join(argv)}\nbudget: {options.budget} (the program's process)\n"
            f"footprint: {label}"
        )
        if default is not None:
            print(f"footprint of the default params ({default[0]}):")
            _print_footprint(default[1])
        if fixed:
            print(fixed)
        if url is not None:
            print(f"storage: {shown(url)}, for a study the program makes in memory (not opened: --dry-run)")
    if args.dry_run:
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    try:  # exec keeps this pid: the hook acts only in the process of this pid
        os.execvpe(argv[0], argv, options.environment(dict(os.environ), os.getpid()))
    except OSError as exc:
        raise UsageError(f"cannot run {argv[0]!r}: {exc.strerror or exc}: nothing was run") from None


def _open_run_storage(url: str, named: str) -> None:
    """``memprune run``'s storage opened once before the program starts (tables made where it is new), so a
    bad one is a usage error naming ``named`` and nothing runs."""
    from ..storages import open_storage

    try:
        open_storage(url)
    except Exception as exc:  # noqa: BLE001 - a URL that is none, a driver missing, a server gone
        raise UsageError(
            f"{named} {shown(url)!r} cannot be opened: {first_line(exc)}{hint(url)}: nothing was run"
        ) from None


def _verbosity() -> argparse.ArgumentParser:
    """``-v``/``-q``, accepted before and after the command (each level leaves the other's value alone)."""
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log what the tool does")
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print warnings and errors only (no calibration notes)",
    )
    return parser


def _formats(*choices: str, json_alias: bool = False) -> argparse.ArgumentParser:
    """``-f/--format`` of a command that prints data (``--json``: the same as ``-f json``)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument(
        "-f", "--format", choices=choices, default=argparse.SUPPRESS, help=f"output format (default: {choices[0]})"
    )
    if json_alias:
        parser.add_argument(
            "--json",
            dest="format",
            action="store_const",
            const="json",
            default=argparse.SUPPRESS,
            help="the same as --format json",
        )
    return parser


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from ..estimate.recipes import RECIPES

    verbosity = _verbosity()
    parser = argparse.ArgumentParser(
        prog="memprune", description="Predict, budget and guard Optuna trials.", parents=[verbosity]
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    predict_formats = _formats("table", "json", json_alias=True)
    pred = sub.add_parser(
        "predict", parents=[verbosity, predict_formats], help="print the predicted footprint of a recipe and params"
    )
    by_recipe = pred.add_subparsers(
        dest="recipe", required=True, metavar="recipe", help=", ".join(RECIPES) + " (memprune predict <recipe> --help)"
    )
    for name, recipe in RECIPES.items():
        rp = by_recipe.add_parser(name, parents=[verbosity, predict_formats], help=recipe.HELP)
        recipe.add_arguments(rp)
        rp.add_argument("params", nargs="*", type=_param, help="name=value params, e.g. buffer_size=100000")
    pred.set_defaults(func=_cmd_predict)

    cal = sub.add_parser(
        "calibrate",
        parents=[verbosity, _formats("table", "json")],
        help="measure this host's baselines now and cache them (a cached one is rechecked: see MEMPRUNE_RECHECK)",
    )
    cal.add_argument("--env", action="append", default=[], help="also profile this env id (repeatable)")
    cal.add_argument("--force", action="store_true", help="forget the cached figures first")
    cal.set_defaults(func=_cmd_calibrate)

    storage_help = (
        f"the study's storage: a URL (sqlite:///f.db, postgresql+psycopg://...) or a Journal file "
        f"(PATH.log, journal:PATH); default ${ENV_VAR}"
    )
    wk = sub.add_parser(
        "worker",
        parents=[verbosity],
        help="run trials of a study, one process each, under the guard and this host's ledger",
    )
    wk.add_argument("objective", help="the objective as module:function (importable from here)")
    wk.add_argument("--storage", default=None, help=storage_help)
    wk.add_argument("--study-name", "--study", dest="study", required=True, help="the study name (created if missing)")
    wk.add_argument(
        "--direction",
        choices=["minimize", "maximize"],
        default=None,
        help="the study's direction (default: an existing study's, else minimize)",
    )
    wk.add_argument("--guard", help="module:name of a MemoryGuard (or of a function returning one)")
    wk.add_argument("--footprint", help="module:function params -> Footprint (instead of --guard)")
    wk.add_argument("--ram", help="per-trial RAM budget, e.g. 6GiB (with --footprint)")
    wk.add_argument("--vram", help="per-trial GPU memory budget (with --footprint)")
    wk.add_argument("--threads", type=int, help="per-trial thread budget (with --footprint)")
    wk.add_argument("--on-infeasible", choices=["clamp", "reject"], default="clamp")
    wk.add_argument("--sampler", choices=["tpe", "random"], default="tpe")
    wk.add_argument("--pruner", choices=["median", "none"], default="median")
    wk.add_argument("--seed", type=int, default=None)
    wk.add_argument("--n-trials", type=int, default=None, help="trials this worker runs")
    wk.add_argument("--timeout", type=float, default=None, help="seconds after which no trial starts")
    wk.add_argument("--n-workers", type=int, default=1, help="trial processes at the same time")
    wk.add_argument("--host-id", default=None, help="this host's id in the ledger (default: the hostname)")
    wk.add_argument("--ledger", default=None, help="ledger database URL (default: a SQLite file per host)")
    wk.add_argument(
        "--host-ram",
        default="auto",
        help="RAM for all trials of this host (default: available now, "
        "or the room under this process's cgroup limit where less)",
    )
    wk.add_argument("--host-gpus", nargs="*", default="auto", help="memory per GPU (default: NVML's)")
    wk.add_argument("--host-threads", type=int, default=None)
    wk.add_argument("--headroom", type=float, default=0.1, help="fraction of the host kept free")
    wk.add_argument("--on-host-full", choices=["wait", "reject"], default="wait")
    wk.add_argument(
        "--enforce",
        choices=["auto", "cgroup", "polling"],
        default="auto",
        help="a cgroup per trial where one can be made (auto), or else an error (cgroup), or polling only",
    )
    wk.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    wk.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run each trial as a Ray task on the cluster at ADDRESS (auto, HOST:PORT, ray://HOST:10001; local: a "
        "new one-machine cluster), instead of this host's processes and ledger; --n-workers tasks at once",
    )
    wk.add_argument(
        "--ray-retries", type=int, default=0, help="with --ray: ask a trial whose task Ray lost again, up to N times"
    )
    wk.set_defaults(func=cmd_worker)

    run = sub.add_parser(
        "run",
        parents=[verbosity, _formats("table", "json")],
        help="run an unchanged Python program with every Optuna study it makes guarded",
    )
    run.add_argument("--ram", help="the program's RAM budget, e.g. 4GiB")
    run.add_argument("--vram", help="its GPU memory budget")
    run.add_argument("--threads", type=int, help="its thread budget")
    run.add_argument("--on-infeasible", choices=["clamp", "reject"], default="clamp")
    run.add_argument(
        "--footprint",
        default="auto",
        help="auto (default), learned, none, a recipe's name, or MODULE:FUNCTION params -> Footprint",
    )
    run.add_argument(
        "--workers",
        type=int,
        default=1,
        help="trials at once, each in its own process, for a program "
        "that calls optimize with n_jobs=1 (n_jobs above 1 does the same by itself)",
    )
    run.add_argument(
        "--clamp-fixed",
        action="append",
        default=[],
        metavar="NAME",
        help="lower this fixed hyperparameter of an rl-zoo3 search to the largest value that fits "
        "when no trial fits with it (repeatable); recorded on every trial",
    )
    run.add_argument(
        "--storage",
        default=None,
        help="put a study the program makes in memory (as Hugging Face's "
        "hyperparameter_search does) on this storage, so its records outlive the program; a study the "
        f"program gives a storage keeps its own. Written as {storage_help[storage_help.index('a URL') :]}",
    )
    run.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run every trial as a Ray task on the cluster at ADDRESS (auto, HOST:PORT, ray://HOST:10001; local: a "
        "new one-machine cluster), --workers (or the program's n_jobs) at a time",
    )
    run.add_argument("--dry-run", action="store_true", help="print what would be guarded; run nothing")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]: python ..., a .py file")
    run.set_defaults(func=_cmd_run)

    rep = sub.add_parser(
        "report",
        parents=[verbosity, _formats("table", "json", "html")],
        help="review a guarded study: decisions, stopped trials, prediction quality",
    )
    rep.add_argument("storage", nargs="?", default=None, help=storage_help)
    rep.add_argument(
        "--study-name",
        "--study",
        dest="study",
        default=None,
        help="the study name (may be omitted when the storage holds one)",
    )
    rep.add_argument("-o", "--output", default=None, help="write to this file instead of standard output")
    rep.add_argument(
        "--dashboard-notes",
        action="store_true",
        help="also write an optuna-dashboard note on every guarded trial (needs optuna-dashboard)",
    )
    rep.set_defaults(func=cmd_report)
    return parser


#: The commands that run only this package's code (whose failed imports are a missing extra).
_OWN_CODE = ("predict", "calibrate", "report")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``memprune``; returns the exit status: 0, 1 for an error while running, 2 for a command line that
    asks for something impossible (argparse's own errors too), 130 when interrupted (Ctrl-C)."""
    try:
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
        verbose, quiet = getattr(args, "verbose", False), getattr(args, "quiet", False)
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")
        # one-off calibration lines show unless asked for quiet
        logging.getLogger("optuna_memprune").setLevel(logging.WARNING if quiet else logging.INFO)
        try:
            command: Callable[[argparse.Namespace], int] = args.func  # set_defaults(func=...) of its subparser
            return command(args)
        except ImportError as exc:  # a command that needs an extra this install lacks: one line naming it
            # (worker and run import or run the user's code: its own import errors are its own)
            missing = MissingExtra.of(exc, f"memprune {args.command}") if args.command in _OWN_CODE else None
            if missing is None:
                raise
            raise missing from None
    except UsageError as exc:
        print(f"memprune: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except MemPruneError as exc:
        print(f"memprune: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
