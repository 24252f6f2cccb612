"""ReportData and its JSON from a real guarded study, checked against the records on the trials."""

from __future__ import annotations

import io
import json
import statistics

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from optuna_memprune import report
from optuna_memprune._console import show
from optuna_memprune.guard import Decision, TrialRecord, read_record

RESOURCES = ("ram", "vram", "threads")


@pytest.fixture(scope="module")
def study(guarded_url: str) -> optuna.Study:
    return report.load(guarded_url)  # one study in the storage: no name needed


def test_the_study_has_every_decision_the_report_must_show(study: optuna.Study) -> None:
    decisions = [read_record(t.user_attrs).decision for t in study.trials]
    assert decisions == [
        Decision.ADMITTED,
        Decision.ADMITTED,
        Decision.CLAMPED,
        Decision.REJECTED,
        Decision.ADMITTED,
        Decision.SOFT_PRUNED,
        Decision.STOPPED,
    ], decisions


def test_json_matches_the_record_on_every_trial(study: optuna.Study) -> None:
    data = json.loads(report.render_json(report.build(study)))
    assert list(data) == [
        "schema",
        "study",
        "budget",
        "counts",
        "trials",
        "quality",
        "margin",
        "timelines",
        "largest_admitted",
    ]
    assert data["study"] == {"name": "guarded", "directions": ["minimize"], "n_trials": 7, "n_guarded": 7}
    assert data["counts"] == {
        "admitted": 3,
        "clamped": 1,
        "rejected": 1,
        "soft_pruned": 1,
        "stopped": 1,
        "out_of_memory": 0,
        "forecast_stopped": 0,
        "unchecked": 0,
    }
    frozen = {t.number: t for t in study.trials}
    for row in data["trials"]:
        t = frozen[row["number"]]
        record = read_record(t.user_attrs)
        assert row["state"] == t.state.name and row["params"] == t.params and row["values"] == t.values
        assert row["decision"] == record.decision.value and row["reason"] == record.reason
        for kind in ("pred", "peak", "budget"):
            assert row[kind] == {r: getattr(record, f"{kind}_{r}") for r in RESOURCES}
        assert row["clamped_from"] == record.clamped_from and row["breach"] == record.breach
        assert row["soft"] == record.soft and row["margin"] is None and row["host"] is None
    assert data["budget"] == {r: getattr(record, f"budget_{r}") for r in RESOURCES} | {"soft": 0.8}
    clamped = data["trials"][2]
    assert clamped["clamped_from"]["b"] > clamped["params"]["b"]  # lowered from the sampled value
    assert data["trials"][3]["peak"]["ram"] is None  # rejected: it never ran


def test_quality_counts_only_trials_that_ran_to_the_end(study: optuna.Study) -> None:
    data = report.build(study)
    for r in ("ram", "threads"):
        errors = {}
        for t in study.trials:
            rec = read_record(t.user_attrs)
            pred, peak = getattr(rec, f"pred_{r}"), getattr(rec, f"peak_{r}")
            if t.state is TrialState.COMPLETE and pred is not None and peak:
                errors[t.number] = (peak - pred) / peak
        q = data.quality[r]
        assert sorted(errors) == [0, 1, 2, 4]  # not the rejected, soft-pruned or stopped ones
        assert q.n == 4 and q.median_rel_error == pytest.approx(statistics.median(errors.values()))
        worst = max(errors, key=lambda n: abs(errors[n]))
        assert (q.worst_trial, q.worst_rel_error) == (worst, pytest.approx(errors[worst]))
        assert q.under_predicted == sum(e > 0 for e in errors.values())
    # The stopped trial's peak is over the budget: it counts nowhere in the quality figures.
    assert read_record(study.trials[6].user_attrs).peak_ram > read_record(study.trials[6].user_attrs).budget_ram
    assert data.quality["vram"].n == 0 and data.quality["vram"].median_rel_error is None  # no GPU here


