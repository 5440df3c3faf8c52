"""The samples reader's fast parser against its strict per-line parser (docs/design.md section
6h): on random valid runs the same tensors bit for bit (and the fast parser took every file),
on hostile lines the same error, line number and message (or, where the strict parser takes
the line, the same tensors)."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from torchcal.integrations import _lm_eval_samples as samples
from torchcal.integrations._lm_eval_samples import _floats, _loads, read_samples

DATE = "2026-01-02T03-04-05.123456"
WORDS = ["yes", "no", "maybe", "café", "日本", "a b", "x\ny", 'q"t', "back\\slash", "-0", "1.5"]


def _record(rng: random.Random, delimiter: str) -> dict[str, Any]:
    k = rng.randint(2, 6)
    choices = rng.sample([f"{w} {i}" for i, w in enumerate(WORDS)], k)  # no digit strings
    gold = rng.randrange(k)
    target: Any = rng.choice([str(gold), gold, choices[gold]])
    lls = [
        rng.choice([-rng.expovariate(0.1), -rng.random() * 1e-300, -0.0, -1e22]) for _ in choices
    ]
    resps = [[rng.choice([repr(x), str(x), f"{x:.3e}"]), str(j == gold)] for j, x in enumerate(lls)]
    rec: dict[str, Any] = {"doc_id": 0, "doc": {"query": "Q?", "choices": choices}}
    rec["target"] = target
    rec["arguments"] = {
        f"gen_args_{j}": {"arg_0": "Q: ?\nA:", "arg_1": delimiter + c}
        for j, c in enumerate(choices)
    }
    rec["resps"] = [[r] for r in resps]
    rec["filtered_resps"] = resps
    rec["metrics"] = rng.choice([["acc", "acc_norm"], [], None, ["brier_score"]])
    if rec["metrics"] is None:
        del rec["metrics"]
    return rec


def _write_run(d: Path, seed: int) -> None:
    rng = random.Random(seed)
    configs = {}
    for t in range(rng.randint(1, 3)):
        delimiter = rng.choice([" ", "", "\n", " | "])
        configs[f"task{t}"] = {"target_delimiter": delimiter}
        lines = []
        for _ in range(rng.randint(1, 300)):
            text = json.dumps(_record(rng, delimiter), ensure_ascii=rng.random() < 0.5)
            lines.append(text + rng.choice(["\n"] * 8 + ["\r\n"]))
            if rng.random() < 0.05:  # blank lines, now and then a run longer than a chunk
                lines.append("\n" * rng.choice([1, 1, 2, samples.CHUNK + 5]))
        data = "".join(lines)
        if rng.random() < 0.3:
            data = data.rstrip("\n")  # no newline after the last line
        (d / f"samples_task{t}_{DATE}.jsonl").write_bytes(data.encode())
    (d / f"results_{DATE}.json").write_text(json.dumps({"configs": configs}))


def _strict(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the strict per-line parser from now on."""

    def refuse(*args: Any) -> int:
        raise samples._NotExact("the strict parser alone")

    monkeypatch.setattr(samples, "_parse_bulk", refuse)


def _outcome(path: Path) -> tuple[str, Any]:
    try:
        s = read_samples(path)
    except ValueError as e:
        return "error", str(e)
    bits = [t.view(torch.int64) if t.is_floating_point() else t for t in (s.lls, s.lengths)]
    return "read", (s.tasks, s.files, s.group, s.target, *bits, s.blank_lines)


def _same(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    if a[0] != b[0] or a[0] == "error":
        return a == b
    return all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(a[1], b[1], strict=True)
    )


@pytest.mark.parametrize("seed", range(12))
def test_the_fast_parser_reads_random_runs_as_the_strict_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    _write_run(tmp_path, seed)
    with monkeypatch.context() as m:

        def no_strict(*args: Any) -> int:
            raise AssertionError("the strict parser re-read a valid file")

        m.setattr(samples, "_parse_lines", no_strict)
        fast = _outcome(tmp_path)
    _strict(monkeypatch)
    strict = _outcome(tmp_path)
    assert fast[0] == strict[0] == "read" and _same(fast, strict)


