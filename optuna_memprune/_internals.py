"""The audited module: every read of the private names of Optuna, multiprocessing and CPython's ``signal``.

Owns the workarounds for what their public APIs do not offer, each with the reason it is needed; knows
nothing of footprints, budgets or records. tests/test_layers.py allows private names here and nowhere else.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial


def storage_of(study: optuna.Study) -> BaseStorage:
    """The study's storage: writes on a trial known only as a FrozenTrial go through it (Optuna has no public
    handle; ``Study._storage``, optuna/study/study.py)."""
    return study._storage


def latest_trial(study: optuna.Study, trial: FrozenTrial) -> FrozenTrial:
    """``trial`` as Optuna's own suggest gives it to a sampler (``Trial._get_latest_trial``): its system attrs
    read from the storage when first used, so that what the sampler's ``before_trial`` wrote is in them
    (GridSampler's ``grid_id``). The trial Optuna gives ``sample_relative`` was read before ``before_trial``
    ran, and GridSampler refuses it (optuna/trial/_trial.py, ``_LazyTrialSystemAttrs``)."""
    from optuna.trial._trial import _LazyTrialSystemAttrs

    latest = copy.copy(trial)
    latest.system_attrs = _LazyTrialSystemAttrs(trial_id(trial), study._storage)
    return latest


def grid_names(sampler: Any) -> set[str] | None:
    """The param names of a ``GridSampler``'s grid (``GridSampler._search_space``; no public name), None for
    another sampler. It samples those only: asked for another param of the study (a step of
    optuna-integration's LightGBMTuner suggests one or two of the study's params), it raises."""
    from optuna.samplers import GridSampler

    return set(sampler._search_space) if isinstance(sampler, GridSampler) else None


def storage_for_child(storage: BaseStorage) -> BaseStorage:
    """The study's storage as a trial's process should get it (pickled): on a database, without checking the
    schema again (the parent's storage checked it when it opened).

    Unpickling an ``RDBStorage`` runs ``__setstate__``: a new engine, ``create_all``, and, unless
    ``skip_compatibility_check``, alembic's schema check (86 ms of CPU per trial process, 20 ms without it,
    measured on an idle 2-core machine). A ``_CachedStorage`` keeps its cache: its ``set_trial_param`` needs
    the trial and the study's distributions there. The copies share the parent's objects and are only
    pickled; any other storage is returned as it is.
    """
    from optuna.storages import RDBStorage
    from optuna.storages._cached_storage import _CachedStorage

    backend = storage._backend if isinstance(storage, _CachedStorage) else storage
    if type(backend) is not RDBStorage or backend.skip_compatibility_check:
        return storage
    checked = object.__new__(RDBStorage)
    checked.__dict__.update(backend.__dict__)
    checked.skip_compatibility_check = True
    if backend is storage:
        return checked
    cached = object.__new__(type(storage))  # its class kept: ``cached_storage_class``'s subclass in run/
    cached.__dict__.update(storage.__dict__)
    cached.__dict__["_backend"] = checked
    return cached


def cached_storage_class() -> type[BaseStorage]:
    """The class ``optuna.storages.get_storage(url)`` returns for a database URL (``_CachedStorage``, over
    an ``RDBStorage``): ``run/_attrs.py`` subclasses it to store a program's attrs as JSON."""
    from optuna.storages._cached_storage import _CachedStorage

    return _CachedStorage


def trial_id(trial: optuna.Trial | FrozenTrial | Any) -> int:
    """The storage's id of a trial (``Trial._trial_id`` / ``FrozenTrial._trial_id``): the key every storage
    method takes, which the public API does not expose."""
    return trial._trial_id


def study_id(study: optuna.Study) -> int:
    """The storage's id of a study (``Study._study_id``): with the storage's identity it keys what the
    guarded sampler caches per study; the public API exposes only the name."""
    return study._study_id


def cached_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The study's trials from the per-trial cache the built-in samplers read (``Study._get_trials(
    deepcopy=False, use_cache=True)``); ``study.get_trials`` has no ``use_cache`` and would query the
    storage again at every trial's start."""
    return study._get_trials(deepcopy=False, use_cache=True)