def test_timelines_and_breakdown_choose_the_trials_the_html_draws(study: optuna.Study) -> None:
    data = report.build(study)
    assert data.timeline_trials[0] == 6  # the stopped trial, then the admitted ones
    assert set(data.timeline_trials[1:]) == {0, 1, 4}
    preds = {t.number: read_record(t.user_attrs).pred_ram for t in study.trials}
    assert data.largest_admitted == max((0, 1, 4), key=preds.get)
    js = data.to_json_dict()
    assert js["largest_admitted"]["breakdown"]["ram"] == preds[data.largest_admitted]
    assert [p[1] for p in js["timelines"]["6"]] == [p[1] for p in read_record(study.trials[6].user_attrs).timeline]


def _add_complete(study: optuna.Study, number: int, record: TrialRecord) -> None:
    """A COMPLETE trial of param ``x = number`` (its value too) carrying ``record``."""
    study.add_trial(
        create_trial(
            state=TrialState.COMPLETE,
            value=float(number),
            params={"x": number},
            distributions={"x": IntDistribution(0, 9)},
            user_attrs=record.attrs(),
        )
    )


def test_margin_is_the_last_trial_that_has_one(tmp_path) -> None:
    storage = f"sqlite:///{tmp_path / 'margin.db'}"
    study = optuna.create_study(study_name="runner", storage=storage)
    for number, margin in enumerate([{"ram": 1.30}, {}, {"ram": 1.12, "threads": 1.0}, {}]):
        record = TrialRecord(
            Decision.ADMITTED,
            "ran",
            pred_ram=100,
            peak_ram=110,
            margin=margin,
            host="node-a" if margin else None,
            gpu=0 if margin else None,
        )
        _add_complete(study, number, record)
    data = report.build(study)
    assert data.margin is not None and data.margin.trial == 2
    assert data.margin.factors == {"ram": 1.12, "threads": 1.0}
    js = data.to_json_dict()
    assert js["margin"] == {"trial": 2, "ram": 1.12, "threads": 1.0}
    assert js["trials"][2]["host"] == "node-a" and js["trials"][2]["gpu"] == 0
    assert js["quality"]["ram"]["under_predicted"] == 4  # 110 observed over 100 predicted on each
    assert js["quality"]["ram"]["median_rel_error"] == pytest.approx(10 / 110)


def test_a_learned_increment_is_scored_with_the_usage_its_trial_started_from(tmp_path) -> None:
    # In a shared process a learned prediction is the trial's own increment; its peak is the process's. Scored
    # one against the other, a scikit-learn search whose trials added 1-55 MiB to a 760 MiB process read
    # "+99.0% median, 4 of 4 under-predicted" where admission had compared 760 + 39 MiB with a 768 MiB peak.
    study = optuna.create_study(study_name="shared", storage=f"sqlite:///{tmp_path / 'shared.db'}")
    MiB = 2**20
    learned = {"mode": "learned", "phase": "bound", "n": 4, "center": {"ram": 10 * MiB}, "bound": {"ram": 30 * MiB}}
    rows = [  # (start, fit, peak): the process's usage at the start, the increment's fit, the process's peak
        (700 * MiB, 10 * MiB, 712 * MiB),
        (712 * MiB, 10 * MiB, 719 * MiB),
        (719 * MiB, 10 * MiB, 735 * MiB),
    ]
    for number, (start, fit, peak) in enumerate(rows):
        record = TrialRecord(
            Decision.ADMITTED,
            "ran",
            pred_ram=fit,
            start_ram=start,
            peak_ram=peak,
            budget_ram=800 * MiB,
            learned=learned,
        )
        _add_complete(study, number, record)
    data = report.build(study)
    expected = [(peak - (start + fit)) / peak for start, fit, peak in rows]  # +0.3%, -0.4%, +0.8%
    assert data.quality["ram"].median_rel_error == pytest.approx(statistics.median(expected))
    assert data.quality["ram"].under_predicted == 2
    js = json.loads(report.render_json(data))
    assert js["trials"][0]["pred"]["ram"] == 10 * MiB  # the record's figure itself is unchanged
    learned_js = js["learned"]
    assert [r["peak_ram"] for r in learned_js["rows"]] == [peak - start for start, _, peak in rows]  # the increments
    bound_errors = [(peak - start - 30 * MiB) / peak for start, _, peak in rows]  # of the process's peak
    assert learned_js["median_rel_error_bound"] == pytest.approx(statistics.median(bound_errors))
    note = report.trial_note(data.trials[0])  # the figures shown beside the peak: the level admission compared
    assert "| predicted | 710.00 MiB |" in note and "| observed peak | 712.00 MiB |" in note, note
    out = io.StringIO()
    show(report.render_table(data), file=out)
    text = out.getvalue()
    assert "+99" not in text and "under-predicted; a learned increment counts with the usage" in text


