"""The ledger on a PostgreSQL server that restarts: admissions, releases and reads wait for it to come back."""

from __future__ import annotations

import threading

import pytest

from optuna_memprune.ledger import HostCapacity, Ledger, Request

MiB = 2**20
pytestmark = pytest.mark.postgres


def test_admission_waits_for_a_restarting_postgresql_and_keeps_the_sums(postgres_cluster) -> None:
    ledger = Ledger(HostCapacity(ram=1000 * MiB), url=postgres_cluster.url(), host="h")
    first = ledger.admit(Request(ram=400 * MiB), "a", timeout=10)
    postgres_cluster.stop("fast")  # the pooled connection is dead and no new one can be made
    back = threading.Timer(3.0, postgres_cluster.start)
    back.start()
    try:
        second = ledger.try_admit(Request(ram=400 * MiB), "b")  # raised OperationalError before
    finally:
        back.join()
    assert second is not None
    assert ledger.try_admit(Request(ram=400 * MiB), "c") is None  # the first one still counts: 800 + 400 > 1000
    assert [e.key for e in ledger.entries()] == ["a", "b"]
    postgres_cluster.stop("immediate")
    back = threading.Timer(2.0, postgres_cluster.start)
    back.start()
    try:
        ledger.release(first)
    finally:
        back.join()
    assert ledger.in_use().ram == 400 * MiB
    assert ledger.reap() == [] and ledger.reaped() == []
    ledger.close()
