"""Acceptance probe of issue 14: bad and hostile inputs and faults against the public API and the `memprune`
CLI, each in a fresh process, as a new user would try them.

    python scripts/probe_bad_input.py                 # every case (7-12 minutes on 2 cores, calibration included)
    python scripts/probe_bad_input.py --list          # the cases: name, area, what is expected
    python scripts/probe_bad_input.py --only 'i6_*'   # some of them (a name or a glob; repeatable)

Each case runs in its own directory and session, with its own copy of one pre-filled calibration cache
(calibrated once, in `$MEMPRUNE_CACHE_DIR/bad-input-probe`, else in the temp dir), under a hard timeout.
A case is Python lines run by `_bad_inputs/child.py` (the names they use are defined there) or a `memprune`
command line; `setup` lines run first, in a process of their own. The machinery (running a case, its
post-conditions, the classification below) is `_bad_inputs/harness.py`. The outcome is classified:

    clear      an expected error: exit != 0, no traceback, and the last line of output names what was
               wrong (every entry of `names`; `a|b` = either); or an expected acceptance: exit 0 and the
               case's post-condition holds (a warning printed, a trial's end state and reason)
    traceback  "Traceback" or a stack frame (`File "...", line N`, also flattened into one line) in the output
    silent     any other wrong outcome: accepted where an error or a warning was due, an error that does not
               name what was wrong, a refusal of what should be accepted, a post-condition that does not hold
    hang       the timeout fired

After each case the probe counts the trials left RUNNING in the case's SQLite files (`running_left`) and the
processes of the case still alive (in its session, or carrying its marker in their environment: `strays`),
and kills those. It prints one line per case that is not clear or left something behind, then

    BAD_INPUT cases=<n> clear=<c> traceback=<t> silent=<s> hang=<h> running_left=<r> strays=<p>
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _bad_inputs.harness import (
    CALIB,
    GUARD,
    RUNNER,
    A,
    Case,
    E,
    EA,
    Outcome,
    checked_or_documented,
    every_trial,
    fact,
    has_gpu,
    no_running,
    no_study,
    prepare_cache,
    prints,
    reasons,
    run_case,
    short_line,
    trial,
    warns,
)

# -- the cases ------------------------------------------------------------------------------------

PRED = ["predict", "sb3", "--algo", "dqn", "--env", "CartPole-v1"]
WORKER = [
    "worker",
    "_bad_inputs.objectives:quick",
    "--storage",
    "sqlite:///study.db",
    "--study",
    "s",
    "--n-trials",
    "1",
    "--no-progress",
]
FOOTPRINT = ["--footprint", "_bad_inputs.objectives:footprint", "--ram", "1GiB"]
REPORT = ["report", "sqlite:///study.db"]
TORCH = "import torch\nfrom optuna_memprune.estimate import torch_training as tt\nnet = lambda: torch.nn.Linear(4, 2)\n"
EST = "from optuna_memprune.estimate import replay_buffer as rb, rollout_buffer, deque_buffer, array, process\n"
ONE_STUDY = "inproc(n_trials=1)"
SLOW = "time limit|timed out|took|seconds|timeout"
OVERSIZED = "host|never fit|exceed|larger"
GOOD_BUDGET = 'omp.Budget(ram="1GiB")'

CASES: list[Case] = [
    # ---- issue 14, item by item --------------------------------------------------------------------
    A(
        "i1_reaper_of_another_storage",
        RUNNER,
        "faults.worker_killed_then_rerun(other_storage_between=True)",
        trial(0, "FAIL", reason="died", db="c.db"),
        timeout=120,
    ),
    A(
        "i1_runner_killed_then_rerun",
        RUNNER,
        "faults.worker_killed_then_rerun(other_storage_between=False)",
        trial(0, "FAIL", reason="died", db="c.db"),
        timeout=120,
    ),
    A(
        "i1_report_shows_running_trial",
        RUNNER,
        REPORT,
        prints("RUNNING"),
        setup=ONE_STUDY + "\nstudy().ask()",
        running_ok=True,
    ),
    A(
        "i1_report_says_runner_dead",
        RUNNER,
        REPORT,
        prints("RUNNING(.|\n)*(dead|died|gone)"),
        setup="faults.leave_running_trial()",
        running_ok=True,
        timeout=90,
    ),
    EA(
        "i2_budget_larger_than_host",
        RUNNER,
        "run(guard(budget=omp.Budget(ram=4 * host_total)))",
        "host",
        warns(OVERSIZED),
    ),
    E("i3_budget_threads_1", GUARD, "inproc(guard(budget=omp.Budget(threads=1)), n_trials=1)", "threads"),
    E("i3_budget_ram_0", GUARD, "inproc(guard(budget=omp.Budget(ram=0)), n_trials=1)", "ram"),
    E("i3_budget_ram_1_byte", GUARD, "inproc(guard(budget=omp.Budget(ram=1)), n_trials=1)", "ram"),
    E("i3_budget_ram_str_0.4", GUARD, "inproc(guard(budget=omp.Budget(ram='0.4')), n_trials=1)", "ram"),
    A(
        "i4_slow_footprint_runner",
        GUARD,
        "run(guard(o.slow_footprint), n_trials=1)",
        trial(0, decision="unchecked", reason=SLOW),
        timeout=75,
    ),
    A(
        "i4_slow_footprint_in_process",
        GUARD,
        "inproc(guard(o.slow_footprint), n_trials=1)",
        trial(0, decision="unchecked", reason=SLOW),
        timeout=75,
    ),
    A(
        "i4_slow_footprint_runner_killed",
        GUARD,
        "faults.slow_footprint_then_killed()",
        trial(0, "COMPLETE"),
        timeout=120,
    ),  # its objective had returned: its state is written first
    A("i5_footprint_raises", GUARD, "inproc(guard(o.raising_footprint), n_trials=4)", warns("footprint")),
    A("i5_footprint_returns_none", GUARD, "inproc(guard(o.none_footprint), n_trials=4)", warns("footprint")),
    A("i5_footprint_returns_dict", GUARD, "inproc(guard(o.dict_footprint), n_trials=4)", warns("footprint")),
    # "raise" lets the footprint's own error leave study.optimize (trial #0 FAIL); Optuna logs every error that
    # leaves an objective with its traceback, its own log and not the guard's, so the case runs Optuna at ERROR.
    E(
        "i5_on_footprint_error_raise",
        GUARD,
        "optuna.logging.set_verbosity(optuna.logging.ERROR)\n"
        "inproc(guard(o.raising_footprint, on_footprint_error='raise'), n_trials=1)",
        "exploded",
        post=trial(0, "FAIL", decision="unchecked", reason="exploded"),
    ),
    A(
        "i5_vram_budget_without_gpu",
        GUARD,
        "inproc(guard(budget=omp.Budget(ram='1GiB', vram='8GiB')), n_trials=1)",
        warns("VRAM|GPU"),
    ),
    E("i5_monitor_interval_inf", GUARD, "inproc(guard(monitor_interval=float('inf')), n_trials=1)", "monitor_interval"),
    E("i5_monitor_interval_1e-9", GUARD, "guard(monitor_interval=1e-9)", "monitor_interval"),
    E("i5_budget_ram_1e30TiB", GUARD, "omp.Budget(ram='1e30TiB')", "ram"),
    E("i5_predict_buffer_1e99", CALIB, [*PRED, "buffer_size=1e99"], "buffer_size"),
    E(
        "i6_worker_objective_not_callable",
        CALIB,
        ["worker", "_bad_inputs.objectives:os", *WORKER[2:], *FOOTPRINT],
        "objective",
        post=no_study(),
    ),
    E(
        "i6_worker_guard_is_a_footprint",
        CALIB,
        [*WORKER, "--guard", "_bad_inputs.objectives:footprint"],
        "--guard",
        post=no_study(),
    ),
    E(
        "i6_worker_n_workers_0",
        CALIB,
        [*WORKER, *FOOTPRINT, "--n-workers", "0"],
        "n-workers|n_workers",
        post=no_study(),
    ),
    E(
        "i6_worker_n_trials_negative",
        CALIB,
        [*WORKER, *FOOTPRINT, "--n-trials", "-1"],
        "n-trials|n_trials",
        post=no_study(),
    ),
    E(
        "i6_worker_cache_dir_unwritable",
        CALIB,
        [*WORKER, *FOOTPRINT],
        "{cache}",
        readonly=True,
        setup="os.chmod(os.environ['MEMPRUNE_CACHE_DIR'], 0o555)",
    ),
    E(
        "i6_worker_ledger_corrupt",
        RUNNER,
        [*WORKER, *FOOTPRINT],
        "ledger",
        setup="write(ledger_file(), os.urandom(8192))",
    ),
    E(
        "i6_cache_dir_is_a_file",
        CALIB,
        [*PRED, "buffer_size=1000"],
        "{dir}/cachefile",
        setup="write('cachefile', 'x')",
        env={"MEMPRUNE_CACHE_DIR": "{dir}/cachefile"},
    ),
    A(
        "i6_calibration_json_wrong_types",
        CALIB,
        [*PRED, "buffer_size=1000"],
        prints("TOTAL"),
        setup="edit_calibration(lambda d: {**d, 'stacks': {k: {'points': 'x'} for k in d['stacks']}})",
        timeout=90,
    ),
    E("i6_predict_frame_stack_negative", CALIB, [*PRED, "--frame-stack", "-2"], "frame-stack|frame_stack"),
    E(
        "i6_worker_readonly_db",
        CALIB,
        [*WORKER, *FOOTPRINT],
        "read-only|readonly|read only",
        readonly=True,
        setup=ONE_STUDY + "\nos.chmod('study.db', 0o444)",
    ),
    EA(
        "i6_report_readonly_db",
        RUNNER,
        REPORT,
        "read-only|readonly|read only",
        prints("study 's'"),
        readonly=True,
        setup=ONE_STUDY + "\nos.chmod('study.db', 0o444)",
    ),
    E(
        "i6_ctrl_c_worker",
        CALIB,
        "faults.interrupt_worker()",
        rc=130,
        post=fact("sigint_to_exit_s", lambda s: s < 10, "< 10 s"),
        timeout=90,
    ),
    E(
        "i6_ctrl_c_calibrate_parent_only",
        CALIB,
        "faults.interrupt_calibrate_parent()",
        rc=130,
        post=fact("sigint_to_exit_s", lambda s: s < 1.5, "< 1.5 s"),
        timeout=90,
    ),
    E(
        "i6_predict_unknown_env",
        CALIB,
        ["predict", "sb3", "--algo", "dqn", "--env", "NoSuchEnv-v0"],
        "unknown env",
        "NoSuchEnv-v0",
        post=short_line(),
    ),
    A(
        "i7_concurrent_calibrations",
        CALIB,
        "faults.concurrent_calibrations()",
        fact("remeasured", lambda v: v == [], "== [] (neither env lost)"),
        timeout=180,
    ),
    A(
        "i8_conditional_param_first_seen",
        GUARD,
        "g = guard(o.conditional_footprint, search_space=None)\ns = study(g)\n"
        "for kind in 'abb':\n    s.enqueue_trial({'kind': kind})\n"
        "s.optimize(g.wrap_objective(o.conditional), n_trials=3)",
        reasons(absent="KeyError", present="first seen|first appear|new param|not in the search space"),
    ),
    A(
        "i8_first_trial_without_search_space",
        GUARD,
        "inproc(guard(search_space=None), n_trials=1)",
        checked_or_documented,
    ),
    # ---- Budget ------------------------------------------------------------------------------------
    E("budget_ram_negative", GUARD, "omp.Budget(ram=-1)", "ram"),
    E("budget_ram_negative_text", GUARD, "omp.Budget(ram='-6GiB')", "ram"),
    E("budget_ram_nan", GUARD, "omp.Budget(ram=float('nan'))", "ram"),
    E("budget_ram_inf", GUARD, "omp.Budget(ram=float('inf'))", "ram"),
    E("budget_ram_6_gigs", GUARD, "omp.Budget(ram='6 gigs')", "ram"),
    E("budget_ram_list", GUARD, "omp.Budget(ram=['6GiB'])", "ram"),
    E("budget_ram_bool", GUARD, "omp.Budget(ram=True)", "ram"),
    E("budget_ram_empty_text", GUARD, "omp.Budget(ram='')", "ram"),
    E("budget_ram_fraction_of_byte", GUARD, "omp.Budget(ram=1.5)", "ram"),
    E("budget_ram_10e40", GUARD, "omp.Budget(ram=10**40)", "ram"),
    E("budget_vram_negative", GUARD, "omp.Budget(vram='-1GiB')", "vram"),
    E("budget_vram_1e30TiB", GUARD, "omp.Budget(vram='1e30TiB')", "vram"),
    E("budget_threads_0", GUARD, "omp.Budget(threads=0)", "threads"),
    E("budget_threads_negative", GUARD, "omp.Budget(threads=-4)", "threads"),
    E("budget_threads_fraction", GUARD, "omp.Budget(threads=2.5)", "threads"),
    E("budget_threads_text", GUARD, "omp.Budget(threads='16')", "threads"),
    E("budget_threads_bool", GUARD, "omp.Budget(threads=True)", "threads"),
    E("budget_threads_1e9", GUARD, "omp.Budget(threads=10**9)", "threads"),
    E("budget_unknown_keyword", GUARD, "omp.Budget(memory='6GiB')", "memory"),
    E("budget_unlimited_guard", GUARD, "guard(budget=omp.Budget())", "budget"),
    # ---- MemoryGuard -------------------------------------------------------------------------------
    E("guard_on_infeasible_typo", GUARD, "guard(on_infeasible='clip')", "on_infeasible"),
    E("guard_on_infeasible_none", GUARD, "guard(on_infeasible=None)", "on_infeasible"),
    E("guard_soft_0", GUARD, "guard(soft=0)", "soft"),
    E("guard_soft_1.5", GUARD, "guard(soft=1.5)", "soft"),
    E("guard_soft_negative", GUARD, "guard(soft=-0.1)", "soft"),
    E("guard_soft_nan", GUARD, "guard(soft=float('nan'))", "soft"),
    E("guard_soft_text", GUARD, "guard(soft='0.9')", "soft"),
    E("guard_monitor_interval_0", GUARD, "guard(monitor_interval=0)", "monitor_interval"),
    E("guard_monitor_interval_nan", GUARD, "guard(monitor_interval=float('nan'))", "monitor_interval"),
    E("guard_monitor_interval_text", GUARD, "guard(monitor_interval='0.1')", "monitor_interval"),
    E("guard_monitor_interval_negative", GUARD, "guard(monitor_interval=-1)", "monitor_interval"),
    E("guard_monitor_interval_hour", GUARD, "guard(monitor_interval=3600)", "monitor_interval"),
    E("guard_footprint_text", GUARD, f"omp.MemoryGuard('footprint', {GOOD_BUDGET})", "footprint"),
    E("guard_footprint_none", GUARD, f"omp.MemoryGuard(None, {GOOD_BUDGET})", "footprint"),
    E("guard_budget_text", GUARD, "omp.MemoryGuard(o.footprint, '6GiB')", "budget"),
    E("guard_budget_dict", GUARD, "omp.MemoryGuard(o.footprint, {'ram': '6GiB'})", "budget"),
    E("guard_search_space_tuples", GUARD, "guard(search_space={'mb': (8, 64)})", "search_space"),
    E("guard_search_space_list", GUARD, "guard(search_space=['mb'])", "search_space"),
    E("guard_search_space_text_dist", GUARD, "guard(search_space={'mb': 'int'})", "search_space"),
    E("guard_clamp_not_in_space", GUARD, "guard(clamp=['nope'])", "nope"),
    E("guard_clamp_text", GUARD, "guard(clamp='mb')", "clamp"),
    E("guard_clamp_with_reject", GUARD, "guard(clamp=['mb'], on_infeasible='reject')", "clamp"),
    EA(
        "guard_clamp_unknown_without_space",
        GUARD,
        "inproc(guard(clamp=['nope'], search_space=None), n_trials=2)",
        "nope",
        warns("nope"),
    ),
    A("guard_footprint_returns_int", GUARD, "inproc(guard(o.int_footprint), n_trials=4)", warns("footprint")),
    A(
        "guard_footprint_negative_component",
        GUARD,
        "inproc(guard(o.negative_footprint), n_trials=4)",
        warns("footprint"),
    ),
    A(
        "guard_footprint_petabyte",
        GUARD,
        "inproc(guard(o.huge_footprint), n_trials=1)",
        trial(0, "PRUNED", decision="rejected", reason="over budget"),
    ),
    E("guard_wrap_sampler_text", GUARD, "guard().wrap_sampler('tpe')", "sampler"),
    E("guard_wrap_pruner_text", GUARD, "guard().wrap_pruner('median')", "pruner"),
    E("guard_wrap_objective_int", GUARD, "guard().wrap_objective(42)", "objective"),
    A("guard_hyperband_pruner", GUARD, "guard().wrap_pruner(optuna.pruners.HyperbandPruner())", warns("Hyperband")),
    A("guard_n_jobs_2", GUARD, "inproc(n_trials=2, n_jobs=2)", warns("n_jobs|threads of one process")),
    A(
        "guard_plain_sampler_in_process",
        GUARD,
        "g = guard()\nstudy(g, wrap=False).optimize(g.wrap_objective(o.quick), n_trials=1)",
        warns("sampler"),
    ),
    A(
        "guard_objective_grows_past_budget",
        GUARD,
        "inproc(guard(budget=omp.Budget(ram='600MiB')), o.grow, n_trials=1)",
        trial(0, "PRUNED", decision="stopped|soft_pruned"),
    ),
    # ---- estimators, Footprint.of, process ---------------------------------------------------------
    E("est_torch_shape_negative", CALIB, TORCH + "tt(net, (-1,), batch_size=8)", "input_shape"),
    E("est_torch_shape_text", CALIB, TORCH + "tt(net, '84x84', batch_size=8)", "input_shape"),
    E("est_torch_shape_mismatch", CALIB, TORCH + "tt(net, (8,), batch_size=8)", "input_shape|shape"),
    E("est_torch_dtype_float8", CALIB, TORCH + "tt(net, (4,), batch_size=8, dtype='float8')", "dtype"),
    E("est_torch_input_dtype_int3", CALIB, TORCH + "tt(net, (4,), batch_size=8, input_dtype='int3')", "input_dtype"),
    E("est_torch_optimizer_typo", CALIB, TORCH + "tt(net, (4,), batch_size=8, optimizer='adamx')", "optimizer"),
    E(
        "est_torch_optimizer_kwarg_typo",
        CALIB,
        TORCH + "tt(net, (4,), batch_size=8, optimizer=('sgd', {'momentun': 0.9}))",
        "momentun",
    ),
    E("est_torch_batch_0", CALIB, TORCH + "tt(net, (4,), batch_size=0)", "batch_size"),
    E("est_torch_batch_negative", CALIB, TORCH + "tt(net, (4,), batch_size=-8)", "batch_size"),
    E("est_torch_batch_fraction", CALIB, TORCH + "tt(net, (4,), batch_size=2.5)", "batch_size"),
    E("est_torch_batch_text", CALIB, TORCH + "tt(net, (4,), batch_size='32')", "batch_size"),
    E("est_torch_batch_1e15", CALIB, TORCH + "tt(net, (4,), batch_size=10**15)", "batch_size"),
    E("est_torch_model_int", CALIB, TORCH + "tt(5, (4,), batch_size=8)", "model"),
    E("est_torch_device_tpu", CALIB, TORCH + "tt(net, (4,), batch_size=8, device='tpu')", "device"),
    E(
        "est_torch_accumulation_0",
        CALIB,
        TORCH + "tt(net, (4,), batch_size=8, accumulation_steps=0)",
        "accumulation_steps",
    ),
    E("est_torch_autocast_float8", CALIB, TORCH + "tt(net, (4,), batch_size=8, autocast='float8')", "autocast"),
    E("est_torch_frozen_negative", CALIB, TORCH + "tt(net, (4,), batch_size=8, frozen=-1)", "frozen"),
    E("est_replay_size_0", CALIB, EST + "rb((4,), 'float32', (1,), 'int64', buffer_size=0)", "buffer_size"),
    E("est_replay_size_negative", CALIB, EST + "rb((4,), 'float32', (1,), 'int64', buffer_size=-5)", "buffer_size"),
    E("est_replay_size_1e30", CALIB, EST + "rb((4,), 'float32', (1,), 'int64', buffer_size=10**30)", "buffer_size"),
    E("est_replay_n_envs_0", CALIB, EST + "rb((4,), 'float32', (1,), 'int64', buffer_size=100, n_envs=0)", "n_envs"),
    E(
        "est_replay_obs_shape_negative",
        CALIB,
        EST + "rb((-84, 84), 'uint8', (1,), 'int64', buffer_size=100)",
        "obs_shape",
    ),
    E("est_replay_dtype_float7", CALIB, EST + "rb((4,), 'float7', (1,), 'int64', buffer_size=100)", "obs_dtype|dtype"),
    E(
        "est_replay_memory_opt_with_timeouts",
        CALIB,
        EST + "rb((4,), 'float32', (1,), 'int64', buffer_size=100, optimize_memory_usage=True)",
        "optimize_memory_usage",
    ),
    E(
        "est_replay_steps_negative",
        CALIB,
        EST + "rb((4,), 'float32', (1,), 'int64', buffer_size=100, steps=-1)",
        "steps",
    ),
    E("est_rollout_n_steps_0", CALIB, EST + "rollout_buffer((4,), 'float32', (1,), 'float32', n_steps=0)", "n_steps"),
    E("est_deque_maxlen_0", CALIB, EST + "deque_buffer([((4,), 'float32'), int], maxlen=0)", "maxlen"),
    E("est_deque_bad_item", CALIB, EST + "deque_buffer([((4,), 'float32'), 'img'], maxlen=10)", "transition|img"),
    E("est_array_shape_negative", CALIB, EST + "array((-1, 4), 'uint8')", "shape"),
    E("est_array_touched_1.5", CALIB, EST + "array((4,), 'uint8', touched=1.5)", "touched"),
    E("est_footprint_of_ram_negative", CALIB, "omp.Footprint.of(ram=-1)", "ram"),
    E("est_footprint_of_ram_words", CALIB, "omp.Footprint.of(ram='lots')", "ram"),
    E("est_footprint_of_ram_nan", CALIB, "omp.Footprint.of(ram=float('nan'))", "ram"),
    E("est_footprint_of_threads_negative", CALIB, "omp.Footprint.of(threads=-2)", "threads"),
    E("est_footprint_of_threads_fraction", CALIB, "omp.Footprint.of(threads=2.5)", "threads"),
    E("est_footprint_of_kind_unknown", CALIB, "omp.Footprint.of(ram=1, kind='weird')", "kind"),
    E("est_process_unknown_stack", CALIB, EST + "process('tensorflow')", "stack"),
    E("est_process_torch_threads_0", CALIB, EST + "process('torch', torch_threads=0)", "torch_threads"),
    E("est_process_extra_threads_negative", CALIB, EST + "process('torch', extra_threads=-1)", "extra_threads"),
    # ---- omp.optimize ------------------------------------------------------------------------------
    E("opt_n_jobs_0", RUNNER, "run(n_jobs=0)", "n_jobs"),
    E("opt_n_jobs_negative", RUNNER, "run(n_jobs=-2)", "n_jobs"),
    E("opt_n_jobs_text", RUNNER, "run(n_jobs='2')", "n_jobs"),
    E("opt_n_trials_negative", RUNNER, "run(n_trials=-1)", "n_trials"),
    E("opt_n_trials_text", RUNNER, "run(n_trials='3')", "n_trials"),
    E("opt_timeout_negative", RUNNER, "run(timeout=-1)", "timeout"),
    E("opt_timeout_nan", RUNNER, "run(timeout=float('nan'))", "timeout"),
    E("opt_objective_lambda", RUNNER, "run(objective=lambda t: t.suggest_int('mb', 8, 64))", "objective", "pickl"),
    E("opt_objective_raises", RUNNER, "run(objective=o.raises, n_trials=1)", "bad config", post=trial(0, "FAIL")),
    A("opt_objective_raises_caught", RUNNER, "run(objective=o.raises, catch=(o.UserError,))", every_trial("FAIL")),
    A("opt_objective_returns_nan", RUNNER, "run(objective=o.returns_nan, n_trials=1)", trial(0, "FAIL")),
    A("opt_objective_returns_none", RUNNER, "run(objective=o.returns_none, n_trials=1)", trial(0, "FAIL")),
    A("opt_objective_returns_text", RUNNER, "run(objective=o.returns_text, n_trials=1)", trial(0, "FAIL")),
    A("opt_objective_exits", RUNNER, "run(objective=o.exits, n_trials=1)", trial(0, "FAIL", reason="exit|status|3")),
    A(
        "opt_objective_leaves_grandchild",
        RUNNER,
        "run(objective=o.leaves_grandchild, n_trials=1)",
        trial(0, "COMPLETE"),
    ),
    A(
        "opt_objective_grows_past_budget",
        RUNNER,
        "run(guard(budget=omp.Budget(ram='600MiB')), o.grow, n_trials=1)",
        trial(0, "PRUNED", decision="stopped|soft_pruned"),
    ),
    A(
        "opt_trial_process_sigkilled",
        RUNNER,
        "faults.trial_process_killed()",
        trial(0, "FAIL", reason="SIGKILL"),
        timeout=90,
    ),
    A("opt_runner_sigterm", RUNNER, "faults.terminate_worker()", no_running(), timeout=90),
    E(
        "opt_in_memory_study",
        RUNNER,
        "omp.optimize(optuna.create_study(), o.quick, guard=guard(), n_trials=1)",
        "storage|memory",
    ),
    E("opt_study_is_a_path", RUNNER, "omp.optimize('study.db', o.quick, guard=guard(), n_trials=1)", "study"),
    E("opt_guard_none", RUNNER, "omp.optimize(study(), o.quick, guard=None, n_trials=1)", "guard"),
    E("opt_catch_text", RUNNER, "run(catch='ValueError')", "catch"),
    E("opt_callbacks_not_callable", RUNNER, "run(callbacks=[5])", "callback"),
    E("opt_host_text", RUNNER, "run(host='8GiB')", "host"),
    EA(
        "opt_host_smaller_than_trial",
        RUNNER,
        "run(host=omp.HostBudget(ram='64MiB', gpus=None), n_trials=1)",
        "host",
        trial(0, "PRUNED", reason="host"),
    ),
    E("opt_host_headroom_1", RUNNER, "omp.HostBudget(headroom=1.0)", "headroom"),
    E("opt_host_ram_words", RUNNER, "omp.HostBudget(ram='lots')", "ram"),
    E("opt_host_gpus_all", RUNNER, "omp.HostBudget(gpus='all')", "gpus"),
    E("opt_on_host_full_typo", RUNNER, "run(on_host_full='queue')", "on_host_full"),
    A("opt_plain_sampler", RUNNER, "g = guard()\nrun(g, s=study(g, wrap=False), n_trials=1)", warns("sampler")),
    # ---- memprune report ---------------------------------------------------------------------------
    E("report_missing_file", RUNNER, ["report", "sqlite:///nope.db"], "nope.db"),
    E("report_bad_url", RUNNER, ["report", "foo://bar"], "foo://bar"),
    E("report_words_as_url", RUNNER, ["report", "just words"], "just words"),
    E("report_directory_as_storage", RUNNER, ["report", "{dir}"], "{dir}"),
    E("report_unknown_study", RUNNER, [*REPORT, "--study", "nope"], "nope", setup=ONE_STUDY),
    E(
        "report_two_studies_unnamed",
        RUNNER,
        REPORT,
        "--study",
        setup=ONE_STUDY + "\nstudy(name='t').optimize(lambda t: 0.0, n_trials=1)",
    ),
    E(
        "report_no_guarded_trials",
        RUNNER,
        REPORT,
        "guarded",
        setup="study(wrap=False).optimize(lambda t: t.suggest_int('mb', 8, 64), n_trials=1)",
    ),
    E("report_empty_study", RUNNER, REPORT, "trials|guarded", setup="study()"),
    E(
        "report_journal_not_a_journal",
        RUNNER,
        ["report", "j.log"],
        "j.log",
        setup="write('j.log', 'not a journal\\n{]')",
    ),
    E("report_corrupt_sqlite", RUNNER, REPORT, "study.db", setup="write('study.db', os.urandom(8192))"),
    E("report_no_storage", RUNNER, ["report"], "storage|OPTUNA_STORAGE"),
    E("report_env_storage_garbage", RUNNER, ["report"], "garbage", env={"OPTUNA_STORAGE": "garbage"}),
    E("report_output_dir_missing", RUNNER, [*REPORT, "-f", "json", "-o", "nodir/r.json"], "nodir", setup=ONE_STUDY),
    E("report_format_pdf", RUNNER, [*REPORT, "-f", "pdf"], "pdf", setup=ONE_STUDY),
    E(
        "report_api_corrupt_sqlite",
        RUNNER,
        "report.load('sqlite:///study.db')",
        "study.db",
        setup="write('study.db', os.urandom(8192))",
    ),
    # ---- memprune worker ---------------------------------------------------------------------------
    E("worker_no_arguments", CALIB, ["worker"], "objective"),
    E(
        "worker_no_study_name",
        CALIB,
        ["worker", "_bad_inputs.objectives:quick", "--storage", "sqlite:///study.db", *FOOTPRINT],
        "--study",
    ),
    E("worker_objective_module_missing", CALIB, ["worker", "nowhere:objective", *WORKER[2:], *FOOTPRINT], "nowhere"),
    E("worker_objective_without_colon", CALIB, ["worker", "quick", *WORKER[2:], *FOOTPRINT], "quick"),
    E(
        "worker_objective_attr_missing",
        CALIB,
        ["worker", "_bad_inputs.objectives:nope", *WORKER[2:], *FOOTPRINT],
        "nope",
    ),
    E("worker_guard_not_a_guard", CALIB, [*WORKER, "--guard", "_bad_inputs.objectives:NOT_A_GUARD"], "--guard"),
    E("worker_no_guard", CALIB, WORKER, "guard"),
    E("worker_ram_words", CALIB, [*WORKER, "--footprint", "_bad_inputs.objectives:footprint", "--ram", "lots"], "lots"),
    E(
        "worker_threads_0",
        CALIB,
        [*WORKER, "--footprint", "_bad_inputs.objectives:footprint", "--threads", "0"],
        "threads",
    ),
    E("worker_threads_words", CALIB, [*WORKER, *FOOTPRINT, "--threads", "many"], "threads"),
    E(
        "worker_n_workers_negative",
        CALIB,
        [*WORKER, *FOOTPRINT, "--n-workers", "-1"],
        "n-workers|n_workers",
        post=no_study(),
    ),
    E("worker_timeout_negative", CALIB, [*WORKER, *FOOTPRINT, "--timeout", "-5"], "timeout", post=no_study()),
    E("worker_storage_unknown_dialect", CALIB, [*WORKER, *FOOTPRINT, "--storage", "nosuchdb://x"], "nosuchdb"),
    E("worker_storage_dir_missing", CALIB, [*WORKER, *FOOTPRINT, "--storage", "sqlite:///nodir/x.db"], "nodir"),
    E(
        "worker_storage_corrupt_sqlite",
        CALIB,
        [*WORKER, *FOOTPRINT],
        "study.db",
        setup="write('study.db', os.urandom(8192))",
    ),
    E(
        "worker_storage_journal_not_a_journal",
        CALIB,
        [*WORKER, *FOOTPRINT, "--storage", "j.log"],
        "j.log",
        setup="write('j.log', 'not a journal\\n{]')",
    ),
    E("worker_headroom_1.5", CALIB, [*WORKER, *FOOTPRINT, "--headroom", "1.5"], "headroom", post=no_study()),
    E("worker_host_ram_words", CALIB, [*WORKER, *FOOTPRINT, "--host-ram", "lots"], "lots", post=no_study()),
    E("worker_host_gpus_words", CALIB, [*WORKER, *FOOTPRINT, "--host-gpus", "lots"], "gpus", post=no_study()),
    E("worker_host_threads_0", CALIB, [*WORKER, *FOOTPRINT, "--host-threads", "0"], "threads", post=no_study()),
    E("worker_ledger_unknown_dialect", CALIB, [*WORKER, *FOOTPRINT, "--ledger", "nosuchdb://x"], "nosuchdb|ledger"),
    E("worker_host_id_empty", CALIB, [*WORKER, *FOOTPRINT, "--host-id", ""], "host"),
    E("worker_sampler_unknown", CALIB, [*WORKER, *FOOTPRINT, "--sampler", "cmaes"], "cmaes"),
    E("worker_option_typo", CALIB, [*WORKER, *FOOTPRINT, "--trials", "5"], "--trials"),
    # --direction given against the study's own (without it the worker runs an existing study as it is)
    EA(
        "worker_direction_mismatch",
        CALIB,
        [*WORKER, *FOOTPRINT, "--direction", "minimize"],
        "direction",
        warns("direction"),
        setup="study(direction='maximize').optimize(lambda t: t.suggest_int('mb', 8, 64), n_trials=1)",
    ),
    EA(
        "worker_guard_and_footprint",
        CALIB,
        [*WORKER, *FOOTPRINT, "--guard", "_bad_inputs.objectives:make_guard"],
        "--footprint|--guard",
        warns("--footprint|--guard"),
    ),
    # ---- memprune predict, calibrate and the command itself --------------------------------------------
    E("predict_no_recipe", CALIB, ["predict"], "recipe"),
    E("predict_unknown_recipe", CALIB, ["predict", "keras"], "keras"),
    E("predict_no_algo", CALIB, ["predict", "sb3", "--env", "CartPole-v1"], "--algo"),
    E("predict_unknown_algo", CALIB, ["predict", "sb3", "--algo", "dqnn", "--env", "CartPole-v1"], "dqnn"),
    E("predict_empty_env", CALIB, ["predict", "sb3", "--algo", "dqn", "--env", ""], "env"),
    E("predict_param_syntax", CALIB, [*PRED, "buffer_size:100"], "buffer_size:100"),
    EA("predict_unknown_param", CALIB, [*PRED, "buffersize=1000"], "buffersize", warns("buffersize")),
    E("predict_buffer_negative", CALIB, [*PRED, "buffer_size=-5"], "buffer_size"),
    E("predict_buffer_0", CALIB, [*PRED, "buffer_size=0"], "buffer_size"),
    E("predict_buffer_words", CALIB, [*PRED, "buffer_size=big"], "buffer_size"),
    E("predict_batch_1e15", CALIB, [*PRED, "batch_size=1e15"], "batch_size"),
    E("predict_n_envs_0", CALIB, [*PRED, "--n-envs", "0"], "n-envs|n_envs"),
    E("predict_format_xml", CALIB, [*PRED, "-f", "xml"], "xml"),
    E("predict_net_arch_negative", CALIB, [*PRED, "net_arch=[-64,64]"], "net_arch"),
    E("predict_net_arch_unknown_name", CALIB, [*PRED, "net_arch=giant"], "net_arch|giant"),
    E(
        "predict_ppo_n_steps_0",
        CALIB,
        ["predict", "sb3", "--algo", "ppo", "--env", "CartPole-v1", "n_steps=0"],
        "n_steps",
    ),
    E("predict_torch_threads_0", CALIB, [*PRED, "torch_threads=0"], "torch_threads"),
    E("predict_memory_opt_maybe", CALIB, [*PRED, "optimize_memory_usage=maybe"], "optimize_memory_usage"),
    E("calibrate_unknown_env", CALIB, ["calibrate", "--env", "NoSuchEnv-v0"], "NoSuchEnv-v0", post=short_line()),
    E("calibrate_format_yaml", CALIB, ["calibrate", "-f", "yaml"], "yaml"),
    E("calibrate_env_without_value", CALIB, ["calibrate", "--env"], "--env"),
    E("cli_no_command", CALIB, [], "command"),
    E("cli_unknown_command", CALIB, ["train"], "train"),
    E("cli_verbose_and_quiet", CALIB, ["-v", "-q", "calibrate"], "-q|--quiet|-v|--verbose"),
    # ---- the calibration cache ---------------------------------------------------------------------
    A(
        "cache_json_truncated",
        CALIB,
        EST + "process('torch')",
        setup="calibration().write_text(calibration().read_text()[:200])",
        timeout=90,
    ),
    A("cache_json_a_list", CALIB, EST + "process('torch')", setup="calibration().write_text('[]')", timeout=90),
    A("cache_json_binary", CALIB, EST + "process('torch')", setup="write(calibration(), os.urandom(512))", timeout=90),
    A(
        "cache_json_points_null",
        CALIB,
        EST + "process('torch')",
        timeout=90,
        setup="edit_calibration(lambda d: {**d, 'stacks': {k: {'points': None} for k in d['stacks']}})",
    ),
    A(
        "cache_json_stacks_int",
        CALIB,
        EST + "process('torch')",
        setup="edit_calibration(lambda d: {**d, 'stacks': 5})",
        timeout=90,
    ),
    EA(
        "cache_file_is_a_directory",
        CALIB,
        EST + "process('torch')",
        "calibration",
        warns("calibration"),
        setup="p = calibration(); p.unlink(); p.mkdir()",
        timeout=90,
    ),
    A(
        "cache_dir_readonly_with_file",
        CALIB,
        [*PRED, "buffer_size=1000"],
        prints("TOTAL"),
        readonly=True,
        setup="os.chmod(os.environ['MEMPRUNE_CACHE_DIR'], 0o555)",
    ),
    EA(
        "cache_dir_readonly_empty",
        CALIB,
        EST + "process('torch')",
        "{cache}",
        warns("cache"),
        readonly=True,
        setup="calibration().unlink(); os.chmod(os.environ['MEMPRUNE_CACHE_DIR'], 0o555)",
        timeout=90,
    ),
    E(
        "cache_dir_is_a_file_calibrate",
        CALIB,
        ["calibrate"],
        "{dir}/cachefile",
        setup="write('cachefile', 'x')",
        env={"MEMPRUNE_CACHE_DIR": "{dir}/cachefile"},
    ),
    E(
        "cache_dir_below_a_file",
        CALIB,
        [*PRED, "buffer_size=1000"],
        "{dir}/cachefile",
        setup="write('cachefile', 'x')",
        env={"MEMPRUNE_CACHE_DIR": "{dir}/cachefile/sub"},
    ),
]


def selected(only: list[str]) -> list[Case]:
    cases = [c for c in CASES if not (c.name == "i5_vram_budget_without_gpu" and has_gpu())]
    if only:
        cases = [c for c in cases if any(fnmatch.fnmatchcase(c.name, pattern) for pattern in only)]
        if not cases:
            sys.exit(f"probe_bad_input: no case matches {only}; see --list")
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", action="append", default=[], metavar="NAME", help="run this case (a glob; repeatable)"
    )
    parser.add_argument("--list", action="store_true", help="list the cases and what each expects")
    parser.add_argument("--jobs", type=int, default=1, help="cases at the same time (default 1)")
    parser.add_argument("--all", action="store_true", help="print the line of every case, the clear ones too")
    parser.add_argument("--keep", action="store_true", help="keep every case's directory (default: the not-clear ones)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="the pre-filled calibration cache to copy")
    args = parser.parse_args()
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)), "case names must be unique"
    cases = selected(args.only)
    if args.list:
        for c in cases:
            print(f"{c.name:42s} {c.area:24s} {c.expected()}")
        print(f"{len(cases)} cases")
        return
    base = args.cache_dir or Path(os.environ.get("MEMPRUNE_CACHE_DIR") or tempfile.gettempdir()) / "bad-input-probe"
    prepare_cache(base)
    work = Path(tempfile.mkdtemp(prefix="memprune-bad-input-"))
    outcomes: list[Outcome] = []
    start = time.monotonic()

    def one(case: Case) -> Outcome:
        outcome = run_case(case, base, work, args.keep)
        outcomes.append(outcome)
        left = f" running_left={outcome.running}" if outcome.running else ""
        left += f" strays={outcome.strays}" if outcome.strays else ""
        print(
            f"[{len(outcomes)}/{len(cases)}] {case.name} {outcome.cls}{left} {outcome.elapsed:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        return outcome

    # preexec_fn (the read-only cases, as root) is unsafe beside threads: those run one by one, after the rest
    alone = [c for c in cases if c.readonly and os.geteuid() == 0 and args.jobs > 1]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        by_name = {o.case.name: o for o in pool.map(one, [c for c in cases if c not in alone])}
    by_name.update({c.name: one(c) for c in alone})
    done = [by_name[c.name] for c in cases]
    counts = {k: sum(o.cls == k for o in done) for k in ("clear", "traceback", "silent", "hang")}
    for o in done:
        if args.all or o.cls != "clear" or o.running or o.strays:
            left = (f" running_left={o.running}" if o.running else "") + (f" strays={o.strays}" if o.strays else "")
            print(f"{o.case.name} {o.cls} [{o.case.area}]{left}: {o.line[:400]}")
    print(f"[probe] {time.monotonic() - start:.0f} s; case directories kept under {work}", file=sys.stderr)
    if not any(work.iterdir()):
        work.rmdir()
    print(
        f"BAD_INPUT cases={len(done)} clear={counts['clear']} traceback={counts['traceback']} "
        f"silent={counts['silent']} hang={counts['hang']} running_left={sum(o.running for o in done)} "
        f"strays={sum(o.strays for o in done)}"
    )


if __name__ == "__main__":
    main()
