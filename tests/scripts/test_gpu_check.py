"""scripts/gpu_check.py without a GPU: its row definitions, the error arithmetic and summary lines, the JSON,
a failing or hanging check kept as a row, the no-CUDA path in a real subprocess; and on a GPU (marked gpu)
the whole smoke run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import gpu_check  # noqa: E402
from _gpu import results, rows  # noqa: E402
from _gpu.isolate import child_env, run_check  # noqa: E402

MiB = 1 << 20


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_cases_cover_the_models_batches_and_optimizers_the_issue_names():
    cases = rows.cases()
    assert len({c.key for c in cases}) == len(cases)
    models = {c.model for c in cases}
    for name in (
        "ResNet101",
        "VGG16",
        "MobileNetV2",
        "ConvNeXtTiny",
        "openai-community/gpt2",
        "facebook/opt-125m",
        "dqn-nature",
        "ppo-nature",
    ):
        assert name in models
    for model, cs in rows.by_model(cases).items():
        family = rows.MODELS[model][0]
        assert len({c.batch for c in cs}) == 3
        assert {c.optimizer for c in cs} == ({"Adam"} if family == "rl" else {"Adam", "SGD"})
    smoke = rows.cases(smoke=True)
    assert [c.model for c in smoke] == list(rows.MODELS)  # one case per model, smallest batch, Adam
    assert all(c.optimizer == "Adam" and c.batch == rows.MODELS[c.model][1][0] for c in smoke)
    with pytest.raises(ValueError, match="models must name entries of MODELS"):
        rows.cases(models=("AlexNet",))


def test_plan_runs_every_model_with_benchmark_off_and_on_and_every_guard_check():
    plan = gpu_check.plan(smoke=False)
    vram = plan["vram"]
    assert [lb for *_, lb in vram] == [f"vram {m}" for m in rows.MODELS]
    assert [lb for *_, lb in plan["predict"]] == [f"predict {m}" for m in rows.MODELS]
    for check, args, limit, _ in vram:
        assert check == "vram" and args["benchmark"] == [False, True] and limit > 0
        assert [rows.VramCase(**c) for c in json.loads(json.dumps(args["cases"]))]  # crosses the process line
    # each measurement job gets its own model's predictions, and only those
    dqn = rows.cases(models=("dqn-nature",))
    predicted = [{"kind": "prediction", "key": c.key, "parts": {"w": i}} for i, c in enumerate(dqn)]
    predicted.append({"kind": "prediction", "key": "VGG16|b16|Adam", "error": "EstimateError: no"})
    jobs = gpu_check.with_predictions(vram, predicted)
    by_label = {lb: a["predictions"] for _, a, _, lb in jobs}
    assert by_label["vram dqn-nature"] == {c.key: {"w": i} for i, c in enumerate(dqn)}
    assert by_label["vram VGG16"] == {"VGG16|b16|Adam": "EstimateError: no"}
    assert by_label["vram ResNet101"] == {}
    assert [c for c, *_ in plan["guard"]] == [
        "breach_in_process",
        "breach_per_process",
        "cuda_oom",
        "nvml_vs_torch",
        "learned_vram",
        "small_card",
    ]
    assert {c for c, *_ in plan["cuda"]} == {"cudnn", "context", "allocator"}
    from _gpu.worker import CHECKS

    assert all(c in CHECKS for group in plan.values() for c, *_ in group)


def test_dqn_row_is_predicted_here_on_meta_with_the_context_apart():
    small = rows.predict(rows.VramCase("rl", "dqn-nature", 32, "Adam"))
    large = rows.predict(rows.VramCase("rl", "dqn-nature", 1024, "Adam"))
    assert rows.CONTEXT in small
    assert 0 < rows.without_context(small) < sum(small.values())
    assert rows.without_context(large) > rows.without_context(small)  # the batch's activations grow
    assert any(k.endswith("weights") for k in small) and any("frozen" in k for k in small)  # the target copy


@pytest.mark.parametrize(
    "case",
    [
        rows.VramCase("rl", "dqn-nature", 4, "Adam"),
        rows.VramCase("rl", "ppo-nature", 4, "Adam"),
        rows.VramCase("CNN", "MobileNetV2", 2, "SGD"),
    ],
    ids=lambda c: c.key,
)
def test_the_measured_step_runs_for_real_on_the_cpu(case):
    from _gpu.cuda_checks import train_steps

    seen = []
    loss = train_steps(case, steps=2, on_step=seen.append, device="cpu")
    assert seen == [0, 1] and math.isfinite(loss)


def test_the_small_card_sweep_holds_trials_that_fit_and_trials_that_do_not():
    from _gpu.guard_checks import small_card_footprint
    from optuna_memprune import Budget

    limit = Budget(vram=rows.SMALL_CARD_BUDGET).vram
    smallest = small_card_footprint({"model": "nature", "batch_size": 32, "n_envs": 1})
    largest = small_card_footprint({"model": "xlarge", "batch_size": 1024, "n_envs": 16})
    assert smallest.vram < limit < largest.vram  # the guard has something to admit and to reject
    assert any(c.name == "GPU replay buffer" and c.vram == rows.replay_bytes(16) for c in largest.components)


def test_small_card_replay_is_what_the_trial_allocates():
    assert rows.replay_bytes(1) == 2 * rows.SMALL_CARD_STEPS * 4 * 84 * 84
    assert rows.replay_bytes(16) == 16 * rows.replay_bytes(1)


def test_errors_summary_and_last_lines():
    measured = [100 * MiB, 200 * MiB, 400 * MiB, 50 * MiB]
    predicted = [110 * MiB, 180 * MiB, 400 * MiB, 75 * MiB]  # +10%, -10%, 0%, +50%
    scored = [
        results.score_vram({"pred_reserved": p, "max_reserved": m, "pred_total": p + 300 * MiB, "nvml": m + 500 * MiB})
        for p, m in zip(predicted, measured)
    ]
    assert [round(r["err"], 3) for r in scored] == [0.1, -0.1, 0.0, 0.5]
    assert "err_allocated" not in scored[0]  # no allocated figures: no error made up
    failed = results.failed_row("vram x", "CUDA out of memory", kind="vram")
    s = results.vram_summary(scored + [failed])
    assert s["rows"] == 4 and s["failed"] == 1 and s["under"] == 1
    assert math.isclose(s["median_err"], 0.1) and math.isclose(s["max_err"], 0.5)
    assert results.vram_line(s) == "GPU_VRAM rows=4 median_err=10.0% under=1 max_err=50.0%"
    assert results.vram_line(results.vram_summary([failed])) == "GPU_VRAM rows=0 median_err=nan% under=0 max_err=nan%"
    g = results.guard_summary([{"ok": True}, {"ok": False}, failed, {"ok": True}])
    assert results.guard_line(g) == "GPU_GUARD checks=4 passed=2"
    with pytest.raises(ValueError, match="measured must be a positive"):
        results.signed_error(1, 0)
    with pytest.raises(ValueError, match="predicted must be a non-negative"):
        results.signed_error(-1, 10)


def test_breakdown_per_family_and_benchmark_setting():
    made = [
        results.score_vram({"family": fam, "benchmark": bench, "pred_reserved": p, "max_reserved": 100})
        for fam, bench, p in (("CNN", False, 90), ("CNN", True, 120), ("rl", True, 100))
    ]
    made.append(results.failed_row("vram gpt2", "timed out", family="transformer", benchmark=False))
    by = results.breakdown(made)
    assert set(by) == {"family=CNN", "family=rl", "family=transformer", "benchmark=0", "benchmark=1"}
    assert by["family=CNN"]["rows"] == 2 and by["family=CNN"]["under"] == 1
    assert math.isclose(by["family=CNN"]["max_err"], 0.2)
    assert by["family=transformer"] == {"rows": 0, "failed": 1}
    assert by["benchmark=1"]["rows"] == 2 and by["benchmark=0"]["failed"] == 1
    assert results.build({}, made, [], [])["summary"]["vram_by"] == by


def test_rows_print_one_line_each():
    row = results.score_vram(
        {
            "kind": "vram",
            "ok": None,
            "model": "ResNet101",
            "batch": 32,
            "optimizer": "Adam",
            "benchmark": True,
            "pred_reserved": 3000 * MiB,
            "max_reserved": 3200 * MiB,
            "pred_allocated": 2800 * MiB,
            "max_allocated": 2900 * MiB,
            "nvml": None,
        }
    )
    line = results.format_row(row)
    assert "\n" not in line and line.startswith("info vram ResNet101") and "-6.2%" in line and "n/a" in line
    failed = results.format_row(results.failed_row("guard cuda_oom", "timed out\nafter 60 s"))
    assert failed == "FAIL guard cuda_oom: timed out after 60 s"


def test_json_holds_the_whole_result_and_goes_under_out(tmp_path):
    vram = [results.score_vram({"kind": "vram", "pred_reserved": 90, "max_reserved": 100})]
    guard = [{"check": "guard x", "ok": True, "detail": "fine", "figure": float("nan")}]
    result = results.build({"gpu": "none"}, vram, [{"check": "context", "ok": None}], guard)
    path = results.write_json(result, tmp_path / "deep" / "r.json")
    back = json.loads(path.read_text())
    assert back["summary"]["lines"] == [
        "GPU_VRAM rows=1 median_err=10.0% under=1 max_err=10.0%",
        "GPU_GUARD checks=1 passed=1",
    ]
    assert back["guard"][0]["figure"] is None and back["meta"] == {"gpu": "none"}
    assert back["vram"][0]["err"] == pytest.approx(-0.1)
    assert results.default_out({"OUT": str(tmp_path)}) == tmp_path / "gpu_check.json"
    assert results.default_out({}) == Path("gpu_check.json")


@pytest.mark.skipif("_cuda()", reason="CUDA is here: the gpu-marked test runs the script instead")
def test_without_cuda_the_script_prints_one_line_and_exits_0(tmp_path):
    run = subprocess.run(
        [sys.executable, str(SCRIPTS / "gpu_check.py"), "--out", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("GPU_CHECK no CUDA"), run.stdout
    assert not (tmp_path / "r.json").exists()


def test_bad_arguments_are_refused_before_anything_runs(capsys):
    for argv in (["--budget-s", "0"], ["--only", "everything"]):
        with pytest.raises(SystemExit) as stop:
            gpu_check.main(argv)
        assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--budget-s must be a positive number of seconds, but got 0.0" in err and "--only" in err


@pytest.mark.skipif("_cuda()", reason="CUDA is here: the check would pass")
def test_a_failing_check_is_a_row_not_a_crash():
    got = run_check("context", {}, timeout=120, label="context lazy")
    assert len(got) == 1, got  # one check, one failure row
    assert got[0]["ok"] is False and got[0]["check"] == "context lazy" and got[0]["exit"].startswith("exit 1")
    assert "Error" in got[0]["detail"], got


def test_a_hanging_check_is_stopped_at_its_limit_and_kept_as_a_row():
    # a vram check of the largest models takes minutes even to predict: 1 s cuts it short
    got = run_check(
        "vram", {"cases": [c.to_dict() for c in rows.cases(models=("ResNet101",))]}, timeout=1, label="vram ResNet101"
    )
    assert got[-1]["ok"] is False and got[-1]["detail"].startswith("timed out after 1 s")
    assert run_check("vram", {}, timeout=0, label="late")[0]["detail"].startswith("not run")


def test_predictions_run_in_their_own_process_without_a_gpu():
    got = run_check(
        "predict",
        {"cases": [c.to_dict() for c in rows.cases(models=("ppo-nature",), smoke=True)]},
        timeout=120,
        label="predict ppo-nature",
    )
    assert [r["key"] for r in got] == ["ppo-nature|b32|Adam"] and got[0]["parts"][rows.CONTEXT] > 0


def test_the_worker_refuses_an_unknown_check():
    run = subprocess.run(
        [sys.executable, "-m", "_gpu.worker", "nope", "{}", "/dev/null"],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
        cwd=str(SCRIPTS.parent),
    )
    assert run.returncode == 2 and "usage" in run.stderr


@pytest.mark.gpu
@pytest.mark.slow
def test_smoke_run_on_a_gpu(tmp_path):
    if not _cuda():
        pytest.skip("no CUDA GPU here")
    out = tmp_path / "gpu.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPTS / "gpu_check.py"), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    last = run.stdout.strip().splitlines()[-2:]
    assert last[0].startswith("GPU_VRAM rows=") and last[1].startswith("GPU_GUARD checks=6 "), run.stdout[-3000:]
    result = json.loads(out.read_text())
    assert result["summary"]["vram"]["rows"] > 0 and result["meta"]["gpu"]
