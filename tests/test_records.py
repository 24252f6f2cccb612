"""The trial record: attr names and encoding, reading back, constraints that are never NaN."""

from __future__ import annotations

import json
import math

import pytest

import optuna_memprune as omp
from optuna_memprune.guard import Decision, TrialRecord, read_record
from optuna_memprune.records import Enforcement, EnforcementMode, constraint_keys
from optuna_memprune.units import GiB


def _record(**kwargs) -> TrialRecord:  # type: ignore[no-untyped-def]
    base = dict(
        decision=Decision.CLAMPED,
        reason="lowered batch",
        pred_ram=3 * GiB,
        pred_vram=0,
        pred_threads=4,
        peak_ram=2 * GiB,
        peak_vram=None,
        peak_threads=5,
        budget_ram=4 * GiB,
        budget_threads=8,
        clamped_from={"batch": 512},
        timeline=[(0.0, 1, 2, None), (0.1234, 3, 4, 5)],
        breakdown={"ram": 3 * GiB},
        breach={"rss": 1},
    )
    return TrialRecord(**{**base, **kwargs})


def test_attrs_are_flat_with_int_bytes_and_compact_json() -> None:
    attrs = _record().attrs()
    assert attrs["memprune:decision"] == "clamped" and attrs["memprune:pred_ram"] == 3 * GiB
    assert "memprune:budget_vram" not in attrs and "memprune:peak_vram" not in attrs  # unknown: left out
    assert attrs["memprune:timeline"] == "[[0.0,1,2,null],[0.123,3,4,5]]"
    assert json.loads(attrs["memprune:clamped_from"]) == {"batch": 512}
    assert all(k.startswith("memprune:") for k in attrs)


def test_read_gives_back_what_was_written() -> None:
    record = _record()
    again = read_record(record.attrs())
    assert again.decision is Decision.CLAMPED and again.clamped_from == {"batch": 512}
    assert again.timeline == [(0.0, 1, 2, None), (0.123, 3, 4, 5)]
    assert (again.pred_ram, again.peak_threads, again.budget_ram) == (3 * GiB, 5, 4 * GiB)
    assert read_record({"other": 1}) is None


def test_constraints_use_the_larger_figure_in_gib_or_threads_and_are_never_nan() -> None:
    assert _record().constraints() == {"memprune_ram": -1.0, "memprune_threads": -3.0}
    over = _record(peak_ram=5 * GiB, peak_threads=9).constraints()
    assert over == {"memprune_ram": 1.0, "memprune_threads": 1.0}
    shared = _record(peak_ram=5 * GiB, concurrent=True).constraints()  # other trials' memory: not ours
    assert shared["memprune_ram"] == -1.0
    unknown = _record(pred_ram=None, peak_ram=None, pred_threads=None, peak_threads=None).constraints()
    assert unknown == {"memprune_ram": 0.0, "memprune_threads": 0.0}
    assert all(math.isfinite(v) for v in unknown.values())
    assert list(constraint_keys(["ram", "vram"])) == ["memprune_ram", "memprune_vram"]


def test_constraints_measure_against_the_soft_line() -> None:
    record = _record(soft=0.5, pred_ram=3 * GiB, peak_ram=None, pred_threads=4, peak_threads=None)
    assert record.constraints() == {"memprune_ram": 1.0, "memprune_threads": 0.0}
    assert read_record(record.attrs()).soft == 0.5


def test_runner_fields_round_trip_and_are_absent_in_process() -> None:
    record = _record(
        margin={"ram": 1.25, "threads": 1.0},
        host="node-a",
        gpu=1,
        enforcement=Enforcement(EnforcementMode.CGROUP_LIMIT, 1),
    )
    attrs = record.attrs()
    assert attrs["memprune:margin_ram"] == 1.25 and "memprune:margin_vram" not in attrs
    assert (attrs["memprune:host"], attrs["memprune:gpu"]) == ("node-a", 1)
    assert attrs["memprune:enforcement"] == "cgroup v1 limit"
    again = read_record(attrs)
    assert (again.margin, again.host, again.gpu) == ({"ram": 1.25, "threads": 1.0}, "node-a", 1)
    assert again.enforcement == Enforcement(EnforcementMode.CGROUP_LIMIT, cgroup_version=1)
    plain = _record().attrs()
    assert not any(
        k.startswith(("memprune:margin", "memprune:host", "memprune:gpu", "memprune:enforcement")) for k in plain
    )
    assert read_record(plain).margin == {} and read_record(plain).gpu is None
    assert read_record(plain).enforcement is None


