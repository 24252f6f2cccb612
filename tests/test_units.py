import pytest

from optuna_memprune import Budget, format_bytes, parse_bytes


@pytest.mark.parametrize("text,expected", [
    ("6GiB", 6 * 2**30), ("512MB", 512 * 10**6), ("1.5 GB", 1_500_000_000), ("1024", 1024), (4096, 4096),
    (1e9, 10**9), ("2 kib", 2048), ("10b", 10), ("0", 0), ("1e3MB", 10**9),
])
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


@pytest.mark.parametrize("kwargs,word", [({"ram": "-1GB"}, "Budget.ram"), ({"vram": "lots"}, "Budget.vram"),
                                         ({"threads": 0}, "Budget.threads"), ({"threads": 2.5}, "Budget.threads")])
def test_budget_rejects_bad_values_naming_them(kwargs, word):
    with pytest.raises(ValueError, match=word):
        Budget(**kwargs)


def test_format_bytes():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(-3 * 2**30) == "-3.00 GiB"
