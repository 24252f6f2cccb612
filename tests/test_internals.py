"""The guard's readers of Optuna's private names (optuna_memprune._internals) against the installed Optuna."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from optuna_memprune import _internals

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_study_and_trial_ids_and_the_cached_trials(tmp_path) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    study.optimize(lambda t: t.suggest_int("x", 0, 3), n_trials=2)
    assert isinstance(_internals.study_id(study), int)
    ids = [_internals.trial_id(t) for t in _internals.cached_trials(study)]
    assert ids == [_internals.trial_id(t) for t in study.trials] and len(set(ids)) == 2


def test_ask_marked_marks_the_new_trial_and_reads_the_study_once(tmp_path) -> None:
    """The new trial carries the mark; the per-trial list the samplers read is the study's trials with it, read
    by the ask (no second read for the check); an enqueued trial is popped first, marked too."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    study.optimize(lambda t: t.suggest_int("x", 0, 3), n_trials=2)
    study.enqueue_trial({"x": 3})
    popped = _internals.ask_marked(study, {"mark": 1})
    assert popped.number == 2 and popped.suggest_int("x", 0, 3) == 3
    assert study.trials[2].state == optuna.trial.TrialState.RUNNING and study.trials[2].system_attrs["mark"] == 1
    new = _internals.ask_marked(study, {"mark": 2})
    cached = study._thread_local.cached_all_trials
    assert [t.number for t in cached] == [0, 1, 2, 3] and cached[3].system_attrs["mark"] == 2
    assert new.number == 3 and _internals.cached_trials(study) is cached  # the check reads no more


def test_storage_location_names_an_rdb_url_or_a_journal_file(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert _internals.storage_location(optuna.create_study(storage=url)) == url
    journal = JournalStorage(JournalFileBackend(str(tmp_path / "j.log")))
    assert _internals.storage_location(optuna.create_study(storage=journal)) == str(tmp_path / "j.log")
    assert _internals.storage_location(optuna.create_study()) is None  # in memory: nothing stable to name


def test_set_trial_attrs_writes_every_attr_once_and_refuses_a_finished_trial(tmp_path) -> None:
    import pytest

    for storage in (optuna.storages.InMemoryStorage(), f"sqlite:///{tmp_path / 's.db'}"):
        study = optuna.create_study(storage=storage)
        trial = study.ask()
        trial.set_user_attr("kept", 1)
        tid = _internals.trial_id(trial)
        _internals.set_trial_attrs(study._storage, tid, {"a": 1, "b": "x"}, {"constraints:c": 0.5})
        frozen = study._storage.get_trial(tid)
        assert frozen.user_attrs == {"kept": 1, "a": 1, "b": "x"}
        assert frozen.system_attrs["constraints:c"] == 0.5
        study.tell(trial, 1.0)
        with pytest.raises(RuntimeError, match="finished"):
            _internals.set_trial_attrs(study._storage, tid, {"a": 2}, {})
        assert study._storage.get_trial(tid).user_attrs["a"] == 1


def test_the_storage_a_trial_process_gets_skips_the_schema_check_and_keeps_the_cache(tmp_path) -> None:
    import pickle

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    parent = _internals.storage_of(study)
    trial = study.ask()
    child = pickle.loads(pickle.dumps(_internals.storage_for_child(parent)))
    assert child._backend.skip_compatibility_check and not parent._backend.skip_compatibility_check
    assert parent._backend.engine is not None and parent._lock is not None  # the parent's own is untouched
    # the child's cache knows the trial and the study's distributions: a suggest is stored through it
    optuna.Trial(optuna.Study(study.study_name, child), _internals.trial_id(trial)).suggest_float("x", 0, 1)
    assert "x" in study._storage.get_trial(_internals.trial_id(trial)).params
    memory = optuna.storages.InMemoryStorage()
    assert _internals.storage_for_child(memory) is memory


def test_in_distribution_checks_range_step_and_choices() -> None:
    assert _internals.in_distribution(IntDistribution(0, 10, step=2), 4)
    assert not _internals.in_distribution(IntDistribution(0, 10, step=2), 5)
    assert not _internals.in_distribution(IntDistribution(0, 10), "a")
    assert _internals.in_distribution(CategoricalDistribution(["a", "b"]), "b")
    assert not _internals.in_distribution(CategoricalDistribution(["a", "b"]), "c")


def test_the_optimize_loop_flags_are_the_ones_study_stop_uses() -> None:
    study = optuna.create_study()
    assert not _internals.in_optimize_loop(study)
    _internals.set_in_optimize_loop(study, True)
    study.stop()  # raises unless the loop flag is set
    assert _internals.stop_requested(study)
    _internals.clear_stop(study)
    assert not _internals.stop_requested(study)
    _internals.set_in_optimize_loop(study, False)
    assert not _internals.in_optimize_loop(study)


def test_main_module_left_out_drops_the_main_module_in_this_thread_only(tmp_path) -> None:
    # In a program of its own, whose main module is a file (pytest's may be none: xdist's workers run -c).
    script = tmp_path / "program.py"
    script.write_text(
        "import threading\n"
        "from multiprocessing import spawn\n"
        "from optuna_memprune import _internals\n"
        "keys = ('init_main_from_path', 'init_main_from_name')\n"
        "assert any(k in spawn.get_preparation_data('x') for k in keys)  # this program's main module\n"
        "seen = {}\n"
        "with _internals.main_module_left_out():\n"
        "    inside = spawn.get_preparation_data('x')\n"
        "    other = threading.Thread(target=lambda: seen.update(spawn.get_preparation_data('x')))\n"
        "    other.start()\n"
        "    other.join()\n"
        "assert not any(k in inside for k in keys) and inside['sys_path']  # the rest of the preparation stays\n"
        "assert any(k in seen for k in keys)  # another thread of the program keeps Python's behaviour\n"
        "assert any(k in spawn.get_preparation_data('x') for k in keys)  # and so does this one afterwards\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert (out.returncode, out.stdout) == (0, "ok\n"), out.stderr
