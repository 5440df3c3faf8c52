"""On a CUDA device (``-m cuda``; skipped without one): every loss and functional score runs
forward and backward under ``torch.cuda.set_sync_debug_mode("error")`` (any host
synchronisation raises), gives the CPU value, and compiles with ``fullgraph=True``."""

from __future__ import annotations

import contextlib

import pytest
import torch
from _hotpath_cases import all_cases, leaves

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("keep_distribution_validation")]


@contextlib.contextmanager
def no_sync():
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _on_cuda(fn):
    if isinstance(fn, torch.nn.Module):
        return fn.to("cuda")
    return fn


@pytest.mark.parametrize("name", sorted(all_cases()))
def test_no_host_sync_on_cuda(name):
    fn, make = all_cases()[name]
    inputs = make(64, torch.Generator().manual_seed(5))
    ref = fn(*leaves(inputs))
    fn = _on_cuda(fn)
    cuda_inputs = leaves(tuple(x.cuda() for x in inputs))
    fn(*leaves(cuda_inputs)).sum().backward()  # warm-up: lazy CUDA initialisation
    torch.cuda.synchronize()
    with no_sync():
        out = fn(*cuda_inputs)
        out.sum().backward()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    for x in cuda_inputs:
        if x.requires_grad:
            assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name", ["LogScoreLoss", "BrierLoss", "CRPSLoss", "FocalLoss"])
def test_compiled_on_cuda_matches_eager(name):
    fn, make = all_cases()[name]
    fn = _on_cuda(fn)
    inputs = leaves(tuple(x.cuda() for x in make(64, torch.Generator().manual_seed(6))))
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    expected = fn(*leaves(inputs))
    compiled(*leaves(inputs))  # compile (may synchronise)
    torch.cuda.synchronize()
    with no_sync():
        out = compiled(*inputs)
        out.sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
