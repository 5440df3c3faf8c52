"""Build the wheel, install it into a fresh venv holding only the core dependencies, smoke-test it.

Fast and offline: the fresh venv gets no copy of torch. Its site-packages reads the core
dependencies' closure (torch, numpy, torchmetrics and what they require, from the wheel's own
metadata) through one ``.pth`` pointing at a folder of symlinks into the CI venv, so
Lightning, matplotlib, pyarrow and the test tools are absent there, as after
``pip install torchcal``. Checks: the wheel holds ``torchcal/`` and its metadata only (no
``recipes``), ``pip check`` passes, the library imports without Lightning, a loss, a metric
and a scaler run, ``torchcal --version`` prints the package version and ``torchcal audit``
runs on example data. Prints the wheel's file list.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import tempfile
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SMOKE = """
import importlib.util, sys
import torch
import torchcal
from torchcal.losses import LogScoreLoss
from torchcal.metrics import CalibrationError
from torchcal.scaling import TemperatureScaler

for absent in ("lightning", "pytorch_lightning", "matplotlib", "pyarrow", "recipes", "pytest"):
    assert importlib.util.find_spec(absent) is None, f"{absent} is installed by the core install"
assert torchcal.__file__.startswith(sys.prefix), torchcal.__file__  # the wheel, not the checkout
logits = torch.randn(256, 4, generator=torch.Generator().manual_seed(0)) * 3
target = torch.distributions.Categorical(logits=logits / 3).sample()
loss = LogScoreLoss()(logits, target)
ece = CalibrationError(n_bins=10)
ece.update(logits, target)
t = TemperatureScaler().fit(logits, target).temperature
print(f"torchcal {torchcal.__version__}: loss {float(loss):.4f}, ECE {float(ece.compute()):.4f}, T {t:.3f}")
"""


def run(*cmd: str | Path, cwd: Path | None = None) -> str:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"FAILED: {' '.join(map(str, cmd))}\n{out.stdout}{out.stderr}")
    return out.stdout


def requirement_closure(names: list[str]) -> list[md.Distribution]:
    """The installed distributions that ``names`` need, following unconditional requirements."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = re.split(r"[\s<>=!~;\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        dist = md.distribution(name)
        seen[name] = dist
        for req in dist.requires or []:
            marker = req.split(";", 1)[1] if ";" in req else ""
            if "extra" in marker:
                continue
            if marker and not eval_marker(marker):
                continue
            todo.append(req)
    return list(seen.values())


def eval_marker(marker: str) -> bool:
    from packaging.markers import Marker

    return Marker(marker).evaluate()


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="torchcal-wheel-"))
    run(sys.executable, "-m", "build", "--wheel", "--outdir", tmp / "dist", ROOT)
    (wheel,) = (tmp / "dist").glob("torchcal-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    print(f"{wheel.name}: {len(names)} files")
    for n in names:
        print(f"  {n}")
    stray = [n for n in names if not re.match(r"torchcal(/|-[^/]+\.dist-info/)", n)]
    if stray:
        sys.exit(f"FAILED: the wheel installs more than torchcal: {stray}")
    with zipfile.ZipFile(wheel) as z:
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        text = z.read(metadata).decode()
    core = [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    wheel_version = re.search(r"^Version: (.+)$", text, flags=re.M)[1]
    print(f"core dependencies: {core}")
    site = tmp / "core-site"
    site.mkdir()
    for dist in requirement_closure(core):
        tops = {Path(str(f)).parts[0] for f in dist.files or []}
        base = Path(str(dist.locate_file("")))
        for top in tops:
            if top not in ("..", "bin") and not (site / top).exists() and (base / top).exists():
                (site / top).symlink_to(base / top)
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    Path(purelib, "core-dependencies.pth").write_text(f"{site}\n")
    pip = (sys.executable, "-m", "pip", "--python", py)
    run(*pip, "install", "-q", "--no-deps", "--no-index", wheel)
    run(*pip, "check")
    outside = Path(tempfile.mkdtemp(prefix="torchcal-smoke-"))  # no checkout on sys.path
    print(run(py, "-c", SMOKE, cwd=outside).strip())
    version = run(env_dir / "bin" / "torchcal", "--version", cwd=outside).strip()
    print(version)
    if version != f"torchcal {wheel_version}":
        sys.exit(f"FAILED: torchcal --version printed {version!r}")
    run(env_dir / "bin" / "torchcal", "example", "judging.csv", "--n", "400", cwd=outside)
    audit = subprocess.run(
        [env_dir / "bin" / "torchcal", "audit", "judging.csv", "--probs", "p_correct"]
        + ["--label", "correct", "--group", "domain"],
        cwd=outside,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    # 0 PASS, 1 FAIL, 3 INCONCLUSIVE: any verdict; 2 (an error) is a failure
    if audit.returncode not in (0, 1, 3) or "torchcal audit:" not in audit.stdout:
        sys.exit(f"FAILED: torchcal audit (exit {audit.returncode})\n{audit.stdout}{audit.stderr}")
    print(audit.stdout.splitlines()[0])
    print("wheel smoke test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
