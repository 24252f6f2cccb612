"""The guard on a real GPU: VRAM budgets breached in process and process per trial, a real CUDA
out-of-memory error, the monitor's NVML reading against torch's, learned VRAM, the small-card sweep.

Runs only inside a check's own process on a CUDA host (``_gpu.worker``); uses the guard's public names
(``MemoryGuard``, ``optimize``, ``read_record``, ``Budget``, ``Footprint``, ``monitor.Monitor``). The
objectives are module-level functions so that ``omp.optimize``'s trial processes can import them.
"""

from __future__ import annotations

import math
import tempfile
import time
from typing import Any, Callable

from .results import MIB
from .rows import (
    FRAME,
    FRAME_STACK,
    SMALL_CARD_BATCHES,
    SMALL_CARD_BUDGET,
    SMALL_CARD_ENVS,
    SMALL_CARD_STEPS,
    SMALL_CARD_VARIANTS,
    qnet,
    replay_bytes,
)

Emit = Callable[[dict], None]
GIB = 1 << 30
GROW_STEP, GROW_STEPS, GROW_PAUSE_S = 256 * MIB, 48, 0.1  # up to 12 GiB, 2.5 GiB a second
BREACH_BUDGET = "2GiB"
LEARNED_MISS_RATE = 0.2  # a warm-up of 4 trials (README: max(4, ceil((1 - rate) / rate))), 8 trials after it


def _quiet_optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _row(name: str, ok: bool, detail: str, **figures: Any) -> dict:
    return {"check": f"guard {name}", "kind": "guard", "ok": bool(ok), "detail": detail, **figures}


def _record(trial) -> Any:
    import optuna_memprune as omp

    return omp.read_record(trial.user_attrs)


def _decision(trial) -> str:
    rec = _record(trial)
    return rec.decision.value if rec is not None else "no record"


def _gib(x: int | None) -> str:
    return "n/a" if x is None else f"{x / GIB:.2f} GiB"


