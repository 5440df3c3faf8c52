"""Every public loss and every functional score compiles with ``torch.compile(fn,
fullgraph=True)`` in default settings (validation on): the eager value within float32
rounding, the eager gradients, and one graph for every batch size after the first change
(dynamo's automatic dynamic shapes: a third batch size compiles nothing).

The cases come from ``_hotpath_cases`` (which fails when a name of ``torchcal.losses.__all__``
or of the functional scores has none). Most run on dynamo's graph with a counting backend
(fast); the AOT-autograd backend traces the hand-written backward passes of the classification
rules and the CRPS; one case runs the real inductor backend.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from _hotpath_cases import all_cases, leaves
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

from torchcal.functional import log_score

pytestmark = pytest.mark.usefixtures("keep_distribution_validation")

SIZES = (8, 16, 24)


AOT_CASES = ("BrierLoss", "SphericalLoss", "RPSLoss", "CRPSLoss", "CRPSLoss[ensemble]")


def _check(fn, make, counter) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=counter)
    frames = []
    for n in SIZES:
        inputs = make(n, torch.Generator().manual_seed(n))
        ours, ref = leaves(inputs), leaves(inputs)
        out = compiled(*ours)
        expected = fn(*ref)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
        out.sum().backward()
        expected.sum().backward()
        for a, b in zip(ours, ref):
            if b.grad is not None:
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
        frames.append(counter.frame_count)
    # first size: a static graph; second: one recompile with a dynamic batch size; third: none
    assert frames[0] == 1 and frames[2] == frames[1] <= 2, frames


@pytest.mark.parametrize("name", sorted(all_cases()))
def test_fullgraph_matches_eager(name):
    fn, make = all_cases()[name]
    _check(fn, make, CompileCounter())


@pytest.mark.parametrize("name", AOT_CASES)
def test_fullgraph_aot_autograd(name):
    fn, make = all_cases()[name]
    _check(fn, make, CompileCounterWithBackend("aot_eager"))


def test_compiled_checks_still_reject_bad_values():
    """Inside the graph the value check is a device-side assertion, not skipped."""
    torch._dynamo.reset()
    compiled = torch.compile(log_score, fullgraph=True, backend=CompileCounter())
    z = torch.randn(4, 3)
    compiled(z, torch.tensor([0, 1, 2, 0]))
    z[2, 1] = float("nan")
    with pytest.raises(RuntimeError, match="log_score: expected"):
        compiled(z, torch.tensor([0, 1, 2, 0]))


def test_inductor_log_score_and_brier():
    """One real inductor compilation (the default backend) of a loss with a hand-written
    backward: the value and the gradient of eager mode."""
    from torchcal.losses import BrierLoss

    torch._dynamo.reset()
    loss = BrierLoss()
    compiled = torch.compile(loss, fullgraph=True)
    z = torch.randn(16, 5, requires_grad=True)
    y = torch.randint(0, 5, (16,))
    out = compiled(z, y)
    out.backward()
    z_ref = z.detach().clone().requires_grad_()
    ref = loss(z_ref, y)
    ref.backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(z.grad, z_ref.grad, rtol=1e-5, atol=1e-6)
