"""Tests of estimate/heap.py against the rules of glibc's malloc.c / mallopt(3) as documented.

The figures of real runs (how much the heap retains) are checked in test_torchnet_cpu_rss.py; these check that
the model follows the stated rules.
"""

from __future__ import annotations

import pytest

from optuna_memprune.estimate import heap
from optuna_memprune.units import MiB

DEFAULT = (128 * 1024, True)  # glibc's default: 128 KiB, dynamic
CHUNK = 16  # chunk header and alignment


@pytest.fixture(autouse=True)
def _glibc_defaults(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)


def test_threshold_from_the_environment(monkeypatch):
    assert heap.mmap_threshold() == DEFAULT
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert heap.mmap_threshold() == (65536, False)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=4096")
    assert heap.mmap_threshold() == (4096, False)  # the tunable wins


def test_small_chunks_live_on_the_heap_large_ones_are_mapped():
    events = [(0, 1000), (1, 2000), (0, -1), (2, MiB), (3, 500)]
    assert heap.high_water(events, threshold=DEFAULT) == 1000 + 2000 + 2 * CHUNK
    assert heap.high_water([], threshold=DEFAULT) == 0


def test_freeing_a_mapped_chunk_raises_a_dynamic_threshold():
    # the 1 MiB chunk is mapped; once freed, the threshold is its page-rounded size and 512 KiB is on the heap
    events = [(0, MiB), (0, -1), (1, 512 * 1024)]
    assert heap.high_water(events, threshold=DEFAULT) == 512 * 1024 + CHUNK
    assert heap.high_water(events, threshold=(128 * 1024, False)) == 0  # a fixed threshold stays


def test_the_dynamic_threshold_stops_at_32_mib():
    events = [(0, 64 * MiB), (0, -1), (1, MiB)]
    assert heap.high_water(events, threshold=DEFAULT) == 0
    events = [(0, 30 * MiB), (0, -1), (1, MiB)]
    assert heap.high_water(events, threshold=DEFAULT) == MiB + CHUNK


def test_frees_of_unknown_handles_and_zero_sizes_are_ignored():
    assert heap.high_water([(7, -1), (1, 0), (2, 100)], threshold=DEFAULT) == 100 + CHUNK


def test_retained_is_the_retention_times_the_high_water(monkeypatch):
    events = [(0, 1000), (0, -1)]
    assert heap.retained(events) == int(heap.RETENTION * (1000 + CHUNK))
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "512")  # a fixed, low threshold maps it
    assert heap.retained(events) == 0
