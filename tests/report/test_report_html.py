"""The HTML report: every plot present with data, self-contained, and rendered by headless Chromium."""

from __future__ import annotations

import io
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from optuna_memprune import report
from optuna_memprune.estimate.footprint import Footprint
from optuna_memprune.guard import Decision
from optuna_memprune.report._html import COLORS

import _chromium_cdp as chromium

SVG = "{http://www.w3.org/2000/svg}"
PLOTS = ("pred-vs-peak", "timelines", "decisions", "breakdown")


@pytest.fixture(scope="module")
def data(guarded_url: str) -> report.ReportData:
    return report.build(report.load(guarded_url))


@pytest.fixture(scope="module")
def page(data: report.ReportData) -> str:
    return report.render_html(data)


def _svg(page: str, plot: str) -> ET.Element:
    section = re.search(rf'<section class="plot" id="plot-{plot}">(.*?)</section>', page, re.S)
    assert section, f"no section for plot {plot}"
    svg = re.search(r"<svg.*?</svg>", section.group(1), re.S)
    assert svg, f"plot {plot} has no SVG: {section.group(1)[:300]}"
    return ET.fromstring(svg.group(0))


def _group(svg: ET.Element, gid: str) -> ET.Element:
    found = [e for e in svg.iter() if e.get("id") == gid]
    assert len(found) == 1, f"{gid}: {len(found)} elements"
    return found[0]


def _markers(svg: ET.Element, prefix: str) -> int:
    """Markers drawn by the scatter groups whose id starts with ``prefix``: matplotlib writes one <use> of a
    defined marker per point, or (for a few points) one <path> per point."""
    total = 0
    for group in (g for g in svg.iter() if (g.get("id") or "").startswith(prefix)):
        uses = group.findall(f".//{SVG}use")
        total += len(uses) if uses else len(group.findall(f".//{SVG}path"))
    return total


def _vertices(group: ET.Element) -> int:
    path = group.find(f".//{SVG}path")
    return len(re.findall(r"[ML]", path.get("d"))) if path is not None else 0


def test_every_plot_is_present_with_its_data(data: report.ReportData, page: str) -> None:
    both = [t for t in data.trials if t.record.pred_ram is not None and t.record.peak_ram is not None]
    assert len(both) == 6  # all but the rejected trial
    svg = _svg(page, "pred-vs-peak")
    assert _markers(svg, "pred-vs-peak-ram-points-") == len(both)
    assert _markers(svg, "pred-vs-peak-threads-points-") == len(both)
    assert _vertices(_group(svg, "pred-vs-peak-ram-identity")) == 2
    assert _vertices(_group(svg, "pred-vs-peak-ram-budget")) == 2
    assert not any((e.get("id") or "").startswith("pred-vs-peak-vram") for e in svg.iter())  # no GPU readings
    assert "No VRAM readings in this study." in page

    svg = _svg(page, "timelines")
    assert data.timeline_trials == [6, 0, 1, 4]
    for n in data.timeline_trials:
        assert _vertices(_group(svg, f"timelines-ram-{n}")) == len(data.trial(n).record.timeline) >= 2
    assert _vertices(_group(svg, "timelines-ram-budget")) == 2

    assert _markers(_svg(page, "decisions"), "decisions-points-") == len(data.trials) == 7

    svg = _svg(page, "breakdown")
    largest = data.trial(data.largest_admitted)
    parts = Footprint.from_dict(largest.record.breakdown).components
    bars = [e for e in svg.iter() if re.fullmatch(r"breakdown-ram-bar-\d+", e.get("id") or "")]
    assert len(bars) == len(parts) + 2  # each component, the predicted total, the observed peak
    assert f"trial #{largest.number}: RAM by component" in ET.tostring(svg, encoding="unicode")


def test_tables_in_the_page_name_every_notable_trial(data: report.ReportData, page: str) -> None:
    for t in data.notable:
        assert f'<td class="num">{t.number}</td><td>{t.state}</td>' in page
    assert [t.decision for t in data.notable] == [
        Decision.CLAMPED,
        Decision.REJECTED,
        Decision.SOFT_PRUNED,
        Decision.STOPPED,
    ]
    assert "no learned margin (in-process study)" in page


def test_the_page_is_self_contained_with_unique_ids_and_deterministic(data: report.ReportData, page: str) -> None:
    assert "<script" not in page and "@import" not in page
    refs = re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', page) + re.findall(r"url\(([^)]*)\)", page)
    assert refs and all(r.startswith(("#", "data:")) for r in refs), [r for r in refs if not r.startswith("#")]
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})[:10]
    assert report.render_html(data) == page  # the same study gives the same file


def _chromium_or_skip() -> None:
    if chromium.find() is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing on CI: .ci/run installs Debian's chromium package")
        pytest.skip("no Chromium here (apt-get install chromium); CI installs it")


@pytest.mark.chromium
def test_chromium_renders_the_report_offline_without_errors(data: report.ReportData, page: str, tmp_path: Path) -> None:
    from PIL import Image

    _chromium_or_skip()
    html = tmp_path / "report.html"
    html.write_text(page, encoding="utf-8")
    shot = chromium.render(html)
    (tmp_path / "report.png").write_bytes(shot.png)
    print(f"screenshot: {tmp_path / 'report.png'} ({shot.width}x{shot.height})")
    assert shot.errors == [] and shot.requests == []
    image = Image.open(io.BytesIO(shot.png)).convert("RGB")
    assert image.size == (shot.width, shot.height)
    wanted = {
        "pred-vs-peak": [Decision.ADMITTED, Decision.CLAMPED, Decision.STOPPED],
        "timelines": [Decision.STOPPED],
        "decisions": [
            d for d in Decision if d not in (Decision.UNCHECKED, Decision.OUT_OF_MEMORY, Decision.FORECAST_STOPPED)
        ],
        "breakdown": [Decision.ADMITTED],
    }
    for plot in PLOTS:
        box = shot.boxes[f"plot-{plot}"]
        assert box["width"] > 600 and box["height"] > 200, (plot, box)
        crop = image.crop((int(box["x"]), int(box["y"]), int(box["x"] + box["width"]), int(box["y"] + box["height"])))
        pixels = np.asarray(crop, dtype=np.int32).reshape(-1, 3)
        inked = float((pixels.sum(axis=1) < 3 * 235).mean())
        assert inked > 0.02, f"plot {plot} is blank: {inked:.1%} of its pixels drawn"
        for decision in wanted[plot]:  # the data is drawn in the decisions' colours
            rgb = np.array([int(COLORS[decision][i : i + 2], 16) for i in (1, 3, 5)])
            near = int((np.abs(pixels - rgb).sum(axis=1) < 40).sum())
            assert near >= 10, f"plot {plot}: no {decision.value} pixels ({COLORS[decision]})"


@pytest.mark.chromium
def test_the_chromium_check_sees_console_errors_and_network_requests(tmp_path: Path) -> None:
    _chromium_or_skip()
    html = tmp_path / "bad.html"
    html.write_text(
        '<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body>'
        '<img src="http://example.com/x.png"><script>console.error("boom")</script></body></html>'
    )
    shot = chromium.render(html, selector="img")
    assert shot.requests == ["http://example.com/x.png"]
    assert any("boom" in e for e in shot.errors) and any("x.png" in e or "Failed" in e for e in shot.errors), (
        shot.errors
    )
