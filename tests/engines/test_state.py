"""The portable state: Arrow/Parquet round trip, the header, merging (refusals and
order-independent bits)."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from _engine_data import arrays, rows

from torchcal.engines.memory import state_from_arrays
from torchcal.engines.state import (
    CONFIG_FIELDS,
    METADATA_KEY,
    REJECT_REASONS,
    BinnedState,
    merge_states,
    read_state,
    read_states,
    write_state,
)


def _state(seed=0, weighted=True, n=500):
    a = arrays(rows(n, seed))
    if not weighted:
        a.pop("weight")
    return state_from_arrays(**a, group_column="g", weight_column="w" if weighted else None)


def _same_bits(a: BinnedState, b: BinnedState) -> None:
    assert a.groups == b.groups and a.header == b.header
    fa = () if a.fine is None else tuple(a.fine)
    fb = () if b.fine is None else tuple(b.fine)
    assert len(fa) == len(fb)  # the fine histogram too (torchcal/engines/fine.py)
    for x, y in zip(
        (*a.stats.__dict__.values(), a.nll, a.right, a.nll_inf, *fa),
        (*b.stats.__dict__.values(), b.nll, b.right, b.nll_inf, *fb),
    ):
        if x is None:
            assert y is None
            continue
        assert x.dtype == y.dtype
        assert torch.equal(x.view(torch.int64), y.view(torch.int64))  # every bit, NaN too


@pytest.mark.parametrize("ext", ["parquet", "arrow"])
@pytest.mark.parametrize("weighted", [False, True])
def test_round_trip_keeps_every_bit_and_the_header(tmp_path, ext, weighted):
    st = _state(weighted=weighted)
    path = tmp_path / f"s.{ext}"
    write_state(st, path)
    _same_bits(read_state(path), st)
    if ext == "parquet":
        t = pq.read_table(path)
        fine = ["fine_w2", "fine_y2", "fine_gap", "fine_var_w", "fine_var_w2"]
        t = t.filter(pa.compute.greater_equal(t.column("slot"), 0)).drop_columns(fine)
        cols = ["group", "slot", "bin", "n", "sum_c", "sum_y", "sum_c2", "sum_cy"]
        cols += ["sum_w", "sum_w2"] if weighted else []
        assert t.column_names == [*cols, "nll", "right", "nll_inf"]
        assert t.schema.field("n").type == pa.int64()
        assert all(t.schema.field(c).type == pa.float64() for c in cols[4:])
        h = json.loads(t.schema.metadata[METADATA_KEY])
        assert set(CONFIG_FIELDS) <= set(h)
        assert h["schema_version"] == 1 and h["n_bins"] == 10 and h["reading"] == "binary"
        assert h["weight"] == ("w" if weighted else None) and h["group"] == "g"
        assert list(h["rows_rejected"]) == list(REJECT_REASONS)
        assert h["rows_seen"] == t.column("n").to_numpy().sum() + sum(h["rows_rejected"].values())
        assert (t.column("n").to_numpy() > 0).all()  # only non-empty cells


def test_merging_parts_in_any_order_gives_the_same_bits():
    parts = [_state(seed=s, n=300) for s in range(10)]
    ref = merge_states(parts)
    rnd = random.Random(0)
    for _ in range(20):
        order = parts[:]
        rnd.shuffle(order)
        _same_bits(merge_states(order), ref)
    # the float sums are the correctly rounded sums of the parts (math.fsum), counts exact
    g = ref.groups.index("beta")
    vals = [p.stats.conf[p.groups.index("beta"), 0, 3].item() for p in parts]
    import math

    assert ref.stats.conf[g, 0, 3].item() == math.fsum(vals)
    assert int(ref.stats.count.sum()) == sum(int(p.stats.count.sum()) for p in parts)
    assert ref.header.rows_seen == sum(p.header.rows_seen for p in parts)


def test_merge_equals_the_state_of_all_rows():
    tables = [rows(300, s) for s in range(3)]
    parts = [state_from_arrays(**arrays(t), group_column="g", weight_column="w") for t in tables]
    whole = state_from_arrays(
        **arrays(pa.concat_tables(tables)), group_column="g", weight_column="w"
    )
    m = merge_states(parts)
    assert m.groups == whole.groups and m.header.rows_rejected == whole.header.rows_rejected
    assert torch.equal(m.stats.count, whole.stats.count)
    for x, y in (
        (m.stats.conf, whole.stats.conf),
        (m.stats.weight, whole.stats.weight),
        (m.nll, whole.nll),
    ):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "field, value",
    [
        ("n_bins", 15),
        ("reading", "confidence"),
        ("input", "logits"),
        ("num_classes", 3),
        ("group", None),
        ("weight", "w2"),
    ],
)
def test_merge_refuses_other_configurations_naming_the_field(tmp_path, field, value):
    st = _state()
    t = st.to_arrow()
    h = json.loads(t.schema.metadata[METADATA_KEY])
    h[field] = value
    other = t.replace_schema_metadata({METADATA_KEY: json.dumps(h).encode()})
    if field == "n_bins":  # a 15-bin state must hold 15 bins (a lying n_bins is refused on read)
        a = arrays(rows(500, 0))
        other = state_from_arrays(**a, group_column="g", weight_column="w", n_bins=15).to_arrow()
    pq.write_table(t, tmp_path / "a.parquet")
    pq.write_table(other, tmp_path / "b.parquet")
    with pytest.raises(ValueError, match=rf"b\.parquet: {field} is .* but .*a\.parquet has"):
        read_states(str(tmp_path / "*.parquet"))


def test_merge_refuses_another_bin_rule_and_a_file_states_it_on_read(tmp_path):
    st = _state()
    other = BinnedState(replace(st.header, bin_rule="width_bucket"), st.groups, st.stats)
    with pytest.raises(ValueError, match=r"state 1: bin_rule is 'width_bucket' but state 0 has"):
        merge_states([st, other])
    t = st.to_arrow()
    h = {**json.loads(t.schema.metadata[METADATA_KEY]), "bin_rule": "width_bucket"}
    pq.write_table(
        t.replace_schema_metadata({METADATA_KEY: json.dumps(h).encode()}), tmp_path / "b.parquet"
    )
    with pytest.raises(
        ValueError, match=r"b\.parquet: bin_rule is 'width_bucket', this torchcal reads"
    ):
        read_state(tmp_path / "b.parquet")


def test_weighted_and_unweighted_refuse_to_merge():
    with pytest.raises(ValueError, match="weight is None but state 0 has 'w'"):
        merge_states([_state(weighted=True), _state(weighted=False)])
    with pytest.raises(ValueError, match="cannot add weighted and unweighted"):
        _state(weighted=True).stats + _state(weighted=False).stats


def test_bad_state_files_are_named(tmp_path):
    pq.write_table(pa.table({"x": [1]}), tmp_path / "plain.parquet")
    with pytest.raises(ValueError, match="plain.parquet: not a torchcal state"):
        read_state(tmp_path / "plain.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="junk.parquet: cannot read a state"):
        read_state(tmp_path / "junk.parquet")
    with pytest.raises(ValueError, match="--state: no file matches"):
        read_states(str(tmp_path / "none-*.parquet"))
    t = _state().to_arrow()
    twice = pa.concat_tables([t, t.slice(0, 1)])
    pq.write_table(twice, tmp_path / "dup.parquet")
    with pytest.raises(ValueError, match="appears twice"):
        read_state(tmp_path / "dup.parquet")
    h = json.loads(t.schema.metadata[METADATA_KEY])
    h["schema_version"] = 2
    pq.write_table(
        t.replace_schema_metadata({METADATA_KEY: json.dumps(h).encode()}), tmp_path / "v2.parquet"
    )
    with pytest.raises(ValueError, match="v2.parquet: schema_version is 2"):
        read_state(tmp_path / "v2.parquet")


def test_rejected_rows_are_counted_by_their_first_reason():
    st = state_from_arrays(
        [0.5, np.nan, 1.5, 0.5, 0.5, 0.5, np.nan],
        [1, 1, 1, 2, 1, 1, 7],
        groups=["a", "a", "a", "a", None, "b", None],
        weight=[1, 1, 1, 1, 1, -1, 1],
    )
    assert st.header.rows_rejected == {
        "preds_unparsed": 0,
        "preds_null": 0,
        "preds_nan": 2,
        "preds_out_of_range": 1,
        "preds_not_normalised": 0,
        "label_invalid": 1,
        "group_null": 1,
        "weight_invalid": 1,
    }
    assert int(st.stats.count.sum()) == 1 and st.groups == ("a",)