def test_a_study_without_guarded_trials_is_a_report_error(tmp_path) -> None:
    storage = f"sqlite:///{tmp_path / 'plain.db'}"
    study = optuna.create_study(study_name="plain", storage=storage)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    with pytest.raises(report.ReportError, match="no guarded trials .*2 trials"):
        report.build(report.load(storage))


def test_json_stays_standard_when_an_objective_returned_nan(tmp_path) -> None:
    storage = f"sqlite:///{tmp_path / 'nan.db'}"
    study = optuna.create_study(storage=storage)
    record = TrialRecord(Decision.ADMITTED, pred_ram=1, peak_ram=1)
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=float("inf"), user_attrs=record.attrs()))
    assert json.loads(report.render_json(report.build(study)))["trials"][0]["values"] == [None]


def test_running_trials_are_shown_and_their_runner_is_said_unknown_without_a_ledger(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMPRUNE_CACHE_DIR", str(tmp_path / "cache"))  # no host ledger here
    storage = f"sqlite:///{tmp_path / 'running.db'}"
    study = optuna.create_study(study_name="r", storage=storage)
    trial = study.ask({"x": IntDistribution(0, 9)})  # RUNNING, no record: its process died before writing one
    with pytest.raises(report.ReportError) as none_guarded:
        report.build(study)
    unknown = "no runner of this host's ledger holds it (it runs in process, on another host or under another ledger)"
    assert str(none_guarded.value) == (
        f"study 'r' has no guarded trials (1 trials, none with a memprune record; "
        f"RUNNING: #0 ({unknown})): run it with MemoryGuard's wrappers first"
    )
    study.add_trial(
        create_trial(state=TrialState.COMPLETE, value=1.0, user_attrs=TrialRecord(Decision.ADMITTED).attrs())
    )
    data = report.build(study)
    assert [t.number for t in data.trials] == [1] and not (tmp_path / "cache").exists()
    assert data.to_json_dict()["running"] == [
        {"number": 0, "state": "RUNNING", "params": {"x": trial.params["x"]}, "runner": None, "note": unknown}
    ]
    assert '<section id="running">' in report.render_html(data)
    study.tell(trial, 2.0)
    assert "running" not in report.build(study).to_json_dict()  # the key is there only while a trial runs


def test_fixed_hyperparameters_lowered_by_memprune_run_are_shown_with_the_params_that_replay_them(tmp_path) -> None:
    from optuna_memprune import records
    from optuna_memprune.report._table import override_lines

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'fixed.db'}")
    for _ in range(2):
        trial = study.ask()
        records.write_overrides(study, trial._trial_id, {"buffer_size": (100000, 42000)})
        records.write(trial, TrialRecord(Decision.ADMITTED, pred_ram=100, peak_ram=100))
        study.tell(trial, 1.0)
    data = report.build(study)
    assert data.trials[1].overrides == {"buffer_size": (100000, 42000)}
    assert data.to_json_dict()["trials"][0]["overrides"] == {"buffer_size": [100000, 42000]}
    assert override_lines(data) == [
        "fixed buffer_size lowered 100000 -> 42000 by --clamp-fixed on 2 trials (the "
        "stored params plus this are what ran; replay a trial with -params "
        "buffer_size:42000)"
    ]