ENFORCEMENTS = [
    ("cgroup v1 limit", Enforcement(EnforcementMode.CGROUP_LIMIT, cgroup_version=1)),
    ("cgroup v2 limit", Enforcement(EnforcementMode.CGROUP_LIMIT, cgroup_version=2)),
    ("cgroup v1 tree kill + polling", Enforcement(EnforcementMode.CGROUP_TREE_KILL, cgroup_version=1)),
    ("cgroup v2 tree kill + polling", Enforcement(EnforcementMode.CGROUP_TREE_KILL, cgroup_version=2)),
    ("polling", Enforcement(EnforcementMode.POLLING)),
    (
        "polling (no process of the trial ran in its cgroup)",
        Enforcement(EnforcementMode.POLLING, reason="no process of the trial ran in its cgroup"),
    ),
    (  # the text runners before 2026-11-22 wrote; a reason may hold parentheses of its own
        "polling (the trial's process could not join its cgroup)",
        Enforcement(EnforcementMode.POLLING, reason="the trial's process could not join its cgroup"),
    ),
    ("polling (a (nested) reason)", Enforcement(EnforcementMode.POLLING, reason="a (nested) reason")),
]


@pytest.mark.parametrize(("text", "value"), ENFORCEMENTS, ids=[t for t, _ in ENFORCEMENTS])
def test_every_enforcement_text_round_trips_and_reads_as_stored(text: str, value: Enforcement) -> None:
    assert str(value) == text and Enforcement.parse(text) == value
    assert Enforcement.parse(str(value)) == value
    attrs = _record(enforcement=value).attrs()
    assert attrs["memprune:enforcement"] == text  # the stored attr keeps today's text
    assert read_record(attrs).enforcement == value  # and a record already stored with it reads the same
    assert omp.Enforcement is Enforcement


@pytest.mark.parametrize(
    "text", ["", "cgroup v3 limit", "cgroup v1", "Polling", "polling ()", "polling (x", " polling", "cgroup v2 limit "]
)
def test_a_bad_enforcement_text_is_a_value_error_naming_the_texts_expected(text: str) -> None:
    with pytest.raises(
        ValueError, match=r"^an enforcement must read 'cgroup v1 limit', .* or 'polling \(<reason>\)', "
    ):
        Enforcement.parse(text)
    with pytest.raises(ValueError, match="an enforcement must read"):
        read_record({**_record().attrs(), "memprune:enforcement": text})


def test_an_enforcement_holds_only_what_its_mode_means() -> None:
    with pytest.raises(ValueError, match=r"cgroup_version must be 1 or 2 with cgroup_limit, but got None"):
        Enforcement(EnforcementMode.CGROUP_LIMIT)
    with pytest.raises(ValueError, match=r"cgroup_version must be None with polling, but got 2"):
        Enforcement(EnforcementMode.POLLING, cgroup_version=2)
    with pytest.raises(ValueError, match=r"reason must be None with cgroup_tree_kill"):
        Enforcement(EnforcementMode.CGROUP_TREE_KILL, cgroup_version=2, reason="why")
    with pytest.raises(ValueError, match=r"reason must be None or a non-empty str, but got ''"):
        Enforcement(EnforcementMode.POLLING, reason="")
    with pytest.raises(ValueError, match=r"mode must be an EnforcementMode \('cgroup_limit', "):
        Enforcement("kernel")  # type: ignore[arg-type]
    assert Enforcement("polling").mode is EnforcementMode.POLLING  # type: ignore[arg-type]  # its value reads as it
