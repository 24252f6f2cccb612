import dataclasses
import json

import pytest

from optuna_memprune import Component, Footprint, Kind


def test_footprint_adds_and_sums_components():
    a = Footprint.of(ram="2GiB", threads=4, name="mine")
    b = Footprint((Component("buffer", Kind.BUFFER, ram=100, vram=7, processes=2),))
    total = a + b
    assert total.ram == 2 * 2**30 + 100 and total.vram == 7 and total.threads == 4 and total.processes == 2
    assert [c.name for c in total.components] == ["mine", "buffer"]
    assert sum([a, b]).ram == total.ram  # sum() starts from 0
    assert (a + b).by_kind()[Kind.BUFFER].ram == 100


def test_footprint_round_trips_through_json():
    fp = Footprint.of(ram="1GB", vram="2GB", threads=3) + Footprint(
        (Component("w", Kind.WEIGHTS, ram=5, vram=6, threads=7, processes=8, note="n"),)
    )
    again = Footprint.from_dict(json.loads(json.dumps(fp.to_dict())))
    assert again == fp
    # every field of a component is written, in the dataclass's order (a new field must not be left out)
    assert list(fp.to_dict()["components"][1]) == [f.name for f in dataclasses.fields(Component)]


def test_table_lists_every_component_and_the_total():
    fp = Footprint((Component("weights", Kind.WEIGHTS, ram=3 * 2**20), Component("ctx", Kind.CUDA_CONTEXT, vram=2**30)))
    text = fp.table()
    assert "weights" in text and "ctx" in text and "3.00 MiB" in text and "1.00 GiB" in text
    assert text.splitlines()[-1].startswith("TOTAL")


@pytest.mark.parametrize("field", ["ram", "vram", "threads", "processes"])
def test_component_rejects_negative_or_non_int(field):
    with pytest.raises(ValueError, match=field):
        Component("x", **{field: -1})
    with pytest.raises(ValueError, match=field):
        Component("x", **{field: 1.5})


def test_of_rejects_bad_sizes_naming_them():
    with pytest.raises(ValueError, match="vram"):
        Footprint.of(vram="a lot")