def ask_marked(study: optuna.Study, system_attrs: dict[str, Any]) -> optuna.Trial:
    """``study.ask()`` whose new trial carries ``system_attrs`` from the transaction that creates it.

    A runner killed between ``study.ask()`` and its next write leaves a RUNNING trial that nothing names:
    created with its runner's identity in one write (``BaseStorage.create_new_trial`` with a template trial,
    the path ``Study.ask`` takes with no template), the trial says whose it is from its first moment. A trial
    enqueued beforehand (WAITING) is popped as ``Study.ask`` pops it (``Study._pop_waiting_trial_id``: the
    first one this process sets RUNNING) and marked by one more write right after. A new trial's per-trial
    list (``cached_trials``) is the study's trials as this ask read them, with the new trial.
    """
    import datetime

    import optuna
    from optuna.trial import FrozenTrial, TrialState

    storage = study._storage
    study._thread_local.cached_all_trials = None  # as Study.ask: read the storage afresh for this trial
    # One read of the study's trials serves the queue and, the new trial added, the per-trial list the
    # samplers read (Study.ask reads them twice: each read of a database storage reads every running trial
    # with its attrs, 15 ms of CPU per read in the fault drill's runners).
    trials = storage.get_all_trials(study._study_id, deepcopy=False)
    trial_id = _pop_waiting(storage, [t for t in trials if t.state == TrialState.WAITING])
    if trial_id is None:
        template = FrozenTrial(
            number=-1,
            state=TrialState.RUNNING,
            value=None,
            datetime_start=datetime.datetime.now(),
            datetime_complete=None,
            params={},
            distributions={},
            user_attrs={},
            system_attrs=dict(system_attrs),
            intermediate_values={},
            trial_id=-1,
        )
        trial_id = storage.create_new_trial(study._study_id, template_trial=template)
        study._thread_local.cached_all_trials = [*trials, storage.get_trial(trial_id)]
    else:
        for key, value in system_attrs.items():
            storage.set_trial_system_attr(trial_id, key, value)
    return optuna.Trial(study, trial_id)


def _pop_waiting(storage: Any, waiting: list[FrozenTrial]) -> int | None:
    """The first of the ``waiting`` (enqueued) trials this process sets RUNNING, as ``Study._pop_waiting_trial_id``
    pops them: one another process took or finished first is passed over."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    for trial in waiting:
        try:
            if storage.set_trial_state_values(trial._trial_id, state=TrialState.RUNNING):
                return trial._trial_id
        except UpdateFinishedTrialError:
            continue
    return None


def in_distribution(dist: BaseDistribution, value: Any) -> bool:
    """Whether ``value`` lies in ``dist`` (range, step, choices): ``BaseDistribution._contains`` is the
    check Optuna applies to fixed params; no public method answers it. False for a value of another type."""
    try:
        return dist._contains(dist.to_internal_repr(value))
    except (ValueError, TypeError):
        return False


def in_optimize_loop(study: optuna.Study) -> bool:
    """Whether this thread runs an optimize loop of ``study`` (``Study._thread_local.in_optimize_loop``):
    ``Study.optimize`` refuses nested calls on it and ``study.stop()`` requires it; nothing public reads it."""
    return bool(study._thread_local.in_optimize_loop)


def set_in_optimize_loop(study: optuna.Study, value: bool) -> None:
    """Mark this thread as running (or no longer running) an optimize loop of ``study``, as
    ``Study.optimize`` does, so that ``study.stop()`` works in a loop that is not ``Study.optimize``'s."""
    study._thread_local.in_optimize_loop = value


def stop_requested(study: optuna.Study) -> bool:
    """Whether ``study.stop()`` was called in the present loop (``Study._stop_flag``); Optuna sets the flag
    publicly but reads it only inside ``Study.optimize``."""
    return bool(study._stop_flag)


