"""The audit's HTML page in headless Chromium (Debian's ``chromium``, driven by playwright):
the sliders and the group selector recompute the ECE to the value
:meth:`AuditReport.ece_at` gives for those settings (to 1e-9), the table follows, and no
request leaves the page. Skipped only when playwright or chromium is absent (.ci/run
installs both)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from torchcal.audit import audit

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH")

EVIL = "</script><b>x"

SET = """([logT, bins, group]) => {
  document.getElementById("temperature").value = String(logT);
  document.getElementById("bins").value = String(bins);
  const sel = document.getElementById("group");
  sel.value = String(group);
  sel.dispatchEvent(new Event("change"));
  return [document.getElementById("temperature-value").dataset.value,
          document.getElementById("ece").dataset.value,
          Array.from(document.querySelectorAll("#table tbody tr"), (r) => Number(r.dataset.n))];
}"""


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def open_page(browser, report, path: Path):
    """Write the page, open it from file://, record every request and every error."""
    path.write_text(report.to_html(), encoding="utf-8")
    page = browser.new_page()
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    return page, requests, errors


def check_settings(page, report, settings, names):
    """Move the controls to each (T, bins, group) and compare with the Python side. The
    page's group ids are the report's (groups in name order), not the order given."""
    if names:
        assert sorted(names) == list(report.sample["names"])
        names = list(report.sample["names"])
    for T, bins, group in settings:
        gid = -1 if group is None else names.index(group)
        t_shown, ece, counts = page.evaluate(SET, [math.log10(T), bins, gid])
        t = float(t_shown)  # the temperature the page used (10 ** slider value)
        assert t == pytest.approx(T, rel=1e-12)
        want = report.ece_at(temperature=t, n_bins=bins, group=group)
        assert abs(float(ece) - want) <= 1e-9, (T, bins, group, float(ece), want)
        assert len(counts) == bins and sum(counts) > 0


def binary_report():
    g = torch.Generator().manual_seed(0)
    n = 3000
    p = torch.rand(n, generator=g, dtype=torch.float64) * 0.98 + 0.01
    y = (torch.rand(n, generator=g, dtype=torch.float64) < p).long()
    grp = (torch.rand(n, generator=g) < 0.4).long()
    z = torch.log(p) - torch.log1p(-p)
    stated = torch.where(grp == 1, torch.sigmoid(2.5 * z), p)
    # on bin edges; logit then sigmoid moves 0.3 and 0.75 one ulp down (a bin lower)
    stated[:5] = torch.tensor([0.8, 0.5, 0.25, 0.3, 0.75], dtype=torch.float64)
    return audit(stated, y, groups=grp, group_names=["math", EVIL], threshold=0.8), stated, y


def test_binary_sliders_match_python_and_no_request_leaves(browser, tmp_path):
    report, stated, y = binary_report()
    page, requests, errors = open_page(browser, report, tmp_path / "report.html")
    # at load: T = 1 and the report's bins: the report's own pooled ECE (the sample is all rows)
    ece0 = float(page.get_attribute("#ece", "data-value"))
    assert ece0 == pytest.approx(report.to_dict()["pooled"]["ece"], abs=1e-12)
    settings = [(1.0, 10, None), (2.0, 7, "math"), (0.3, 50, EVIL), (10.0, 2, None)]
    settings += [(0.1, 13, "math"), (1.7, 23, EVIL)]
    check_settings(page, report, settings, ["math", EVIL])
    # the table at (T = 1, 10 bins, pooled): counts per bin as numpy bins them
    _, _, counts = page.evaluate(SET, [0, 10, -1])
    ref = np.bincount(np.minimum(np.floor(stated.numpy() * 10), 9).astype(int), minlength=10)
    assert counts == ref.tolist()
    page.click("#reset")
    assert page.input_value("#bins") == "10" and page.input_value("#temperature") == "0"
    assert requests == [(tmp_path / "report.html").as_uri()]
    assert errors == []


def test_multiclass_logits_match_python(browser, tmp_path):
    g = torch.Generator().manual_seed(1)
    z = torch.randn(1500, 4, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 4, (1500,), generator=g)
    z[0] = torch.tensor([1.0, 1.0, 0.0, -1.0], dtype=torch.float64)  # a tie: first max wins
    y[0] = 1
    grp = torch.randint(0, 2, (1500,), generator=g)
    report = audit(z, y, groups=grp, group_names=["a", "b"], input="logits", n_bins=15)
    page, requests, errors = open_page(browser, report, tmp_path / "mc.html")
    check_settings(page, report, [(1.0, 15, None), (0.5, 9, "a"), (4.0, 40, "b")], ["a", "b"])
    assert requests == [(tmp_path / "mc.html").as_uri()]
    assert errors == []


