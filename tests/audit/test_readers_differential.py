"""Every reader reads the same rows: seeded generated CSV files with quoted commas, quotes and
line breaks in fields, CRLF / CR-only / mixed line ends, a BOM, NUL bytes in a text field,
64 kB rows, blank lines, no final line break, percents, True/False labels and names of every
length are read by the numpy engine (several block sizes), the pyarrow engine (small blocks,
so it hands over mid-file) and ``auto``, and must give exactly the rows the generator wrote
(values, group ids in order of first appearance, start lines, excluded rows). The same files
with one defect each must be rejected by every engine with the same one-line message naming
the right line. Number syntax: every token that numpy.loadtxt or pyarrow accepts, the readers'
own parser accepts with the same value (so the fast paths never read what the slow one would
reject)."""

import io
import re
from decimal import Decimal

import numpy as np
import pytest

from torchcal.audit import _arrow, _csv
from torchcal.audit._columns import ReadLog
from torchcal.audit.io import read_columns
from torchcal.engines.text import parse_number, parse_value

pa = pytest.importorskip("pyarrow")
pc = pytest.importorskip("pyarrow.csv")

NAMES = ["math", "open qa", "a,b", 'say "hi"', "x" * 70, "ü-é", "z" * 9, "m"]
KINDS = {"p": "stated", "y": "label"}


def _quote(s):
    return '"' + s.replace('"', '""') + '"'


def _field(s):
    return _quote(s) if any(ch in s for ch in ',"\r\n') else s


def make_file(seed, rows=120, *, quotes=True, extras=True, sparse=False):
    """A CSV and the rows a correct reader gives: (p, y, group name, start line); ``sparse``:
    the only quotes are a few text fields whose lines look like rows, late in the file."""
    rng = np.random.default_rng(seed)
    eol = ["\n", "\r\n", "\r"][seed % 3]
    order = list(rng.permutation(["id", "domain", "p", "y"]))
    order.insert(4 if seed % 2 else int(rng.integers(5)), "text")
    if seed % 4 == 2:  # the group name last: before the line end (\r\n when seed % 3 == 1)
        order.append(order.pop(order.index("domain")))
    # quoted text whose lines look like rows (the printf example when text is last)
    fake = [
        ",".join({"id": "9", "domain": "m", "p": v, "y": "0", "text": "z"}[c] for c in order)
        for v in ("0.05", "0.07")
    ]
    lines, out, truth, excluded = 1, [], [], []

    def emit(fields):
        nonlocal lines
        rec = ",".join(fields)
        end = eol if seed % 7 else str(rng.choice(["\n", "\r\n"]))  # mixed line ends
        out.append(rec + end)
        start = lines
        one = rec.replace("\r\n", "\n")
        lines += one.count("\n") + one.count("\r") + 1
        return start

    emit(order)
    for i in range(rows):
        if extras and rng.random() < 0.03:
            out.append(eol)  # a blank line
            lines += 1
        q = round(float(rng.random()), int(rng.integers(1, 6)))
        style = int(rng.choice([0, 1, 5] if sparse else range(7)))  # sparse: pyarrow reads
        exact = Decimal(repr(q))
        if style == 0:
            ptxt = repr(q)
        elif style == 1:
            ptxt = f"{q:.3e}"
            exact = Decimal(ptxt)
        elif style == 2:
            ptxt = f" {q} "
        elif style == 3:
            ptxt = f"{exact * 100}%"
        elif style == 4:
            ptxt = f" {exact * 100} % "
        elif style == 5:
            ptxt = repr(q).lstrip("0") if q < 1 else repr(q)  # ".5"
        else:
            ptxt = _quote(repr(q)) if quotes and not sparse else repr(q)
        p = float(exact)
        y = int(rng.random() < q)
        ytxt = [str(y), f"{y}.0", ["False", "True"][y], ["false", "TRUE"][y]][int(rng.integers(4))]
        ytxt = str(y) if sparse else ytxt
        name = NAMES[int(rng.integers(len(NAMES) if quotes and not sparse else 2))]
        if not quotes or sparse:
            name = name.replace(" ", "_")
        text = "plain"
        r = rng.random()
        if sparse:
            if i > rows // 2 and r < 0.05:
                text = _quote("x:\n" + "\n".join(fake))
        elif quotes and r < 0.15:
            pick = ["a\nb", "a\r\nb", "x,y", 'he said "no"', "c\rd", "x:\n" + "\n".join(fake)]
            text = _quote(str(pick[int(rng.integers(len(pick)))]))
        elif extras and r < 0.18:
            text = "t" * 65536  # a 64 kB row
        elif extras and r < 0.20:
            text = "nul\x00byte"
        elif r < 0.25:
            text = ""
        bad = extras and rng.random() < 0.005
        if bad:
            ptxt = "high"
        vals = {"id": str(i), "domain": _field(name), "p": ptxt, "y": ytxt, "text": text}
        start = emit([vals[c] for c in order])
        if bad:
            excluded.append(start)
        else:
            truth.append((p, float(y), name, start))
    text = "".join(out)
    if seed % 5 == 0:
        text = text.rstrip("\r\n")  # no final line break
    data = ("\ufeff" if seed % 4 == 0 else "") + text
    return data.encode(), truth, excluded


