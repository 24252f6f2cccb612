"""``memprune report``: the terminal table, JSON and HTML outputs, dashboard notes, and one-line errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import optuna
import pytest

from optuna_memprune import report
from optuna_memprune.cli import main
from optuna_memprune.guard import read_record


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["report", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_table_shows_counts_notable_trials_quality_and_margin(guarded_url: str, capsys) -> None:
    code, out, err = _run(capsys, guarded_url)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("study 'guarded': 7 trials, 7 guarded; budget per trial RAM ")
    counts = {
        ln.split()[0]: ln.split()[1]
        for ln in lines
        if ln.split()
        and ln.split()[0] in ("admitted", "clamped", "rejected", "soft_pruned", "stopped", "out_of_memory", "unchecked")
    }
    assert counts == {
        "admitted": "3",
        "clamped": "1",
        "rejected": "1",
        "soft_pruned": "1",
        "stopped": "1",
        "out_of_memory": "0",
        "unchecked": "0",
    }
    trials = {int(ln.split()[0]): ln for ln in lines if ln.split() and ln.split()[0].isdigit()}
    assert sorted(trials) == [2, 3, 5, 6]  # rejected, clamped, soft-pruned, stopped; no admitted trial
    study = optuna.load_study(study_name="guarded", storage=guarded_url)
    for number, row in trials.items():
        t = study.trials[number]
        record = read_record(t.user_attrs)
        assert f" {t.state.name} " in row and f" {record.decision.value} " in row
        assert f"a={t.params['a']}" in row and record.reason.split(":")[0] in row
    assert "lowered b" in trials[2] and "stopped in process: RSS" in trials[6]
    quality = next(ln for ln in lines if ln.startswith("RAM ") and "%" in ln)
    assert quality.split()[1] == "4"  # trials that ran to the end
    assert lines[-1] == "learned margin: no learned margin (in-process study)"


def test_json_output_is_the_report_data(guarded_url: str, capsys) -> None:
    code, out, _ = _run(capsys, guarded_url, "--format", "json", "--study", "guarded")
    assert code == 0
    assert json.loads(out) == report.build(report.load(guarded_url)).to_json_dict()


def test_html_to_a_file_through_the_installed_command(guarded_url: str, tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    out = subprocess.run(
        [sys.executable, "-m", "optuna_memprune.cli", "report", guarded_url, "--format", "html", "-o", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"html report of study 'guarded' (7 guarded trials) -> {target}"
    assert target.read_text().startswith("<!DOCTYPE html>") and "plot-pred-vs-peak" in target.read_text()


def test_dashboard_notes_and_sortable_columns_through_the_dashboards_own_api(
    guarded_url: str, capsys, tmp_path: Path
) -> None:
    pytest.importorskip("optuna_dashboard")
    copy = tmp_path / "notes.db"  # notes are written into the storage: not into the shared study
    copy.write_bytes(Path(guarded_url.removeprefix("sqlite:///")).read_bytes())
    url = f"sqlite:///{copy}"
    code, _, err = _run(capsys, url, "--dashboard-notes", "--format", "json")
    assert code == 0 and err.strip() == "optuna-dashboard notes: 7 of 7 guarded trials written or refreshed"
    assert report.save_notes(report.load(url)) == 0  # up to date: nothing rewritten

    detail = _dashboard_study(url)
    for trial in detail["trials"]:
        body = trial["note"]["body"]
        decision = next(a["value"] for a in trial["user_attrs"] if a["key"] == "memprune:decision")
        assert body.startswith(f"### memprune: {decision}\n") and "| predicted |" in body
    assert "clamped: b " in detail["trials"][2]["note"]["body"]
    sortable = {a["key"]: a["sortable"] for a in detail["union_user_attrs"]}
    assert {k for k in sortable if k.startswith("memprune:")} >= {
        "memprune:decision",
        "memprune:reason",
        "memprune:pred_ram",
        "memprune:peak_ram",
        "memprune:budget_ram",
    }
    for key in ("memprune:pred_ram", "memprune:pred_threads", "memprune:budget_ram", "memprune:soft"):
        assert sortable[key], key  # numeric on every trial: a sortable column


def test_peak_columns_are_sortable_in_the_dashboard(guarded_url: str) -> None:
    pytest.importorskip("optuna_dashboard")
    sortable = {a["key"]: a["sortable"] for a in _dashboard_study(guarded_url)["union_user_attrs"]}
    assert sortable["memprune:peak_ram"] and sortable["memprune:peak_threads"]


def _dashboard_study(url: str) -> dict:
    """GET /api/studies/<id> from optuna-dashboard's WSGI app, in process: what its trial table shows."""
    import optuna_dashboard

    app = optuna_dashboard.wsgi(optuna.storages.RDBStorage(url))

    def get(path: str, query: str = "") -> dict:
        env: dict = {}
        setup_testing_defaults(env)
        env.update(PATH_INFO=path, QUERY_STRING=query, **{"wsgi.errors": io.StringIO()})
        status: list[str] = []
        body = b"".join(app(env, lambda s, h, e=None: status.append(s)))
        assert status[0].startswith("200"), (status, body[:500])
        return json.loads(body)

    study_id = get("/api/studies")["study_summaries"][0]["study_id"]
    return get(f"/api/studies/{study_id}", "after=0")


