"""The reader of lm-eval's samples_*.jsonl and ``torchcal audit --from lm-eval`` (docs/design.md
section 6h): the fields read, the one-line errors with the line number, the per-task groups and
the temperature cross-fitted per task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchcal.audit.core import audit
from torchcal.cli import main
from torchcal.functional.folds import fold_complement, kfold_indices
from torchcal.integrations._lm_eval_samples import read_samples
from torchcal.integrations.lm_eval import audit_samples, choice_logits
from torchcal.scaling.temperature import TemperatureScaler

DATE = "2026-01-02T03-04-05.123456"


def _line(lls: list[float], choices: list[str], target: object, delim: str = " ") -> str:
    args = {
        f"gen_args_{i}": {"arg_0": "Q: ?\nA:", "arg_1": delim + c} for i, c in enumerate(choices)
    }
    resps = [[str(x), "False"] for x in lls]
    rec = {"doc_id": 0, "doc": {"q": "?"}, "target": target, "arguments": args}
    rec |= {"resps": [[r] for r in resps], "filtered_resps": resps, "filter": "none"}
    return json.dumps(rec) + "\n"


def _write_task(d: Path, task: str, n: int, temperature: float, seed: int, k: int = 4) -> None:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64)
    gold = torch.distributions.Categorical(logits=z).sample()
    lls = z * temperature  # the truth is softmax(lls / temperature)
    lines = [
        _line(lls[i].tolist(), [f"choice {c}" for c in range(k)], str(int(gold[i])))
        for i in range(n)
    ]
    (d / f"samples_{task}_{DATE}.jsonl").write_text("".join(lines))


def test_the_reader_takes_the_fields_the_harness_writes(tmp_path: Path) -> None:
    lines = [
        _line([-1.0, -2.0, -3.0], ["a", "bb", "ccc"], "2"),
        "\n",  # a blank line is counted, not read
        _line([-4.0, -0.5], ["yes", "no"], "no"),  # the gold as the choice's text
    ]
    (tmp_path / f"samples_mix_{DATE}.jsonl").write_text("".join(lines))
    other = _line([-2.0, -1.0], ["x", "yy"], "1", delim="")
    (tmp_path / f"samples_nodelim_{DATE}.jsonl").write_text(other)
    config = {"configs": {"nodelim": {"target_delimiter": ""}, "mix": {}}}
    (tmp_path / f"results_{DATE}.json").write_text(json.dumps(config))
    s = read_samples(tmp_path)
    assert s.tasks == ("mix", "nodelim") and s.blank_lines == 1
    assert s.target.tolist() == [2, 1, 1] and s.group.tolist() == [0, 0, 1]
    inf = float("-inf")
    assert s.lls.tolist() == [[-1.0, -2.0, -3.0], [-4.0, -0.5, inf], [-2.0, -1.0, inf]]
    assert s.lengths.tolist() == [[1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [1.0, 2.0, 1.0]]
    z = choice_logits(s.lls, s.lengths, "norm")
    assert z[1].tolist() == [-4.0 / 3, -0.25, inf]


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("{not json\n", 2, r"line 1 column 2 \(char 1\)"),
        ('{"target": "0", "arguments": {', 2, r"\(truncated: the file ends mid-line\)"),
        ('{"target": "0"}\n', 2, "no 'arguments' field"),
        ("[1, 2]\n", 2, "expected a JSON object, got list"),
        (_line([-1.0, -2.0], ["a", "b"], "7"), 2, "target: choice 7 of 2"),
        (_line([-1.0, -2.0], ["a", "b"], "c"), 2, "target: 'c' is no choice"),
        (_line([-1.0], ["a", "b"], "0"), 2, "filtered_resps: expected one"),
        (_line([-1.0, -2.0], ["a", ""], "0"), 2, "at least one character"),
        (_line([-1.0, -2.0], ["a", "b"], "0", delim="|"), 2, "every choice must be ' '"),
    ],
)
def test_a_bad_line_is_one_error_with_its_line_number(
    tmp_path: Path, text: str, where: int, message: str
) -> None:
    f = tmp_path / f"samples_t_{DATE}.jsonl"
    f.write_text(_line([-1.0, -2.0], ["a", "b"], "0") + text)
    with pytest.raises(ValueError, match=f"^{f}:{where}: bad samples line.*{message}"):
        read_samples(tmp_path)


def test_the_cli_says_it_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / f"samples_t_{DATE}.jsonl"
    f.write_text(_line([-1.0, -2.0], ["a", "b"], "0") + '{"target": ')
    assert main(["audit", "--from", "lm-eval", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"torchcal: error: {f}:2: bad samples line")
    assert main(["audit", "--from", "lm-eval"]) == 2
    assert "required: file (the RESULTS_DIR)" in capsys.readouterr().err


def test_the_files_of_a_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no samples_.*jsonl file"):
        read_samples(tmp_path)
    with pytest.raises(ValueError, match="no such file or directory"):
        read_samples(tmp_path / "nope")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for sub in ("a", "b"):
        (tmp_path / sub / f"samples_t_{DATE}.jsonl").write_text(
            _line([-1.0, -2.0], ["a", "b"], "0")
        )
    with pytest.raises(ValueError, match="task 't' is logged in two files"):
        read_samples(tmp_path)
    assert read_samples(tmp_path / "a").tasks == ("t",)
    (tmp_path / "a" / f"samples_u_{DATE}.jsonl").write_text("")
    with pytest.raises(ValueError, match="samples_u_.*: no documents"):
        read_samples(tmp_path / "a")


def test_each_task_gets_its_own_cross_fitted_temperature(tmp_path: Path) -> None:
    _write_task(tmp_path, "hot", 3000, 3.0, seed=0)  # over-confident: T near 3
    _write_task(tmp_path, "cold", 3000, 0.5, seed=1)  # under-confident: T near 0.5
    r = audit_samples(tmp_path, seed=7)
    t = r.temperature
    assert sorted(r.groups) == ["cold", "hot"]
    assert t["group_T"]["hot"] == pytest.approx(3.0, rel=0.1)
    assert t["group_T"]["cold"] == pytest.approx(0.5, rel=0.1)
    for name in ("hot", "cold"):
        assert (
            t["eval_after"]["groups"][name]["ece"] < 0.5 * t["eval_before"]["groups"][name]["ece"]
        )
        assert t["eval_before"]["groups"][name]["ece"] == r.groups[name]["ece"]
    # by hand: task g's folds are kfold_indices(n, 2, seed + g), each scored by the other's T
    s = read_samples(tmp_path)
    z = choice_logits(s.lls, s.lengths, "raw")
    after = z.clone()
    for g, name in enumerate(s.tasks):
        rows = torch.nonzero(s.group == g).squeeze(1)
        for k, held in enumerate(kfold_indices(rows.numel(), 2, 7 + g)):
            fit = rows[fold_complement(rows.numel(), held)]
            alone = TemperatureScaler(method="newton").fit(z[fit], s.target[fit]).temperature
            assert t["fold_T"][name][k] == pytest.approx(alone, rel=1e-8)
            after[rows[held]] = z[rows[held]] / t["fold_T"][name][k]
    expect = audit(after, s.target, groups=s.group, group_names=list(s.tasks), input="logits")
    for name in s.tasks:
        got = t["eval_after"]["groups"][name]["ece"]
        assert got == pytest.approx(expect.groups[name]["ece"], abs=1e-12)


def test_audit_from_lm_eval_writes_the_usual_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_task(tmp_path, "ok", 2000, 1.0, seed=2)
    out = tmp_path / "report"
    code = main(["audit", "--from", "lm-eval", str(tmp_path), "--out", str(out), "--diagrams", "0"])
    text = capsys.readouterr().out
    d = json.loads((out / "report.json").read_text())
    assert code == {"pass": 0, "fail": 1, "inconclusive": 3}[d["verdict"]]
    assert d["verdict"] == "pass"  # gold drawn from softmax(lls): calibrated
    assert d["read"]["rule"] == "raw" and d["read"]["rows"] == 2000
    assert d["temperature"]["group_T"]["ok"] == pytest.approx(1.0, rel=0.1)
    assert (out / "report.html").read_text().count("Temperature scaling") == 1
    assert "PASS" in text and "temperature: pooled T" in text


def test_few_rows_keep_t_at_one_with_a_warning(tmp_path: Path) -> None:
    _write_task(tmp_path, "big", 400, 1.0, seed=3)
    _write_task(tmp_path, "tiny", 3, 1.0, seed=4)
    with pytest.warns(UserWarning, match="group 'tiny': 3 rows, too few to cross-fit T"):
        r = audit_samples(tmp_path)
    assert r.temperature["fold_T"]["tiny"] is None and r.temperature["group_T"]["tiny"] == 1.0