def read(path, engine, chunk_rows):
    log = ReadLog()
    chunks = list(
        read_columns(
            path,
            ["p", "y"],
            group="domain",
            engine=engine,
            chunk_rows=chunk_rows,
            kinds=KINDS,
            log=log,
            max_unparsed=0.5,
        )
    )
    names = chunks[-1].group_names
    rows = []
    for c in chunks:
        for i in range(c.rows):
            rows.append((c.columns["p"][i], c.columns["y"][i], names[c.groups[i]], int(c.lines[i])))
    ids = np.concatenate([c.groups for c in chunks])
    return rows, ids, names, log


CONFIGS = [("numpy", 1 << 20), ("numpy", 7), ("pyarrow", 1 << 20), ("pyarrow", 13), ("auto", 50)]


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(_arrow, "BLOCK", 2048)


@pytest.fixture(params=["fast", "slow"])
def paths(request, monkeypatch):
    """ "fast": the vectorised block readers where they apply (and count how often they do);
    "slow": every block through the csv module."""
    used = {"plain": 0, "quoted": 0, "converters": 0}
    real_converters = _csv.value_converters

    def counted(*a, **k):
        used["converters"] += 1
        return real_converters(*a, **k)

    monkeypatch.setattr(_csv, "value_converters", counted)
    for name in ("split_fields", "quoted_fields"):
        real = getattr(_csv, name)

        def wrapped(*a, _real=real, _name=name, **k):
            if request.param == "slow":
                return None
            got = _real(*a, **k)
            used["plain" if _name == "split_fields" else "quoted"] += got is not None
            return got

        monkeypatch.setattr(_csv, name, wrapped)
    return request.param, used


@pytest.mark.parametrize("mode", ["quoted", "sparse-quotes", "quote-free"])
def test_every_reader_gives_the_generated_rows(tmp_path, small_blocks, paths, mode):
    for seed in range(12):
        kw = {"quotes": mode != "quote-free", "sparse": mode == "sparse-quotes"}
        kw["extras"] = not kw["sparse"]
        data, truth, excluded = make_file(seed, rows=300 if kw["sparse"] else 120, **kw)
        path = tmp_path / f"f{seed}.csv"
        path.write_bytes(data)
        order = list(dict.fromkeys(t[2] for t in truth))
        for engine, chunk_rows in CONFIGS:
            rows, ids, names, log = read(path, engine, chunk_rows)
            assert rows == truth, (seed, engine, chunk_rows)
            assert names == order
            np.testing.assert_array_equal(ids, [order.index(t[2]) for t in truth])
            assert log.excluded_rows == len(excluded) and log.kept == len(truth)
            if excluded:
                (e,) = log.excluded.values()
                assert e.where == f"line {excluded[0]}" and e.text == "high"
    kind, used = paths
    if kind == "fast":  # the vectorised readers did read blocks of these files
        assert used["quoted" if mode != "quote-free" else "plain"] > 0, used
        assert used["converters"] > 0 or mode == "sparse-quotes", used  # percents, True/False