@pytest.fixture(scope="module")
def two_studies(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('cli') / 'two.db'}"
    for name in ("plain", "other"):
        optuna.create_study(study_name=name, storage=url).optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    return url


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing-file", "no SQLite file at "),
        ("bad-scheme", "cannot read the Optuna storage at nosuchdb://x: NoSuchModuleError"),
        ("not-a-database", "cannot read the Optuna storage at sqlite:///"),
        ("unknown-study", "no study 'nope' in sqlite:///"),
        ("several-studies", "holds 2 studies; name one with --study: other, plain"),
        ("no-guarded-trials", "study 'plain' has no guarded trials (1 trials, none with a memprune record)"),
        ("unwritable-output", "cannot write the report to "),
    ],
)
def test_runtime_errors_are_one_line_and_exit_1(
    case: str, expected: str, two_studies: str, guarded_url: str, tmp_path: Path, capsys
) -> None:
    junk = tmp_path / "junk.db"
    junk.write_text("not a database\n")
    argv = {
        "missing-file": [f"sqlite:///{tmp_path / 'absent.db'}"],
        "bad-scheme": ["nosuchdb://x"],
        "not-a-database": [f"sqlite:///{junk}"],
        "unknown-study": [guarded_url, "--study", "nope"],
        "several-studies": [two_studies],
        "no-guarded-trials": [two_studies, "--study", "plain"],
        "unwritable-output": [guarded_url, "-o", str(tmp_path / "no-such-dir" / "r.txt")],
    }[case]
    code, out, err = _run(capsys, *argv)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("memprune: error: ") and expected in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "absent.db").exists()  # reading never creates a storage
    if case == "unknown-study":
        assert err.rstrip().endswith("it holds: guarded")


def test_the_table_without_rich_holds_every_word_of_the_rich_one(guarded_url: str, capsys, monkeypatch) -> None:
    code, with_rich, _ = _run(capsys, guarded_url)
    assert code == 0
    for name in [m for m in sys.modules if m == "rich" or m.startswith("rich.")] or ["rich"]:
        monkeypatch.setitem(sys.modules, name, None)  # as in an install without the report extra
    code, plain, err = _run(capsys, guarded_url)
    assert code == 0 and err == ""
    assert sorted(plain.split()) == sorted(with_rich.split())  # the same cells, however rich wrapped them
    lines = plain.splitlines()
    header = next(ln for ln in lines if ln.startswith("#  state"))
    rows = [ln for ln in lines if ln[:1].isdigit()]
    assert [int(r.split()[0]) for r in rows] == [2, 3, 5, 6]
    assert all(r.index(r.split()[1]) == header.index("state") for r in rows)  # aligned under its header


def test_html_without_matplotlib_is_one_line_naming_the_extra(guarded_url: str, tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['matplotlib'] = None; from optuna_memprune.cli import main; "
        f"sys.exit(main(['report', {guarded_url!r}, '-f', 'html', '-o', {str(tmp_path / 'r.html')!r}]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and not (tmp_path / "r.html").exists()
    assert out.stderr == (
        "memprune: error: the HTML report needs matplotlib, which is not installed: "
        'pip install "optuna-memprune[report]"\n'
    )
