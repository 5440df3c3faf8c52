"""The one-screen script (recipes/complex_link_prediction/minimal.py) runs and shows what it
claims: a temperature fitted on one half calibrates the other half, and nothing reorders."""

from __future__ import annotations

from recipes.complex_link_prediction import minimal


def test_minimal_script_runs(capsys):
    out = minimal.main(epochs=10)
    assert "invariants ok" in capsys.readouterr().out
    assert out["temperature"] < 1 and out["ece_after"] < out["ece_before"]
