"""Group ids of an object column (a Parquet or frame column of names): hashed once, in order of
first appearance, the same ids as the sorted ``numpy.unique`` road of a string column; a missing
name is ``group_null`` only where the row rules read it; a value that is no name is a one-line
error naming its row, hashable or not."""

from __future__ import annotations

import numpy as np
import pytest

from torchcal.audit._arrays import _group_ids
from torchcal.audit._columns import GroupIndex


def _where(i: int) -> str:
    return f"row {i}"


def test_object_names_equal_the_string_road():
    rng = np.random.default_rng(0)
    names = np.array(["b", "a", "é", "c c", "a\u3000b"])[rng.integers(0, 5, 5000)]
    g1, g2 = GroupIndex(), GroupIndex()
    ids_obj = _group_ids(names.astype(object), "g", g1, _where)
    ids_str = _group_ids(names.astype(str), "g", g2, _where)
    assert ids_obj.tolist() == ids_str.tolist() and g1.names == g2.names
    assert g1.names == list(dict.fromkeys(names.tolist()))  # first appearance
    g3 = GroupIndex()  # bytes read as their UTF-8 text: the same ids
    ids_b = _group_ids(np.array([s.encode() for s in names], dtype=object), "g", g3, _where)
    assert ids_b.tolist() == ids_obj.tolist() and g3.names == g1.names


def test_missing_and_blank_names():
    v = np.array(["a", None, " ", "b", "a"], dtype=object)
    g = GroupIndex(null_blank=True)
    assert _group_ids(v, "g", g, _where).tolist() == [0, -1, -1, 1, 0] and g.names == ["a", "b"]
    with pytest.raises(ValueError, match=r"^g: empty group name at row 1 \(got None\)$"):
        _group_ids(v, "g", GroupIndex(), _where)


@pytest.mark.parametrize("bad", [[1, 2], np.zeros(2), 3.5, float("nan"), 7])
def test_a_value_that_is_no_name_names_its_row(bad):
    v = np.empty(4, dtype=object)
    v[:] = ["a", "b", "a", "b"]
    v[2] = bad
    with pytest.raises(ValueError, match=r"^g: empty group name at row 2 "):
        _group_ids(v, "g", GroupIndex(null_blank=True), _where)


def test_no_rows():
    assert _group_ids(np.array([], dtype=object), "g", GroupIndex(), _where).tolist() == []
