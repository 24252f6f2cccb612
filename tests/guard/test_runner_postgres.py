"""Across hosts: 3 pseudo-hosts x 2 trial processes each run one 60-trial study in a real PostgreSQL.

Each pseudo-host is a `memprune worker` process with its own host id and its own ledger (as separate
machines would have); the study's storage is the only thing they share.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import optuna_memprune as omp
from optuna_memprune.ledger import HostBudget, Ledger

HERE = Path(__file__).parent
MiB = 2**20
HOSTS = ("host-a", "host-b", "host-c")
HOST_RAM = 760 * MiB  # about two trials' reservations: admission has to wait now and then
pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_three_hosts_two_workers_each_finish_a_60_trial_study_in_postgresql(postgres_url: str, tmp_path: Path) -> None:
    ledgers = {h: f"sqlite:///{tmp_path / f'ledger-{h}.sqlite'}" for h in HOSTS}
    peaks = {h: 0 for h in HOSTS}
    stop = threading.Event()

    def watch_ledgers() -> None:  # every committed state of every host's ledger, as often as it can
        readers = {
            h: Ledger(HostBudget(ram=HOST_RAM, gpus=None, headroom=0.0), url=u, host=h) for h, u in ledgers.items()
        }
        while not stop.is_set():
            for h, ledger in readers.items():
                peaks[h] = max(peaks[h], ledger.in_use().ram)
            time.sleep(0.01)

    optuna.create_study(storage=postgres_url, study_name="pg", direction="maximize")
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "optuna_memprune.cli",
                "worker",
                "_runner_objectives:hold",
                "--storage",
                postgres_url,
                "--study",
                "pg",
                "--direction",
                "maximize",
                *(
                    ["--guard", "_runner_objectives:guard"]
                    if i == 0
                    # the same guard, two ways of saying it
                    else ["--footprint", "_runner_objectives:footprint", "--ram", "600MiB", "--on-infeasible", "reject"]
                ),
                "--n-trials",
                "20",
                "--n-workers",
                "2",
                "--host-id",
                host,
                "--ledger",
                ledgers[host],
                "--host-ram",
                str(HOST_RAM),
                "--headroom",
                "0",
                "--host-gpus",
                "--seed",
                str(i),
                "--no-progress",
            ],
            cwd=HERE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i, host in enumerate(HOSTS)
    ]
    watcher = threading.Thread(target=watch_ledgers, daemon=True)
    watcher.start()
    try:
        outputs = [w.communicate(timeout=400)[0] for w in workers]
    finally:
        stop.set()
        for w in workers:
            w.kill()
    watcher.join()
    for w, out in zip(workers, outputs):
        assert w.returncode == 0, out[-3000:]

    trials = optuna.load_study(storage=postgres_url, study_name="pg").trials
    assert len(trials) == 60
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials), [t.state for t in trials]
    records = [omp.read_record(t.user_attrs) for t in trials]
    assert all(r is not None for r in records)
    ran = [(t, r) for t, r in zip(trials, records) if r.decision.value != "rejected"]
    assert {r.host for _, r in ran} == set(HOSTS)
    assert any(r.decision.value == "rejected" for r in records)  # mb > 280 is predicted over the budget
    for host in HOSTS:
        assert 0 < peaks[host] <= HOST_RAM, (host, peaks[host])
        # and from the trials' own clocks: whenever a child started, its host's reservations fit
        # a child runs from its objective's first line to before its trial's end is stored; a trial
        # unchecked at launch reserved the whole budget
        mine = [
            (
                (t.user_attrs["t_run"][0], t.datetime_complete.timestamp()),
                min(r.pred_ram * r.margin["ram"], r.budget_ram) if r.margin else r.budget_ram,
            )
            for t, r in ran
            if r.host == host
        ]
        for (start, _), _ in mine:
            assert sum(res for (s, e), res in mine if s <= start <= e) <= HOST_RAM
        assert Ledger(HostBudget(ram=HOST_RAM, gpus=None), url=ledgers[host], host=host).entries() == []
