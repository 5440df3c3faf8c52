"""torchcal.report: ReliabilityTable exports (text, markdown, CSV, dict), plot, GroupedResult."""

from __future__ import annotations

import csv
import io
import math

import pytest
import torch

import torchcal
from torchcal import GroupedResult, ReliabilityTable
from torchcal.functional import reliability_table
from torchcal.functional.calibration.results import CSV_COLUMNS


@pytest.fixture
def table() -> ReliabilityTable:
    # bin 9: seven right out of seven at 0.97; bin 2: 0.25, 0.28 (one right); bins else empty
    conf = torch.tensor([0.97] * 7 + [0.25, 0.28], dtype=torch.float64)
    hit = torch.tensor([1] * 7 + [0, 1])
    return reliability_table(conf, hit, n_bins=10, reading="binary", input="probs")


def test_public_name():
    assert torchcal.ReliabilityTable is ReliabilityTable


def test_fields(table):
    assert table.n_bins == 10 and table.n == 9
    assert table.count.tolist() == [0, 0, 2, 0, 0, 0, 0, 0, 0, 7]
    assert table.lo[3] == 0.3 and table.hi[9] == 1.0
    assert math.isnan(float(table.conf[0])) and math.isnan(float(table.gap[0]))
    assert abs(float(table.gap[9]) - (0.97 - 1.0)) < 1e-15
    assert abs(float(table.gap[2]) - (0.265 - 0.5)) < 1e-15
    assert abs(table.ece - (7 / 9 * 0.03 + 2 / 9 * 0.235)) < 1e-15


def test_to_text_columns_and_omitted(table):
    text = table.to_text()
    lines = text.splitlines()
    assert lines[0].startswith("reliability table: reading=binary, n=9, 10 bins, 95% wilson")
    header = lines[1].split()
    assert header == ["bin", "lo", "hi", "count", "conf", "acc", "gap", "ci"]
    rows = lines[2:4]
    assert rows[0].split()[:4] == ["2", "0.200", "0.300", "2"]
    assert rows[1].split()[:7] == ["9", "0.900", "1.000", "7", "0.9700", "1.0000", "-0.0300"]
    assert rows[1].endswith("[0.6457, 1.0000]")  # 7/7 certifies only ~0.65 at 95 %
    # aligned: every column right-aligned to the same width
    assert len({len(r.split("[")[0]) for r in [lines[1].split("ci")[0] + "["] + rows}) == 1
    assert lines[4] == "omitted (empty): bins 0, 1, 3, 4, 5, 6, 7, 8"
    assert lines[5].startswith("ECE (l1, equal-width) = ")
    assert lines[6] == "gap = conf - acc (> 0: overconfident); ci = 95% Wilson interval for acc"
    assert str(table) == text


def test_csv_long_format_is_nan_free(table):
    out = table.to_csv()
    rows = list(csv.DictReader(io.StringIO(out)))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [r["bin"] for r in rows] == ["2", "9"]  # empty bins omitted
    assert "nan" not in out.lower()
    assert float(rows[1]["ci_low"]) == pytest.approx(0.6457, abs=1e-4)
    assert float(rows[1]["conf"]) == pytest.approx(0.97, abs=1e-15)  # full precision
    assert table.to_csv(header=False).splitlines()[0].startswith("2,")


def test_rows_and_dict(table):
    rows = table.rows()
    assert [set(r) for r in rows] == [set(CSV_COLUMNS)] * 2
    d = table.to_dict()
    assert d["omitted"] == [0, 1, 3, 4, 5, 6, 7, 8]
    assert d["rows"] == rows and d["level"] == 0.95 and d["interval"] == "wilson"
    assert d["n"] == 9 and d["reading"] == "binary"


def test_markdown(table):
    md = table.to_markdown().splitlines()
    assert md[0] == "| bin | lo | hi | count | conf | acc | gap | ci |"
    assert md[1].count("|") == 9
    assert md[3].startswith("| 9 | 0.900 | 1.000 | 7 |")
    assert "omitted (empty): bins 0, 1, 3" in md[-1]


def test_single_bin_table():
    t = reliability_table(
        torch.tensor([0.2, 0.9]), torch.tensor([0, 1]), n_bins=1, reading="binary", input="probs"
    )
    assert t.rows()[0]["count"] == 2 and "omitted (empty): none" in t.to_text()


def test_plot(table):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from torchcal.plotting import reliability_diagram

    ax = reliability_diagram(table)
    assert ax.get_xlim() == (0.0, 1.0)
    assert len(ax.patches) == 2  # one accuracy bar per non-empty bin
    assert sorted(t.get_text() for t in ax.texts) == ["1/2", "7/7"]  # right / samples
    _, ax2 = plt.subplots()
    assert reliability_diagram(table, ax=ax2) is ax2
    with pytest.warns(DeprecationWarning, match="reliability_diagram"):  # the old spelling
        _, ax3 = plt.subplots()
        assert table.plot(ax=ax3) is ax3
    plt.close("all")


def test_plot_of_all_right_and_all_wrong_bins():
    # 10/10 and 0/13: the interval must not end on the wrong side of the accuracy
    # (a negative whisker length makes matplotlib's errorbar raise)
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conf = torch.tensor([0.95] * 10 + [0.15] * 13, dtype=torch.float64)
    hit = torch.tensor([1] * 10 + [0] * 13)
    t = reliability_table(conf, hit, n_bins=10, reading="binary", input="probs")
    assert float(t.ci_high[9]) == 1.0 and float(t.ci_low[1]) == 0.0
    from torchcal.plotting import reliability_diagram

    ax = reliability_diagram(t)
    assert sorted(x.get_text() for x in ax.texts) == ["0/13", "10/10"]
    plt.close("all")


def test_per_class_text_says_what_is_pooled():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 3, generator=g, dtype=torch.float64)
    target = torch.randint(0, 3, (200,), generator=g)
    text = reliability_table(logits, target, reading="classwise").to_text().splitlines()
    assert "n=600 (sample x class pairs)" in text[0] and ".per_class" in text[0]
    assert text[-2].startswith("ECE (l1, equal-width; classwise: mean over classes) = ")


def test_grouped_result_worst_group():
    r = GroupedResult(
        torch.tensor(0.1), torch.tensor([0.2, 0.5, float("nan")]), torch.tensor([10, 5, 0])
    )
    assert r.worst_group() == 1
    with pytest.raises(TypeError):
        GroupedResult(None, [None], torch.tensor([1])).worst_group()