def clear_stop(study: optuna.Study) -> None:
    """Reset ``study.stop()``'s flag at the start of a loop, as ``Study.optimize`` does (``_stop_flag``)."""
    study._stop_flag = False


def heartbeat_enabled(study: optuna.Study) -> bool:
    """Whether the study's storage records heartbeats (``optuna.storages._heartbeat``): a loop other than
    ``Study.optimize`` must then fail stale trials and beat for its running ones itself."""
    from optuna.storages import _heartbeat

    return _heartbeat.is_heartbeat_enabled(study._storage)


def heartbeat_thread(study: optuna.Study, trial: int) -> Any:
    """A not yet started thread that beats for trial id ``trial`` (``_heartbeat.get_heartbeat_thread``),
    the one ``Study.optimize`` runs beside each trial; ``join()`` stops it."""
    from optuna.storages import _heartbeat

    return _heartbeat.get_heartbeat_thread(trial, study._storage)


def storage_location(study: optuna.Study) -> str | None:
    """Where the study's storage keeps its data: an RDB storage's URL (``_CachedStorage._backend.url``)
    or a journal file's path (``JournalStorage._backend._file_path``); None otherwise (in memory).
    Storages expose no public name of their location, and the runner needs one to tell whether a
    ledger entry belongs to its own storage."""
    backend = getattr(study._storage, "_backend", study._storage)
    where = getattr(backend, "url", None) or getattr(backend, "_file_path", None)
    return None if where is None else str(where)


def set_trial_attrs(
    storage: BaseStorage, trial_id: int, user_attrs: Mapping[str, Any], system_attrs: Mapping[str, Any]
) -> None:
    """Set user and system attrs of a running trial, in one transaction where the storage is a database.

    ``BaseStorage`` sets one attr per call and ``RDBStorage`` commits each: a trial's record (about 15 attrs)
    was as many commits, each a sync to disk of a SQLite file (0.2 to 0.5 s per trial here) or a round trip
    to a database server. On an ``RDBStorage``, alone or under Optuna's ``_CachedStorage`` (whose
    ``_backend`` it is: attr writes go straight to it), every attr is set by the storage's own per-attr upsert
    (``RDBStorage._set_trial_attr_without_commit``) in one session (``_create_scoped_session``) and committed
    once, all or none. On an ``InMemoryStorage`` the trial is copied and stored once under the storage's lock,
    as its per-attr setters do for each attr (20 copies were 0.15 ms of a trial's 0.8 ms of guard). Any other
    storage gets one call per attr.
    """
    from optuna.storages import InMemoryStorage, RDBStorage

    if type(storage) is InMemoryStorage:
        with storage._lock:
            frozen = storage._get_trial(trial_id)
            storage.check_trial_is_updatable(trial_id, frozen.state)
            frozen = copy.copy(frozen)
            frozen.user_attrs = {**frozen.user_attrs, **user_attrs}
            frozen.system_attrs = {**frozen.system_attrs, **system_attrs}
            storage._set_trial(trial_id, frozen)
        return
    backend = getattr(storage, "_backend", storage)
    if not isinstance(backend, RDBStorage):
        for key, value in user_attrs.items():
            storage.set_trial_user_attr(trial_id, key, value)
        for key, value in system_attrs.items():
            storage.set_trial_system_attr(trial_id, key, value)
        return
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    with _create_scoped_session(backend.scoped_session, True) as session:
        for key, value in user_attrs.items():
            backend._set_trial_attr_without_commit(session, models.TrialUserAttributeModel, trial_id, key, value)
        for key, value in system_attrs.items():
            backend._set_trial_attr_without_commit(session, models.TrialSystemAttributeModel, trial_id, key, value)


def note_trial_attrs(trial: optuna.Trial, user_attrs: Mapping[str, Any], system_attrs: Mapping[str, Any]) -> None:
    """After ``set_trial_attrs`` on a ``Trial``'s own trial: what ``Trial.set_user_attr`` and
    ``Trial.set_constraint`` note besides their write, the attrs in the trial's own copy
    (``Trial._cached_frozen_trial``), which ``trial.user_attrs`` reads."""
    trial._cached_frozen_trial.user_attrs.update(user_attrs)
    trial._cached_frozen_trial.system_attrs.update(system_attrs)


