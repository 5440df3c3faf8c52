"""MkDocs hook: one API reference page per public namespace, generated from its ``__all__``.

A name added to a namespace's ``__all__`` gets its section on the next build, with the
signature and docstring (its runnable example included) rendered by mkdocstrings. The pages
are ``api/<namespace>.md``; ``mkdocs.yml`` lists them in its nav.
"""

from __future__ import annotations

import importlib

from mkdocs.structure.files import File

#: namespace -> the sentence that opens its page (docs/design.md section 2: the public names)
NAMESPACES = {
    "torchcal": "The top-level names: the result type of binned reliability.",
    "torchcal.functional": "The math: tensors in, tensors out, no state (formulas live here once).",
    "torchcal.losses": "`nn.Module` losses over the functional scores, each tagged `is_proper`.",
    "torchcal.metrics": "torchmetrics `Metric`s: summed states, exact under DDP.",
    "torchcal.scaling": "Post-hoc calibrators (`fit`, then call them on logits or forecasts).",
    "torchcal.callbacks": "Lightning callbacks (needs `pip install 'torchcal[lightning]'`).",
    "torchcal.audit": "The `torchcal audit` pipeline as a Python API.",
    "torchcal.engines": "Audits where the data lives: the binned state as a portable table, "
    "its SQL per dialect and the runners (DuckDB, Spark, in process).",
    "torchcal.rewards": "Proper scoring rules as rewards for a stated confidence (RL).",
    "torchcal.plotting": "Every figure torchcal draws (needs matplotlib).",
    "torchcal.integrations": "Calibration where LLM evaluations run: lm-evaluation-harness's "
    "multiple-choice log-likelihoods, its logged samples, Hugging Face `evaluate`.",
}

OPTIONS = """    options:
      heading_level: 2
      show_root_heading: true
      show_root_full_path: false
      show_source: false
      members_order: source
"""


def page(namespace: str) -> str:
    module = importlib.import_module(namespace)
    names = sorted(n for n in getattr(module, "__all__", ()) if not n.startswith("__"))
    lines = [f"# `{namespace}`", "", NAMESPACES[namespace], ""]
    lines += [
        f"::: {namespace}",
        "    options:",
        "      members: false",
        "      show_root_heading: false",
        "",
    ]
    for name in names:
        if isinstance(getattr(module, name), type(module)):  # a sub-namespace has its own page
            continue
        lines += [f"::: {namespace}.{name}", OPTIONS]
    return "\n".join(lines)


def on_files(files, config):
    for namespace in NAMESPACES:
        files.append(
            File.generated(config, f"api/{namespace.replace('.', '_')}.md", content=page(namespace))
        )
    return files
