"""The one-reduction fast path of ``check_finite`` decides exactly as the element-wise scan."""

import pytest
import torch

from torchcal.functional._checks import check_finite

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("allow_neg_inf", [False, True])
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_fast_path_agrees_with_the_scan(bad, allow_neg_inf, dtype):
    x = torch.randn(1000, dtype=dtype)
    x[617] = bad
    if allow_neg_inf and bad == -INF:
        check_finite("x", x, allow_neg_inf=True)  # a mask, allowed
        return
    with pytest.raises(ValueError, match="^x: expected finite values, found .* at position 617"):
        check_finite("x", x, allow_neg_inf=allow_neg_inf)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_a_sum_that_overflows_is_no_error_but_a_nan_beside_it_is(dtype):
    big = torch.finfo(dtype).max
    x = torch.tensor([big, big, big], dtype=dtype)  # every value finite, the sum is +inf
    check_finite("x", x)
    x = torch.tensor([big, -big, NAN], dtype=dtype)
    with pytest.raises(ValueError, match="position 2"):
        check_finite("x", x)
    y = torch.tensor([-INF, -INF], dtype=dtype)  # all masked: allowed only as masks
    check_finite("y", y, allow_neg_inf=True)
    with pytest.raises(ValueError, match="position 0"):
        check_finite("y", y)
    check_finite("e", torch.empty(0, dtype=dtype))
    check_finite("e", torch.empty(0, dtype=dtype), allow_neg_inf=True)
