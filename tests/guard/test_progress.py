"""The runner's progress line, drawn from a Status value alone."""

from __future__ import annotations

from optuna_memprune.runner._progress import Status, describe

GiB = 2**30


def test_the_line_counts_trials_and_shows_the_host_when_known() -> None:
    status = Status(running=2, done=5, rejected=1, pruned=3, failed=0)
    assert describe(status) == "running 2 · done 5 · rejected 1 · pruned 3 · failed 0"
    assert status.finished == 8
    with_host = status._replace(host_ram=3 * GiB, host_capacity=20 * GiB)
    assert describe(with_host).endswith(" · host RAM 3.00 GiB / 20.00 GiB")
    assert describe(status._replace(host_ram=0, host_capacity=0)) == describe(status)  # no capacity: no host
