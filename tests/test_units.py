import re

import pytest

from optuna_memprune import Budget, format_bytes, parse_bytes
from optuna_memprune.units import check_int, check_number, is_int


@pytest.mark.parametrize(
    "text,expected",
    [
        ("6GiB", 6 * 2**30),
        ("512MB", 512 * 10**6),
        ("1.5 GB", 1_500_000_000),
        ("1024", 1024),
        (4096, 4096),
        (1e9, 10**9),
        ("2 kib", 2048),
        ("10b", 10),
        ("0", 0),
        ("1e3MB", 10**9),
    ],
)
def test_parse_bytes_accepts_human_sizes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["6 gigs", "", "GiB", "-1GB", -5, 1.5, float("nan"), True, None, [1]])
def test_parse_bytes_rejects_with_the_argument_and_text(bad):
    with pytest.raises(ValueError) as info:
        parse_bytes(bad, name="Budget.ram")
    assert "Budget.ram" in str(info.value) and repr(bad) in str(info.value)


def test_budget_parses_and_prints_human_sizes():
    b = Budget(ram="6GiB", vram="512MiB", threads=16)
    assert (b.ram, b.vram, b.threads) == (6 * 2**30, 512 * 2**20, 16)
    assert b.resources == {"ram": 6 * 2**30, "vram": 512 * 2**20, "threads": 16}
    assert str(b) == "Budget(ram=6.00 GiB, vram=512.00 MiB, threads=16)"
    assert Budget(ram="1GiB").resources == {"ram": 2**30}
    assert str(Budget()) == "Budget(unlimited)"


@pytest.mark.parametrize(
    "kwargs,word",
    [
        ({"ram": "-1GB"}, "Budget.ram"),
        ({"vram": "lots"}, "Budget.vram"),
        ({"threads": 0}, "Budget.threads"),
        ({"threads": 2.5}, "Budget.threads"),
    ],
)
def test_budget_rejects_bad_values_naming_them(kwargs, word):
    with pytest.raises(ValueError, match=word):
        Budget(**kwargs)


def test_format_bytes():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(-3 * 2**30) == "-3.00 GiB"


@pytest.mark.parametrize("value", [True, 1.0, "3", None, -1, 0])
def test_check_int_refuses_what_is_not_a_count_in_range(value):
    with pytest.raises(ValueError, match=rf"^n_workers must be a positive int, but got {re.escape(repr(value))}\.$"):
        check_int(value, "n_workers", minimum=1)


def test_check_int_bounds_none_and_own_wording():
    assert check_int(None, "threads", minimum=1, optional=True) is None
    assert check_int(7, "depth", minimum=0, maximum=7) == 7
    with pytest.raises(ValueError, match=r"depth must be an int in \[0, 7\], but got 8"):
        check_int(8, "depth", minimum=0, maximum=7)
    with pytest.raises(ValueError, match="threads must be a positive int or None, but got 0"):
        check_int(0, "threads", minimum=1, optional=True)
    with pytest.raises(ValueError, match="steps must be a count of steps, but got -2"):
        check_int(-2, "steps", minimum=0, expected="a count of steps")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), True, "0.5", 0, 1.5])
def test_check_number_refuses_non_finite_bools_strings_and_out_of_range(value):
    with pytest.raises(ValueError, match=r"soft must be a number in \(0, 1\], but got"):
        check_number(value, "soft", minimum=0, maximum=1, open_min=True)


def test_check_number_accepts_ints_and_floats_in_range():
    assert check_number(1, "soft", minimum=0, maximum=1, open_min=True) == 1
    assert check_number(1e-3, "interval", minimum=0, open_min=True) == 1e-3
    assert check_number(None, "timeout", minimum=0, optional=True) is None
    assert is_int(3) and not is_int(True) and not is_int(3.0)
