"""The audit's HTML page without a browser: structure, CSP, no URL, the data block, escaping."""

from __future__ import annotations

import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import torch

from torchcal.audit import audit
from torchcal.audit._format import note_lines
from torchcal.audit.html import CSP, json_safe, page_data, render_html, script_json

ASSETS = Path(__file__).parents[2] / "torchcal" / "audit" / "assets"
EVIL = "</script><b>bold</b><!--"
QUOTES = "a&b \"q\" 'z' <i>"


class Page(HTMLParser):
    """Every start tag with its attributes, the script bodies, and the text of the
    <option>, <td> and <li> elements."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.options: list[str] = []
        self.cells: list[str] = []
        self.items: list[str] = []
        self._open: list[str] = []
        self._script: dict[str, str | None] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._open.append(tag)
        if tag == "script":
            self._script = dict(attrs)

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1] == tag:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self.scripts.append((self._script, data))
            self._script = None
        elif self._open and self._open[-1] == "option":
            self.options.append(data)
        elif self._open and self._open[-1] == "td":
            self.cells.append(data)
        elif self._open and self._open[-1] == "li":
            self.items.append(data)

    def ids(self) -> set[str]:
        return {a["id"] for _, a in self.tags if a.get("id")}

    def data(self) -> Any:
        (body,) = [t for a, t in self.scripts if a.get("type") == "application/json"]
        return json.loads(body)


def two_domains(n: int = 600, seed: int = 0, names: tuple[str, str] = ("math", EVIL)):
    """Binary probabilities of two domains: calibrated, and pushed to the extremes."""
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, generator=g, dtype=torch.float64) * 0.98 + 0.01
    y = (torch.rand(n, generator=g, dtype=torch.float64) < p).long()
    grp = (torch.rand(n, generator=g) < 0.5).long()
    z = torch.log(p) - torch.log1p(-p)
    stated = torch.where(grp == 1, torch.sigmoid(2.5 * z), p)
    return stated, y, grp, list(names)


@pytest.fixture(scope="module")
def report():
    p, y, g, names = two_domains()
    return audit(p, y, groups=g, group_names=names, threshold=0.8, n_bins=10)


@pytest.fixture(scope="module")
def page(report) -> str:
    return render_html(report)


def test_page_structure_and_csp(page):
    parsed = Page(page)
    assert page.startswith("<!DOCTYPE html>")
    assert {"verdict", "summary", "diagram", "group", "bins", "temperature", "ece", "table"} <= (
        parsed.ids()
    )
    csp = [a for t, a in parsed.tags if t == "meta" and a.get("http-equiv")]
    assert [a["http-equiv"] for a in csp] == ["Content-Security-Policy"]
    assert csp[0]["content"] == CSP
    assert "default-src 'none'" in CSP
    # two scripts, both inline: the data block and the page's code (the asset, verbatim)
    types = [a.get("type") for a, _ in parsed.scripts]
    assert types == ["application/json", None]
    assert parsed.scripts[1][1] == (ASSETS / "report.js").read_text(encoding="utf-8")
    inputs = {a["id"]: a for t, a in parsed.tags if t == "input"}
    bins, temp = inputs["bins"], inputs["temperature"]
    assert (bins["min"], bins["max"], bins["value"]) == ("2", "50", "10")
    assert (temp["min"], temp["max"], temp["value"]) == ("-1", "1", "0")  # log10 T: 0.1 .. 10


def test_no_url_and_no_external_resource(page):
    assert re.search(r"https?://|ftp://|wss?://", page, flags=re.IGNORECASE) is None
    for tag, attrs in Page(page).tags:
        assert not {"src", "href", "action", "srcset", "poster"} & set(attrs), tag
    assert "@import" not in page and "url(" not in page


def test_js_and_css_are_small_and_have_no_network_api():
    js = (ASSETS / "report.js").read_text(encoding="utf-8")
    assert len(js.splitlines()) < 300
    for api in ("fetch(", "XMLHttpRequest", "WebSocket", "import(", "eval(", "innerHTML"):
        assert api not in js


def test_data_block_round_trips(report, page):
    data = Page(page).data()
    assert data == page_data(report)
    assert data["report"] == json_safe(report.to_dict())
    # the sample's float64 values come back bit for bit, in row order
    s = data["sample"]
    assert (
        s["classes"] == 1 and s["input"] == "probs" and s["names"] == sorted(["math", EVIL])
    )  # name order
    sample = report.sample
    get = sample.get if isinstance(sample, dict) else lambda k: getattr(sample, k)
    assert s["preds"] == get("preds").to(torch.float64).tolist()
    assert s["target"] == get("target").tolist()
    assert s["group"] == get("group").tolist()
    assert data["n_bins"] == 10 and data["threshold"] == 0.8


def test_group_names_are_escaped_everywhere(page):
    # the only "</script" are the two closing tags; no injected element survives parsing
    assert page.lower().count("</script") == 2
    parsed = Page(page)
    assert [t for t, _ in parsed.tags].count("b") == 0
    assert parsed.options == ["pooled", *sorted(["math", EVIL])]  # groups in name order
    assert EVIL in parsed.cells  # the summary row's name cell, as text
    assert parsed.data()["sample"]["names"][0] == EVIL  # name order


def test_quotes_and_ampersands_round_trip():
    p, y, g, _ = two_domains(n=300, seed=1)
    r = audit(p, y, groups=g, group_names=["plain", QUOTES])
    parsed = Page(render_html(r))
    assert parsed.options == ["pooled", *sorted(["plain", QUOTES])]
    assert [t for t, _ in parsed.tags].count("i") == 0
    assert parsed.data()["report"] == json_safe(r.to_dict())


def test_multiclass_logits_with_masks_round_trip():
    g = torch.Generator().manual_seed(2)
    z = torch.randn(50, 4, generator=g, dtype=torch.float64)
    z[3, 1] = -math.inf  # a masked class
    y = torch.randint(0, 4, (50,), generator=g)
    y[3] = 0
    r = audit(z, y, input="logits")
    s = Page(render_html(r)).data()["sample"]
    assert s["classes"] == 4 and s["input"] == "logits"
    flat = [float(v) for v in s["preds"]]  # "-Infinity" is what JS Number() reads as -inf
    assert s["preds"][3 * 4 + 1] == "-Infinity"
    assert torch.equal(torch.tensor(flat, dtype=torch.float64).reshape(50, 4), z)


def test_subsample_is_stated(report):
    p, y, g, names = two_domains(n=500, seed=3)
    r = audit(p, y, groups=g, group_names=names, sample_size=120)
    text = render_html(r)
    assert "sample of 120 of 500 rows" in text
    assert len(Page(text).data()["sample"]["target"]) == 120
    assert "all 600 rows" in render_html(report)


def test_report_without_sample_has_no_diagram():
    class Bare:  # the smallest thing render_html accepts: to_dict() and no sample
        sample = None

        def to_dict(self) -> dict[str, Any]:
            return {"verdict": "pass", "settings": {"n_bins": 10}, "pooled": {"n": 3}}

    text = render_html(Bare())
    parsed = Page(text)
    assert "diagram" not in parsed.ids() and parsed.data()["sample"] is None
    assert "No sample is embedded" in text


def test_json_safe_and_script_json():
    assert json_safe([math.nan, -math.inf, (1.5,)]) == ["NaN", "-Infinity", [1.5]]
    assert json_safe(torch.tensor([0.1, math.inf], dtype=torch.float64)) == [0.1, "Infinity"]
    text = script_json({"s": "<&>", "x": 0.1 + 0.2})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"s": "<&>", "x": 0.1 + 0.2}  # full float precision


def test_verdict_banner_lists_every_reason(report, page):
    d = report.to_dict()
    parsed = Page(page)
    classes = [a.get("class") for t, a in parsed.tags if a.get("id") == "verdict"]
    assert classes == [f"banner {d['verdict']}"]
    notes = [n.strip() for n in note_lines(d)]  # every note the console prints, too
    assert notes and any(n.startswith("engine: ") for n in notes)
    assert d["reasons"] and sorted(d["reasons"] + notes) == sorted(parsed.items)  # each once
    assert all(n in report.to_text() for n in notes)


def test_report_read_from_json_renders_without_diagram(report):
    back = type(report).from_json(report.to_json())
    text = render_html(back)
    assert "diagram" not in Page(text).ids() and "No sample is embedded" in text
    assert Page(text).data()["report"] == json_safe(report.to_dict())


def test_cost_and_temperature_sections():
    p, y, g, _ = two_domains(n=600, seed=4)
    r = audit(
        p,
        y,
        groups=g,
        group_names=["math", "open_qa"],
        threshold=0.8,
        cost_error=5.0,
        cost_escalation=1.0,
        fit_temperature=True,
    )
    d, parsed = r.to_dict(), Page(render_html(r))
    assert {"cost", "temperature-fit"} <= parsed.ids()
    T = d["temperature"]
    for value in [T["pooled_T"], *T["group_T"].values()]:
        assert f"{value:.4f}" in parsed.cells
    assert f"{d['groups']['open_qa']['cost']['threshold']:.4f}" in parsed.cells
