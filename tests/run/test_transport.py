"""What ``memprune run`` sends to a trial's process, which never imports the program's main module: the
objective by cloudpickle (by value, main-module functions included), and nothing that names ``__main__``."""

from __future__ import annotations

import sys

import optuna
import pytest

from optuna_memprune.run import _split


def _square(trial: optuna.Trial) -> float:
    return trial.suggest_float("x", 0, 1) ** 2


@pytest.fixture
def in_main(monkeypatch):
    """``_square`` and a sampler class made into names of ``__main__``, as a script's would be."""
    main = sys.modules["__main__"]

    sampler = type("MainSampler", (optuna.samplers.RandomSampler,), {"__module__": "__main__"})
    monkeypatch.setattr(_square, "__module__", "__main__")
    for obj in (_square, sampler):
        monkeypatch.setattr(main, obj.__name__, obj, raising=False)
    return sampler


def test_a_main_function_goes_by_value_with_cloudpickle_and_is_refused_by_plain_pickle(in_main, monkeypatch):
    moved = _split.transport(_square)
    assert moved.by == "cloudpickle" and moved.needs_main_module is False and b"__main__" in moved.data
    trial = optuna.create_study().ask()
    assert 0 <= moved(trial) <= 1
    monkeypatch.setitem(sys.modules, "cloudpickle", None)  # as where cloudpickle is not installed
    with pytest.raises(Exception, match="_square is named in the program's main module"):
        _split.transport(_square)


def test_a_sampler_class_of_the_main_module_cannot_be_sent(in_main):
    assert _split.unsendable(optuna.samplers.TPESampler(seed=0), "sampler") is None
    assert _split.unsendable(in_main(seed=0), "sampler") == (
        "the study's sampler cannot be sent to another process: UnpicklingError: MainSampler is named in the "
        "program's main module, which a trial's process does not import"
    )


def test_a_spooled_objective_crosses_as_its_file_and_the_file_goes_on_unspool(tmp_path, monkeypatch):
    import pickle
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    moved = _split.transport(_square)
    moved.spool()
    (spooled,) = tmp_path.iterdir()
    assert moved.data is None and moved.path == str(spooled) and spooled.stat().st_mode & 0o077 == 0
    sent = pickle.dumps(moved)
    assert len(sent) < 1000  # the path, not the objective's bytes
    assert 0 <= pickle.loads(sent)(optuna.create_study().ask()) <= 1
    moved.unspool()
    assert not list(tmp_path.iterdir())
    kept = _split.transport(_square)  # not spooled (a Ray task's way): the bytes go with it
    assert pickle.loads(pickle.dumps(kept)).data == kept.data and kept.path is None