def test_quote_free_plain_files_stay_on_the_fast_path(tmp_path, small_blocks, monkeypatch):
    """Files without quotes, percents, booleans or blank lines: pyarrow reads them alone."""

    def fail(*a, **k):
        raise AssertionError("the numpy path was used")

    for seed in (1, 2, 3):
        rng = np.random.default_rng(seed)
        eol = ["\n", "\r\n", "\r"][seed % 3]
        rows = [f"{i},{'ab'[i % 2]}{i % 5},{rng.random()!r},{i % 2}" for i in range(300)]
        path = tmp_path / f"p{seed}.csv"
        path.write_bytes(eol.join(["id,domain,p,y", *rows, ""]).encode())
        ref, *_ = read(path, "numpy", 1 << 20)
        with monkeypatch.context() as m:
            m.setattr(_csv, "read_csv", fail)
            got, *_ = read(path, "pyarrow", 64)
        assert got == ref and [r[3] for r in got] == list(range(2, 302))


DEFECTS = [
    (
        "extra-field",
        lambda r: r + ",extra",
        r"^line {L}: expected 5 fields \(as the header\), got 6$",
    ),
    ("missing-field", lambda r: r.rsplit(",", 1)[0], r"^line {L}: expected 5 fields .*got 4$"),
    ("label-underscore", "y=0_1", r"^y: label '0_1' at line {L} is not a number nor True/False"),
    ("label-yes", "y=yes", r"^y: label 'yes' at line {L} is not a number nor True/False"),
    ("label-arabic-digit", "y=\u0661", r"^y: label '\u0661' at line {L} is not a number"),
    ("label-empty", "y=", r"^y: label '' at line {L} is not a number"),
    (
        "nul-group",
        "domain=ab\x00",
        r"^domain: group name 'ab\\x00' holds a NUL character at line {L}$",
    ),
    (
        "nul-long-group",
        "domain=abcdefghij\x00",
        r"^domain: group name .* holds a NUL .* at line {L}$",
    ),
    ("empty-group", "domain=", r"^domain: empty group name at line {L}$"),
    (
        "unclosed-quote",
        'text="open',
        r"^line \d+: (text after a closing quote \(in the field quoted "
        r"on line {L}\)|a quote that is never closed): quote a field",
    ),
    (
        "stray-quote",
        'text=5"x',
        r"^line {L}: a quote inside an unquoted field: quote a field that "
        r'holds a quote and double the quotes inside \("5"" screen"\)$',
    ),
    ("text-after-quote", 'text="a"b', r"^line {L}: text after a closing quote: quote a field"),
    ("space-before-quote", 'text= "a"', r"^line {L}: a quote inside an unquoted field"),
]