# -- objectives (module level: importable by a trial's process) -----------------------------------------
def grow(trial) -> float:
    """Allocates GPU memory in steps of 256 MiB, 0.1 s apart, up to 12 GiB: crosses a 2 GiB budget."""
    import torch

    trial.suggest_int("chunk_mib", GROW_STEP // MIB, GROW_STEP // MIB)
    held = []
    for _ in range(GROW_STEPS):
        held.append(torch.ones(GROW_STEP, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        time.sleep(GROW_PAUSE_S)
    return float(len(held))


def oom_or_not(trial) -> float:
    """Holds 1 GiB; with ``big`` asks for twice the GPU's memory (a real CUDA out-of-memory error). Records
    how much torch had reserved when it started: the trial after an out-of-memory one must start empty."""
    import torch

    trial.set_user_attr("reserved_at_start", torch.cuda.memory_reserved() if torch.cuda.is_initialized() else 0)
    big = trial.suggest_categorical("big", [True, False])
    held = torch.ones(GIB, dtype=torch.uint8, device="cuda")
    if big:
        total = torch.cuda.get_device_properties(0).total_memory
        held2 = torch.empty(2 * total, dtype=torch.uint8, device="cuda")
        del held2
    return float(held.sum().item() > 0)


def hold_gib(trial) -> float:
    """Holds ``gib`` GiB for 0.4 s, then frees and empties the cache (each trial's own increment)."""
    import torch

    gib = trial.suggest_int("gib", 1, 8)
    held = torch.ones(gib * GIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    time.sleep(0.4)
    del held
    torch.cuda.empty_cache()
    return float(gib)


def small_card_trial(trial) -> float:
    """studies/qnet_gpu.py's Q-learning step on a GPU replay buffer: n_envs x 2048 stacked uint8 frames and
    the next ones on the GPU, the online and target networks, Adam, 3 updates on sampled batches."""
    import torch
    from torch import nn

    model = trial.suggest_categorical("model", list(SMALL_CARD_VARIANTS))
    batch = trial.suggest_categorical("batch_size", list(SMALL_CARD_BATCHES))
    n_envs = trial.suggest_categorical("n_envs", list(SMALL_CARD_ENVS))
    dev = torch.device("cuda")
    n = n_envs * SMALL_CARD_STEPS
    obs = torch.randint(0, 256, (n, FRAME_STACK, *FRAME), dtype=torch.uint8, device=dev)
    nxt = torch.randint(0, 256, (n, FRAME_STACK, *FRAME), dtype=torch.uint8, device=dev)
    net, target = qnet(SMALL_CARD_VARIANTS[model]).to(dev), qnet(SMALL_CARD_VARIANTS[model]).to(dev)
    target.load_state_dict(net.state_dict())
    target.requires_grad_(False)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    loss_value = 0.0
    for _ in range(3):
        idx = torch.randint(0, n, (batch,), device=dev)
        with torch.no_grad():
            best = target(nxt[idx].float() / 255).max(1).values
        q = net(obs[idx].float() / 255)[:, 0]
        loss = nn.functional.smooth_l1_loss(q, 0.99 * best)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_value = loss.item()
    trial.set_user_attr("torch_max_memory_reserved", torch.cuda.max_memory_reserved())
    return loss_value


def small_card_footprint(p: dict):
    """The small-card trial's VRAM: its training step traced for CUDA plus the replay buffer on the GPU."""
    import optuna_memprune as omp
    from optuna_memprune.estimate import torch_training

    step = torch_training(
        lambda: qnet(SMALL_CARD_VARIANTS[p["model"]]),
        (FRAME_STACK, *FRAME),
        batch_size=p["batch_size"],
        input_dtype="uint8",
        optimizer="adam",
        frozen=1,
        device="cuda",
        cache_key=("gpu_check small card", p["model"]),
    )
    return step + omp.Footprint.of(vram=replay_bytes(p["n_envs"]), name="GPU replay buffer")


# -- checks ---------------------------------------------------------------------------------------------
def _breach_guard():
    import optuna_memprune as omp
    from optuna.distributions import IntDistribution

    mib = GROW_STEP // MIB
    return omp.MemoryGuard(
        lambda p: omp.Footprint.of(vram="512MiB"),
        omp.Budget(vram=BREACH_BUDGET),
        on_infeasible="reject",
        search_space={"chunk_mib": IntDistribution(mib, mib)},
    )


def _study(optuna, guard, **kwargs):
    """A study whose sampler and pruner the guard wraps, as a user writes it (README, DESIGN)."""
    return optuna.create_study(
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)),
        pruner=guard.wrap_pruner(optuna.pruners.NopPruner()),
        **kwargs,
    )


def _breach_row(name: str, study) -> dict:
    optuna = _quiet_optuna()
    trials = study.get_trials(deepcopy=False)
    t = trials[-1]
    rec = _record(t)
    ok = t.state == optuna.trial.TrialState.PRUNED and rec is not None and rec.decision.value == "stopped"
    return _row(
        name,
        ok,
        f"{t.state.name} {_decision(t)}, peak {_gib(rec and rec.peak_vram)} over the "
        f"{BREACH_BUDGET} budget; {rec.reason if rec else ''}"[:280],
        state=t.state.name,
        decision=_decision(t),
        peak_vram=rec and rec.peak_vram,
    )


def breach_in_process(args: dict, emit: Emit) -> None:
    optuna = _quiet_optuna()
    guard = _breach_guard()
    study = _study(optuna, guard)
    study.optimize(guard.wrap_objective(grow), n_trials=1)
    emit(_breach_row("VRAM budget breached in process (wrap_objective)", study))


def breach_per_process(args: dict, emit: Emit) -> None:
    optuna = _quiet_optuna()
    import optuna_memprune as omp

    guard = _breach_guard()
    with tempfile.TemporaryDirectory() as tmp:
        study = _study(optuna, guard, storage=f"sqlite:///{tmp}/breach.db", study_name="breach")
        omp.optimize(study, grow, guard=guard, n_trials=1, show_progress_bar=False)
        emit(_breach_row("VRAM budget breached in process-per-trial (omp.optimize)", study))


def cuda_oom(args: dict, emit: Emit) -> None:
    optuna = _quiet_optuna()
    import optuna_memprune as omp
    import torch
    from optuna.distributions import CategoricalDistribution

    total = torch.cuda.get_device_properties(0).total_memory
    guard = omp.MemoryGuard(
        lambda p: omp.Footprint.of(vram="1536MiB"),
        omp.Budget(vram=int(total * 0.9)),
        on_infeasible="reject",
        search_space={"big": CategoricalDistribution([True, False])},
    )
    study = _study(optuna, guard)
    study.enqueue_trial({"big": True})
    study.enqueue_trial({"big": False})
    study.optimize(guard.wrap_objective(oom_or_not), n_trials=2)
    first, second = study.get_trials(deepcopy=False)[:2]
    constraint = first.system_attrs.get("constraints:memprune_vram")
    start = second.user_attrs.get("reserved_at_start")
    ok = (
        first.state == optuna.trial.TrialState.PRUNED
        and _decision(first) == "out_of_memory"
        and constraint is not None
        and constraint > 0
    )
    emit(
        _row(
            "real CUDA OOM ends PRUNED out_of_memory with a positive constraint",
            ok,
            f"{first.state.name} {_decision(first)}, constraint memprune_vram {constraint}",
            state=first.state.name,
            decision=_decision(first),
            constraint=constraint,
        )
    )
    ok2 = second.state == optuna.trial.TrialState.COMPLETE and start is not None and start < GIB // 2
    emit(
        _row(
            "the trial after the OOM starts with the cache empty",
            ok2,
            f"{second.state.name}, torch reserved at its start {_gib(start)} (the OOM trial held 1 GiB)",
            state=second.state.name,
            reserved_at_start=start,
        )
    )


def nvml_vs_torch(args: dict, emit: Emit) -> None:
    import torch

    from optuna_memprune.monitor import Monitor

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    with Monitor(interval=0.05, gpu="auto", max_timeline=0) as mon:
        time.sleep(0.3)
        before, reserved0 = mon.latest.vram, torch.cuda.memory_reserved()
        held = torch.ones(4 * GIB, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        time.sleep(0.3)
        after, reserved1 = mon.latest.vram, torch.cuda.memory_reserved()
        del held
    if before is None or after is None:
        emit(
            _row(
                "monitor's NVML reading vs torch",
                False,
                "the monitor read no VRAM for this process (NVML gave none: pid namespace, driver)",
            )
        )
        return
    d_nvml, d_torch = after - before, reserved1 - reserved0
    ok = abs(d_nvml - d_torch) <= 32 * MIB
    emit(
        _row(
            "monitor's NVML reading vs torch",
            ok,
            f"4 GiB tensor: NVML +{d_nvml / MIB:.0f} MiB, torch reserved +{d_torch / MIB:.0f} MiB; NVML "
            f"{after / MIB:.0f} MiB in all = reserved {reserved1 / MIB:.0f} + {(after - reserved1) / MIB:.0f} "
            "outside the allocator",
            nvml_before=before,
            nvml_after=after,
            reserved_before=reserved0,
            reserved_after=reserved1,
        )
    )


def learned_vram(args: dict, emit: Emit) -> None:
    optuna = _quiet_optuna()
    import optuna_memprune as omp
    from optuna.distributions import IntDistribution

    n = int(args.get("trials", 12))
    guard = omp.MemoryGuard(
        None,
        omp.Budget(vram="20GiB"),
        learn=omp.estimate.learned(miss_rate=LEARNED_MISS_RATE),
        search_space={"gib": IntDistribution(1, 8)},
    )
    study = _study(optuna, guard)
    study.optimize(guard.wrap_objective(hold_gib), n_trials=n)
    after = []
    for t in study.get_trials(deepcopy=False):
        rec = _record(t)
        if rec is not None and rec.learned.get("phase") == "bound" and rec.pred_vram and rec.peak_vram:
            bound = (rec.learned.get("bound") or {}).get("vram") or rec.pred_vram
            # in a shared process the learned figures are the trial's increment: the peak is over its start
            start = (rec.start_vram or 0) if "vram" in rec.need else 0
            after.append((t.params["gib"], start + rec.pred_vram, start + bound, rec.peak_vram))
    misses = sum(peak > bound for _, _, bound, peak in after)
    ok = bool(after) and misses <= math.ceil(LEARNED_MISS_RATE * len(after))  # the bound's own promise
    emit(
        _row(
            "learned VRAM after its warm-up",
            ok,
            f"{len(after)} of {n} trials predicted from the bound, {misses} peaked above it; "
            + ", ".join(
                f"{g} GiB: fit {p / GIB:.2f} bound {b / GIB:.2f} peak {k / GIB:.2f}" for g, p, b, k in after[:5]
            ),
            trials=after,
            misses=misses,
        )
    )


def small_card(args: dict, emit: Emit) -> None:
    optuna = _quiet_optuna()
    import optuna_memprune as omp
    from optuna.distributions import CategoricalDistribution as Cat

    budget = omp.Budget(vram=SMALL_CARD_BUDGET)
    space = {
        "model": Cat(list(SMALL_CARD_VARIANTS)),
        "batch_size": Cat(list(SMALL_CARD_BATCHES)),
        "n_envs": Cat(list(SMALL_CARD_ENVS)),
    }
    guard = omp.MemoryGuard(small_card_footprint, budget, on_infeasible="reject", search_space=space)
    n = int(args.get("trials", 8))
    with tempfile.TemporaryDirectory() as tmp:
        study = _study(optuna, guard, storage=f"sqlite:///{tmp}/small.db", study_name="small_card")
        omp.optimize(study, small_card_trial, guard=guard, n_trials=n, show_progress_bar=False)
        trials = study.get_trials(deepcopy=False)
    limit = budget.vram
    ran = [(t, _record(t)) for t in trials if _decision(t) not in ("rejected", "no record")]
    over = [(t, r) for t, r in ran if r is not None and r.peak_vram is not None and r.peak_vram > limit]
    unread = [t for t, r in ran if r is None or r.peak_vram is None]  # no NVML figure: nothing was checked
    ok = len(trials) == n and not over and not unread and any(t.state.name == "COMPLETE" for t, _ in ran)
    rows = [
        {
            "params": t.params,
            "state": t.state.name,
            "decision": _decision(t),
            "pred_vram": r and r.pred_vram,
            "peak_vram": r and r.peak_vram,
            "gpu": r and r.gpu,
            "torch_max_reserved": t.user_attrs.get("torch_max_memory_reserved"),
        }
        for t, r in [(t, _record(t)) for t in trials]
    ]
    emit(
        _row(
            f"small card ({SMALL_CARD_BUDGET} VRAM budget, batch and env count swept)",
            ok,
            f"{len(trials)} trials, {len(ran)} ran, {len(trials) - len(ran)} rejected, {len(over)} peaked over "
            f"the budget, {len(unread)} without a VRAM reading; highest peak "
            f"{_gib(max((r.peak_vram or 0 for _, r in ran if r), default=None))}; "
            f"ledger placed them on GPU {sorted({str(r.gpu) for _, r in ran if r})}",
            trials=rows,
        )
    )