def rdb_modules() -> tuple[str, ...]:
    """Optuna's modules an RDB storage imports on first use (``optuna.storages._rdb.models``): a fork
    server imports them once so that each trial's process does not."""
    return ("optuna.storages._rdb.models",)


class _ForkServer(Protocol):
    """The private names of multiprocessing's ``forkserver.ForkServer`` used below
    (``multiprocessing/forkserver.py``); typeshed's stub declares only its public methods."""

    _forkserver_pid: int | None
    _forkserver_alive_fd: int | None
    _forkserver_address: str | bytes | None

    def _stop(self) -> None: ...


def _fork_server() -> _ForkServer:
    """This process's fork server object (``forkserver._forkserver``), typed with the private names read."""
    from multiprocessing import forkserver

    # typeshed's ForkServer has no private attributes; _ForkServer names the ones this module reads
    return forkserver._forkserver  # type: ignore[return-value]


def stop_fork_server() -> None:
    """Stop this process's multiprocessing fork server (``forkserver._forkserver._stop()``), which
    otherwise lives as long as the process; multiprocessing offers no public way to end it."""
    _fork_server()._stop()


def forget_inherited_fork_server() -> None:
    """In a process forked by a fork server, let go of the server's "alive" pipe that multiprocessing
    hands every child (``ForkServer._forkserver_alive_fd``): the server exits only once no process holds
    it. A fork server this process needs later is then started afresh, as a forked child's would be."""
    server = _fork_server()
    if server._forkserver_pid is None and server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
        server._forkserver_address = None


# -- processes started without the parent's main module ----------------------------------------------------

#: The keys of multiprocessing's preparation data that make a spawn or forkserver child import the parent's
#: main module (``multiprocessing/spawn.py``: ``get_preparation_data``, ``prepare``).
_MAIN_KEYS = ("init_main_from_path", "init_main_from_name")
_LEFT_OUT = threading.local()
_INSTALL = threading.Lock()


@contextlib.contextmanager
def main_module_left_out() -> Iterator[None]:
    """While this context is open, a process this thread starts by spawn or forkserver does not import the
    parent's main module.

    multiprocessing hands every such child the main module's path or name (``spawn.get_preparation_data``)
    and the child imports it (as ``__mp_main__``) before it reads its target, so that functions of the main
    module can be found by name; a script without ``if __name__ == "__main__":`` then runs its whole top level
    again in the child, study included. There is no public switch: the preparation data are wrapped, once, to
    drop those two keys in the threads that opened this context (every other thread of the program keeps
    Python's behaviour). What the child runs must then not refer to ``__main__`` by name (cloudpickle sends
    the main module's functions and classes by value).
    """
    from multiprocessing import spawn

    with _INSTALL:
        original = spawn.get_preparation_data
        if not getattr(original, "memprune_wrapped", False):

            def get_preparation_data(name: str) -> dict[str, Any]:
                data = original(name)
                if getattr(_LEFT_OUT, "active", False):
                    for key in _MAIN_KEYS:
                        data.pop(key, None)
                return data

            get_preparation_data.memprune_wrapped = True  # type: ignore[attr-defined]
            spawn.get_preparation_data = get_preparation_data
    was = getattr(_LEFT_OUT, "active", False)
    _LEFT_OUT.active = True
    try:
        yield
    finally:
        _LEFT_OUT.active = was


def c_signal() -> Any:
    """CPython's C signal module (``_signal``, ``signal``'s own import), whose functions ``signal`` wraps in
    enum conversions: 4 of the 10 us a timed footprint call spent setting its SIGALRM timer. Called with plain
    signal numbers, they return raw handlers (``0`` for ``SIG_DFL``). ``signal`` itself where it has none."""
    return getattr(signal, "_signal", signal)