def _defective(seed, rows, edit):
    """A quote-free (or quoted) valid file with ``edit`` applied to one data record."""
    rng = np.random.default_rng(100 + seed)
    eol = ["\n", "\r\n", "\r"][seed % 3]
    header = "id,domain,p,y,text"
    recs = []
    for i in range(rows):
        text = '"q,\nr"' if seed % 2 and i % 9 == 0 else "t"
        recs.append(f"{i},{'ab'[i % 2]},{rng.random():.4f},{i % 2},{text}")
    k = int(rng.integers(rows // 3, rows))
    if callable(edit):
        recs[k] = edit(recs[k])
    else:
        col, value = edit.split("=", 1)
        fields = recs[k].split(",", 4)
        fields[header.split(",").index(col)] = value
        recs[k] = ",".join(fields)
    line = 2 + sum(r.count("\n") for r in recs[:k]) + k
    return (eol.join([header, *recs]) + eol).encode(), line


@pytest.mark.parametrize(("edit", "message"), [d[1:] for d in DEFECTS], ids=[d[0] for d in DEFECTS])
def test_every_reader_rejects_a_defect_with_its_line(tmp_path, small_blocks, edit, message):
    for seed in range(4):
        data, line = _defective(seed, 200, edit)
        path = tmp_path / f"d{seed}.csv"
        path.write_bytes(data)
        errors = set()
        for engine, chunk_rows in CONFIGS:
            with pytest.raises(ValueError) as e:
                read(path, engine, chunk_rows)
            errors.add(str(e.value))
        assert len(errors) == 1, errors
        (msg,) = errors
        assert "\n" not in msg
        assert re.search(message.format(L=line), msg), (seed, msg, line)


def _tokens(rng, n):
    alphabet = list("0123456789") * 3 + list(".+-eE_ %x\t") + ["nan", "inf", "inity", "\u0661"]
    out = []
    for _ in range(n):
        k = int(rng.integers(1, 7))
        out.append("".join(str(rng.choice(alphabet)) for _ in range(k)))
    return out


def test_fast_parsers_accept_nothing_the_readers_parser_rejects():
    """loadtxt (the numpy fast path) and pyarrow (the fast engine) accept a subset of
    parse_number's syntax, with the same values: random tokens plus the known traps."""
    rng = np.random.default_rng(0)
    tokens = _tokens(rng, 3000) + ["0.0_5", "0_8", "1_000", "nan(1)", "-nan", "Infinity", "1e999"]
    tokens += [" 0.5 ", "\t.5", "5.", "+.5", "1e-3", "١", "0x10", "1d5", ".e5", "85%", "True"]
    tokens = [t for t in dict.fromkeys(tokens) if t.strip() and "\n" not in t]
    body = "".join(f"{t},0\n" for t in tokens)
    for t in tokens:
        try:
            got = np.loadtxt(io.StringIO(f"{t},0\n"), delimiter=",", usecols=[0], ndmin=2)[0, 0]
        except ValueError:
            got = None
        mine = parse_number(t)
        if got is not None:
            assert mine is not None and (mine == got or (np.isnan(mine) and np.isnan(got))), t
    table = pc.read_csv(
        io.BytesIO(("a,b\n" + body).encode()),
        parse_options=pc.ParseOptions(quote_char=False),
        convert_options=pc.ConvertOptions(
            column_types={"a": pa.string()}, strings_can_be_null=False
        ),
    )
    for t in table.column("a").to_pylist():
        try:
            got = (
                pc.read_csv(
                    io.BytesIO(f"a\n{t}\n".encode()),
                    parse_options=pc.ParseOptions(quote_char=False),
                    convert_options=pc.ConvertOptions(
                        column_types={"a": pa.float64()}, null_values=[]
                    ),
                )
                .column("a")[0]
                .as_py()
            )
        except pa.ArrowInvalid:
            continue
        mine = parse_number(t)
        assert mine is not None and (mine == got or (np.isnan(mine) and np.isnan(got))), t


def test_number_policy():
    """The documented syntax: what is read, and the traps that are not."""
    for t, v in [("1e-3", 0.001), (" 0.5 ", 0.5), (".5", 0.5), ("5.", 5.0), ("-0", -0.0)]:
        assert parse_number(t) == v
    assert np.isnan(parse_number("nan")) and parse_number("-Infinity") == -np.inf
    for t in ["0.0_5", "0_8", "1_000", "\u0661", "0x10", "", " ", "1e", "e5", "85%", "True"]:
        assert parse_number(t) is None, t
    # percents: the decimal divided by 100 exactly, rounded once
    for t in ["85%", " 85 % ", "33.3333333333333333%", "0.1%", "100%", "+.5%", "5.%"]:
        core = t.strip()[:-1].strip()
        assert parse_value(t, "stated") == float(Decimal(core) / 100), t
    assert parse_value("85%", "number") is None and parse_value("nan%", "stated") is None
    # a percent is a plain decimal (the SQL of every dialect reads its digits): no exponent
    assert parse_value("1e1%", "stated") is None and parse_value(".5e-1 %", "stated") is None
    assert parse_value("TRUE", "label") == 1.0 and parse_value(" false ", "label") == 0.0
    assert parse_value("yes", "label") is None and parse_value("True", "stated") is None