def test_bin_edges_at_unit_temperature_are_the_reports_bins(browser, tmp_path):
    # probabilities written with two decimals sit on bin edges; at T = 1 the page bins them as
    # given, like the report: 0.3 in [0.3, 0.4) although sigmoid(logit(0.3)) < 0.3
    p = torch.tensor([0.25, 0.35, 0.3, 0.7, 0.8, 0.75, 0.5, 0.1], dtype=torch.float64)
    y = torch.tensor([1, 0, 0, 1, 0, 0, 1, 0])
    report = audit(p, y, n_bins=10)
    page, requests, errors = open_page(browser, report, tmp_path / "edges.html")
    ece = float(page.get_attribute("#ece", "data-value"))
    ref = np.minimum(np.floor(p.numpy() * 10), 9).astype(int)
    gaps = np.bincount(ref, p.numpy(), 10) - np.bincount(ref, y.numpy().astype(float), 10)
    assert ece == pytest.approx(np.abs(gaps).sum() / 8, abs=1e-12)
    assert ece == pytest.approx(report.to_dict()["pooled"]["ece"], abs=1e-12)
    check_settings(page, report, [(1.0, 10, None), (1.0, 20, None), (2.0, 10, None)], [])
    assert errors == [] and len(requests) == 1


def test_multiclass_probs_match_python(browser, tmp_path):
    # probabilities go through log p at T != 1 (0 -> -inf: that class drops out), as given at T = 1
    g = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(1200, 3, generator=g, dtype=torch.float64) * 2, 1)
    y = torch.randint(0, 3, (1200,), generator=g)
    p[0] = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)  # a tie and a zero
    p[1] = torch.tensor([0.0, 0.3, 0.7], dtype=torch.float64)
    y[0] = 1
    report = audit(p, y, groups=torch.arange(1200) % 2, group_names=["a", "b"], n_bins=10)
    page, requests, errors = open_page(browser, report, tmp_path / "mp.html")
    check_settings(page, report, [(1.0, 10, None), (0.3, 12, "a"), (3.0, 35, "b")], ["a", "b"])
    assert requests == [(tmp_path / "mp.html").as_uri()]
    assert errors == []


def test_huge_logits_at_small_temperature_match_python(browser, tmp_path):
    """Multiclass logits near 1e308 at T < 1: z / T overflows to inf; both sides shift by the
    maximum first, so the page shows Python's number (it used to show 0.573 where Python
    raised) and no row falls out of the bins."""
    g = torch.Generator().manual_seed(3)
    z = torch.randn(600, 3, generator=g, dtype=torch.float64) * 1e307
    y = torch.randint(0, 3, (600,), generator=g)
    report = audit(z, y, input="logits", n_bins=10)
    page, requests, errors = open_page(browser, report, tmp_path / "huge.html")
    check_settings(page, report, [(0.5, 10, None), (0.1, 7, None), (2.0, 10, None)], [])
    assert page.get_attribute("#n", "data-dropped") == "0"
    assert errors == [] and len(requests) == 1


def test_verdict_is_in_view_at_1024_px(browser, tmp_path):
    """At a 1024 x 768 window the verdict banner and the summary table's verdict column are
    on screen (the table scrolls inside its box), and each reason is listed once."""
    report, _, _ = binary_report()
    path = tmp_path / "narrow.html"
    path.write_text(report.to_html(), encoding="utf-8")
    page = browser.new_page(viewport={"width": 1024, "height": 768})
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    page.screenshot(path=str(tmp_path / "narrow.png"))
    assert (tmp_path / "narrow.png").read_bytes()[:4] == b"\x89PNG"
    inside = """(sel) => { const r = document.querySelector(sel).getBoundingClientRect();
      return [r.left, r.top, r.right, r.bottom, window.innerWidth, window.innerHeight]; }"""
    left, top, right, bottom, w, h = page.evaluate(inside, "#verdict")
    assert 0 <= left and right <= w and 0 <= top < h, (left, top, right, bottom, w, h)
    cell = "#summary tr:nth-child(2) td:nth-child(2)"  # the pooled row's verdict
    left, top, right, bottom, w, h = page.evaluate(inside, cell)
    assert 0 <= left and right <= w and 0 <= top and bottom <= h, (left, right, top, bottom)
    assert page.inner_text(cell) == report.pooled["verdict"].upper()
    items = page.eval_on_selector_all("#verdict li", "els => els.map(e => e.textContent)")
    assert sorted(items) == sorted(report.reasons) and len(set(items)) == len(items)