GOOD = {
    "target": "1",
    "arguments": {
        "gen_args_0": {"arg_0": "Q", "arg_1": " no"},
        "gen_args_1": {"arg_0": "Q", "arg_1": " yes"},
    },
    "filtered_resps": [["-2.5", "False"], ["-0.5", "True"]],
    "metrics": ["acc"],
}


def _with(**fields: Any) -> str:
    return json.dumps(GOOD | fields)


ARGS_LIST = [["Q", " no"], ["Q", " yes"]]
HOSTILE = [
    "{not json",
    "[1, 2]",
    "null",
    "5",
    '"text"',
    "   ",
    "\r",
    "\t",
    json.dumps({k: v for k, v in GOOD.items() if k != "target"}),
    json.dumps({k: v for k, v in GOOD.items() if k != "filtered_resps"}),
    _with(arguments=ARGS_LIST),  # the in-memory form: the strict parser takes it
    _with(arguments={"a": ["Q", " no"], "b": ["Q", " yes"]}),
    _with(arguments={"a": {"arg_0": "Q", "arg_1": 5}, "b": {"arg_0": "Q", "arg_1": " yes"}}),
    _with(arguments={"a": {"arg_0": "Q", "arg_1": [" no"]}, "b": {"arg_1": " yes"}}),
    _with(arguments={"a": {"arg_0": "Q", "arg_1": None}, "b": {"arg_1": " yes"}}),
    _with(arguments={"a": {"arg_0": "Q"}, "b": {"arg_1": " yes"}}),
    _with(arguments={"a": {"arg_1": " no"}, "b": {"arg_1": "yes"}}),
    _with(arguments={"a": {"arg_1": " "}, "b": {"arg_1": " yes"}}),
    _with(arguments={"a": {"arg_1": " no"}}, filtered_resps=[["-1.0", "True"]]),
    _with(arguments={"a": {"arg_1": " no"}}, filtered_resps=[["-1.0", "True"]], target="0"),
    _with(arguments=" no yes"),
    _with(filtered_resps={"0": ["-1", "x"], "1": ["-2", "y"]}),
    _with(filtered_resps="-1-2"),
    _with(filtered_resps=[["-2.5", "False"]]),
    _with(filtered_resps=[["-2.5"], ["-0.5"], ["-1.5"]]),
    _with(filtered_resps=["5", "6"]),  # r[0] of a string is its first character
    _with(filtered_resps=["-5", "6"]),
    _with(filtered_resps=[[], ["-0.5"]]),
    _with(filtered_resps=[[None], ["-0.5"]]),
    _with(filtered_resps=[{"a": 1}, ["-0.5"]]),
    _with(filtered_resps=[[True], [1.5]]),
    _with(filtered_resps=[["nan"], ["-inf"]]),
    _with(filtered_resps=[["1e999"], ["-0"]]),
    _with(filtered_resps=[["0x10"], ["1_000"]]),
    _with(filtered_resps=[[" 1.5 "], ["١٢.5"]]),
    _with(filtered_resps=[["1,2"], ["3"]]),
    _with(filtered_resps=[["1.5,2.5"], ["3.5"]]),
    _with(filtered_resps=[["1.0]"], ["[2.0"]]),
    _with(filtered_resps=[["1.0, 2.0"], []]),
    _with(filtered_resps=[["2.2250738585072011e-308"], ["4.9e-324"]]),
    _with(target="7"),
    _with(target="-1"),
    _with(target="²"),
    _with(target="٣"),
    _with(target="١"),
    _with(target=True),
    _with(target=1.0),
    _with(target=None),
    _with(target=["1"]),
    _with(target="yes"),
    _with(target="maybe"),
    _with(target=-1),
    _with(target=10**30),
    _with(target=1),
    _with(metrics=["acc_mutual_info"]),
    _with(metrics="acc_mutual_info_x"),
    _with(metrics={"acc_mutual_info": 1}),
    _with(metrics=5),
    _with(metrics=0),
    _with(metrics=[["acc_mutual_info"]]),
    _with(metrics=None),
    _with(metrics="acc"),
    json.dumps(GOOD).replace('"acc"]', '"acc_mutual\\u005finfo"]'),
    json.dumps(GOOD).replace('{"target": "1"', '{"target": "1", "target": "0"'),
    json.dumps(GOOD).replace('" yes"', '" y\\ud800s"'),
    json.dumps(GOOD).replace('" yes"', '" y\\u00e9s"'),
    json.dumps(GOOD).replace('"Q"', '"Q\\x"', 1),
    json.dumps(GOOD)[:-1] + ', "doc": ' + "[" * 3000 + "]" * 3000 + "}",
    json.dumps(GOOD)[:-1] + ', "big": 1e400}',
    json.dumps(GOOD)[:-1] + ', "big": 123456789012345678901234567890}',
    json.dumps(GOOD)[:-1] + ', "nan": NaN}',
    json.dumps(GOOD) + " trailing",
    json.dumps(GOOD) + json.dumps(GOOD),
]


