"""The report of a study with a trial that ran out of memory (a real numpy MemoryError, in process): the
terminal table, JSON, HTML and dashboard note name it, and the pred-vs-peak plot leaves its lower bound out."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution

import optuna_memprune as omp
from optuna_memprune import report
from optuna_memprune.cli import main
from optuna_memprune.guard import Decision
from optuna_memprune.report._dashboard import trial_note
from optuna_memprune.report._html import COLORS

import _chromium_cdp as chromium

MiB = 2**20


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    guard = omp.MemoryGuard(
        lambda p: omp.Footprint.of(ram=64 * MiB),
        omp.Budget(ram="64GiB"),
        search_space={"oom": CategoricalDistribution([True, False])},
    )
    url = f"sqlite:///{tmp_path_factory.mktemp('oom') / 'oom.db'}"
    study = optuna.create_study(
        study_name="oom", storage=url, sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0))
    )
    for oom in (False, True, False):
        study.enqueue_trial({"oom": oom})

    def objective(trial: optuna.Trial) -> float:
        block = np.ones(8 * MiB, dtype=np.uint8)
        if trial.suggest_categorical("oom", [True, False]):
            np.empty(1 << 50, dtype=np.uint8)  # numpy's real "Unable to allocate 1.00 PiB ..."
        return float(block[::4096].sum())

    study.optimize(guard.wrap_objective(objective), n_trials=3)
    return url


def test_the_data_and_json_count_and_list_the_out_of_memory_trial(url: str) -> None:
    data = report.build(report.load(url))
    assert data.counts["out_of_memory"] == 1 and data.counts["admitted"] == 2
    assert [t.number for t in data.notable] == [1] and data.notable[0].state == "PRUNED"
    js = json.loads(report.render_json(data))
    row = js["trials"][1]
    assert row["decision"] == "out_of_memory" and row["state"] == "PRUNED"
    assert row["reason"].startswith("ran out of memory: MemoryError: Unable to allocate 1.00 PiB")
    assert row["peak"]["ram"] >= 2**50


def test_the_terminal_report_shows_the_decision_and_the_reason(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", url]) == 0
    out = capsys.readouterr().out
    counts = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines() if ln.startswith("out_of_memory ")}
    assert counts == {"out_of_memory": ["1", "-", "1"]}  # trials, COMPLETE, PRUNED
    assert "out-of-memory trials" in out
    row = next(ln for ln in out.splitlines() if ln.split()[:1] == ["1"])
    assert "PRUNED" in row and "out_of_memory" in row and "ran out of memory" in row


def test_the_html_names_it_and_leaves_its_bound_out_of_the_pred_vs_peak_plot(url: str, tmp_path: Path) -> None:
    data = report.build(report.load(url))
    page = report.render_html(data)
    notable = page[page.index('<section id="notable">') :]
    assert f'background:{COLORS[Decision.OUT_OF_MEMORY]}"></span>out_of_memory' in notable
    assert "ran out of memory: MemoryError: Unable to allocate 1.00 PiB" in notable
    assert "Trials that ran out of memory are left out" in page
    # pred vs peak: the two COMPLETE trials only; the PRUNED one's 1 PiB bound would flatten them to 0
    assert 'id="pred-vs-peak-ram-points-COMPLETE"' in page and "pred-vs-peak-ram-points-PRUNED" not in page
    assert main(["report", url, "--format", "html", "-o", str(tmp_path / "r.html")]) == 0
    assert "out_of_memory" in (tmp_path / "r.html").read_text()


def test_the_dashboard_note_says_what_happened(url: str) -> None:
    t = report.build(report.load(url)).trial(1)
    note = trial_note(t)
    assert note.startswith("### memprune: out_of_memory\n") and "ran out of memory: MemoryError" in note


@pytest.mark.chromium
def test_chromium_draws_the_out_of_memory_trial_in_its_colour(url: str, tmp_path: Path) -> None:
    from PIL import Image

    if chromium.find() is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing on CI: .ci/run installs Debian's chromium package")
        pytest.skip("no Chromium here (apt-get install chromium); CI installs it")
    html = tmp_path / "report.html"
    html.write_text(report.render_html(report.build(report.load(url))), encoding="utf-8")
    shot = chromium.render(html)
    assert shot.errors == [] and shot.requests == []
    image = Image.open(io.BytesIO(shot.png)).convert("RGB")
    box = shot.boxes["plot-decisions"]
    crop = image.crop((int(box["x"]), int(box["y"]), int(box["x"] + box["width"]), int(box["y"] + box["height"])))
    pixels = np.asarray(crop, dtype=np.int32).reshape(-1, 3)
    rgb = np.array([int(COLORS[Decision.OUT_OF_MEMORY][i : i + 2], 16) for i in (1, 3, 5)])
    assert int((np.abs(pixels - rgb).sum(axis=1) < 40).sum()) >= 10  # its marker, in its colour
