"""Each recipe's ``--help`` reads as plain text: whole sentences as group headings, no reST
markup, the example commands on lines of their own; ``--seeds 0`` is one seed; the one-screen
example prints its help instead of running."""

from __future__ import annotations

import contextlib
import importlib
import io
import runpy
import sys

import pytest

from recipes._common import summary

RECIPES = [
    "recipes.complex_link_prediction.cli",
    "recipes.heteroscedastic_regression.cli",
    "recipes.loss_bakeoff.cli",
    "recipes.calibrated_rewards.cli",
]


@pytest.mark.parametrize("module", RECIPES)
def test_help_is_plain_text(module):
    parser = importlib.import_module(module).build_parser()
    text = parser.format_help()
    assert "``" not in text and ":func:" not in text and ":class:" not in text, text
    for key, group in parser.groups.items():
        assert group.title.endswith(f" (--{key}.*)"), group.title


def test_group_headings_are_whole_sentences():
    # jsonargparse heads a group with the first docstring line of its function, which ended
    # here in "... under Lightning and fit its"; the heading is the whole first sentence
    from recipes.loss_bakeoff.model import train_one

    parser = importlib.import_module("recipes.loss_bakeoff.cli").build_parser()
    first = " ".join(train_one.__doc__.split("\n\n")[0].split())
    assert first.startswith("Train a fresh :func:`make_mlp` with ``objective`` under Lightning")
    assert parser.groups["model"].title == (
        "Train a fresh make_mlp with objective under Lightning and fit its temperature on val "
        "(--model.*)"
    )


def test_example_commands_are_not_broken_across_lines():
    text = importlib.import_module("recipes.loss_bakeoff.cli").build_parser().format_help()
    assert (
        "    python -m recipes.loss_bakeoff --config configs/bakeoff/digits.yaml --seeds 0 "
        "--losses [log_score,flsd53]" in text
    )


def test_one_seed_or_a_list():
    parser = importlib.import_module("recipes.loss_bakeoff.cli").build_parser()
    assert parser.parse_args(["--seeds", "0"]).seeds == 0  # run() reads it as [0]
    assert parser.parse_args(["--seeds", "[0,1]"]).seeds == [0, 1]


def test_summary_is_the_whole_first_sentence():
    def f():
        """Train a :class:`~a.Net` on ``x`` and fit
        its temperature. Then more.

        Args: none."""

    def g():
        """Both audits, ``tail`` then ``triple``:"""

    assert summary(f) == "Train a Net on x and fit its temperature."
    assert summary(g) == "Both audits, tail then triple."


def test_minimal_help_prints_and_exits_without_running(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["minimal", "--help"])
    sys.modules.pop("recipes.complex_link_prediction.minimal", None)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        runpy.run_module("recipes.complex_link_prediction.minimal", run_name="__main__")
    assert stop.value.code == 0
    assert "usage: python -m recipes.complex_link_prediction.minimal" in out.getvalue()
    assert "filtered" not in out.getvalue().split("usage:")[0]  # nothing trained or printed before
