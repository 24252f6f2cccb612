"""Footprints for ``memprune run --footprint footprints:NAME`` in the tests."""

import optuna_memprune as omp


def fits(params: dict) -> omp.Footprint:
    return omp.Footprint.of(ram=200 * 2**20 + params["buffer_size"] * 32)


def raises(params: dict) -> omp.Footprint:
    raise RuntimeError("this footprint is broken")


NOT_A_FUNCTION = 3