@pytest.mark.parametrize("where", ["first", "chunk edge", "last, no newline", "alone"])
@pytest.mark.parametrize("line", HOSTILE + ["\xff"])
def test_a_hostile_line_gets_the_strict_parsers_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, where: str
) -> None:
    good = (json.dumps(GOOD) + "\n").encode()
    bad = b"\xff\xfe" if line == "\xff" else line.encode("utf-8", "surrogatepass")
    if where == "first":
        data = bad + b"\n" + good * 3
    elif where == "chunk edge":  # the first line of the second chunk
        data = good * samples.CHUNK + bad + b"\n" + good
    elif where == "last, no newline":
        data = good * 3 + bad
    else:  # every line of the file (a chunk of one kind of target)
        data = (bad + b"\n") * 2
    (tmp_path / f"samples_a_{DATE}.jsonl").write_bytes(good * 2)  # a task read before
    (tmp_path / f"samples_t_{DATE}.jsonl").write_bytes(data)
    fast = _outcome(tmp_path)
    _strict(monkeypatch)
    strict = _outcome(tmp_path)
    assert _same(fast, strict), (fast, strict)


def test_the_hostile_lines_reach_both_answers() -> None:
    """The table is not all errors (nor all reads): both sides of the fast parser's fallback
    are exercised."""
    loads = _loads()
    kinds = set()
    for line in HOSTILE:
        try:
            rec = loads(line)
            samples._document(rec, " ", lambda c: c.startswith(" "))
            kinds.add("read")
        except (ValueError, KeyError, IndexError, TypeError):
            kinds.add("error")
    assert kinds == {"read", "error"}


def test_the_numbers_parse_as_float_parses_them_bit_for_bit() -> None:
    rng = random.Random(0)
    texts = []
    for _ in range(20000):
        x = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        texts.append(repr(x))  # nan and inf included: they go to float
    texts += [f"{rng.random():.{rng.randint(1, 30)}e}" for _ in range(5000)]
    texts += ["2.2250738585072011e-308", "2.4703282292062327e-324", "2.4703282292062328e-324"]
    texts += ["1.00000000000000011102230246251565404236316680908203125", "-0.0", "1e-400"]
    finite = [t for t in texts if t not in ("nan", "inf", "-inf")]
    for chunk in (texts, finite, ["1", "2.0"], [" 3.5", "4.5\t"], []):
        got = _floats(chunk, _loads())
        assert [struct.pack("<d", x) for x in got] == [struct.pack("<d", float(t)) for t in chunk]
        assert all(type(x) is float for x in got)
    with pytest.raises(ValueError):
        _floats(["1.0", "x"], _loads())
