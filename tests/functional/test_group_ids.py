"""The one group check (``check_group_ids``): its name, its hint, and ``always``."""

import pytest
import torch

from torchcal.functional._checks import validation_enabled
from torchcal.functional._validation import check_group_ids
from torchcal.scaling import GroupTemperatureScaler


def test_names_the_argument_and_ends_with_the_hint() -> None:
    with pytest.raises(
        ValueError, match=r"^group: expected group ids in \[0, 1\], got 2 at .* \(X\)$"
    ):
        check_group_ids(torch.tensor([0, 2]), (2,), 2, name="group", hint=" (X)")
    with pytest.raises(ValueError, match=r"^g: expected one group id per sample, shape \(3,\)"):
        check_group_ids(torch.tensor([0, 1]), (3,), 2, name="g")
    with pytest.raises(ValueError, match=r"^groups: expected integer group ids"):
        check_group_ids(torch.tensor([0.0, 1.0]), (2,), 2)
    assert check_group_ids(torch.tensor([0, 3]), (2,), None) == 4


def test_the_range_is_a_value_check_unless_always() -> None:
    bad = torch.tensor([0, 5])
    with validation_enabled(False):
        assert check_group_ids(bad, (2,), 2) == 2  # switched off, as every value check
        with pytest.raises(ValueError, match=r"got 5 at position"):
            check_group_ids(bad, (2,), 2, always=True)


def test_a_scaler_checks_its_group_index_even_with_validation_off() -> None:
    logits = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    target = torch.arange(40) % 3
    groups = torch.arange(40) % 2
    scaler = GroupTemperatureScaler(num_groups=2)
    scaler.fit(logits, target, groups)
    with validation_enabled(False), pytest.raises(ValueError, match=r"^groups: expected group ids"):
        scaler(logits, groups + 1)
