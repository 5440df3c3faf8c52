"""Fixtures shared by the functional tests."""

import pytest
import torch


@pytest.fixture
def keep_distribution_validation():
    """torch.compile switches torch.distributions' default argument validation off for the
    whole process on its first use: restore it, other tests rely on it. The compiling test
    modules take it with ``pytestmark = pytest.mark.usefixtures(...)``."""
    previous = torch.distributions.Distribution._validate_args
    yield
    torch.distributions.Distribution.set_default_validate_args(previous)
