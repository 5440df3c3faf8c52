"""The generic argument checks of torchcal (Python types, tensor types and shapes, value
ranges), the switch of the value checks (:func:`validation_enabled`) and :func:`reduce`.

Value checks never synchronise the device (docs/design.md section 3): each reduces its
tensor to one 0-d bool on the tensor's device (:func:`finite_ok`, :func:`range_ok`,
:func:`labels_ok`) and hands it to :func:`check_values`, which on CPU in eager mode reads it
(and, when it is False, runs the caller's slow scan that names the position and raises the
``ValueError``), and elsewhere (a CUDA tensor, ``torch.compile`` tracing, or
:func:`force_sync_free` in tests: :func:`sync_free`) asserts it on the device with
``torch._assert_async``, as ``F.cross_entropy`` asserts its labels.

Re-exported, with the option checks of the losses, forecasts, readings and scaling, by
:mod:`torchcal.functional._validation`, the module every entry point imports them from (its
docstring states the message convention).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from numbers import Real
from typing import TypeVar

import torch
from torch import Tensor

__all__ = [
    "validation_enabled",
]

REDUCTIONS = ("mean", "sum", "none")
HALF_DTYPES = (torch.float16, torch.bfloat16)

_VALUE_CHECKS = True
_FORCE_SYNC_FREE = False
_is_compiling = torch.compiler.is_compiling


_T = TypeVar("_T")


@contextlib.contextmanager
def validation_enabled(enabled: bool = True) -> Iterator[None]:
    """Turn the value checks (NaN/Inf, ranges) on or off inside a ``with`` block.

    Example:
        >>> import torch
        >>> from torchcal.functional import log_score, validation_enabled
        >>> with validation_enabled(False):
        ...     loss = log_score(torch.zeros(4, 3), torch.tensor([0, 1, 2, 0]))
    """
    global _VALUE_CHECKS
    previous = _VALUE_CHECKS
    _VALUE_CHECKS = bool(enabled)
    try:
        yield
    finally:
        _VALUE_CHECKS = previous


def values_checked() -> bool:
    """Whether value checks (NaN/Inf, ranges) are currently on."""
    return _VALUE_CHECKS


def sync_free(x: Tensor | None = None) -> bool:
    """Whether a value check must not read its result on the host: ``x`` lives on a device
    other than the CPU, ``torch.compile`` is tracing, or :func:`force_sync_free` is active."""
    if x is not None and not x.is_cpu:
        return True
    return _FORCE_SYNC_FREE or _is_compiling()


@contextlib.contextmanager
def force_sync_free(enabled: bool = True) -> Iterator[None]:
    """Make CPU tensors take the device (sync-free) path of the value checks inside a ``with``
    block: the tests use it to prove that no host synchronisation happens on that path."""
    global _FORCE_SYNC_FREE
    previous = _FORCE_SYNC_FREE
    _FORCE_SYNC_FREE = bool(enabled)
    try:
        yield
    finally:
        _FORCE_SYNC_FREE = previous


def check_values(ok: Tensor, message: str, on_fail: Callable[[], object] | None = None) -> None:
    """The one value check: ``ok`` is a 0-d bool tensor (one fused reduction of the caller).

    Validation off: nothing. Sync-free (:func:`sync_free`): ``torch._assert_async(ok,
    message)``, a device-side assertion (no host round trip; also inside ``torch.compile``
    graphs). CPU eager: when ``ok`` is False, ``on_fail()`` runs the slow scan that names the
    offending position and raises (it may return where the fast test was only conservative);
    without ``on_fail``, ``ValueError(message)``.
    """
    if not _VALUE_CHECKS:
        return
    if sync_free(ok):
        torch._assert_async(ok, message)
        return
    if not bool(ok):
        if on_fail is None:
            raise ValueError(message)
        on_fail()


def finite_ok(x: Tensor) -> Tensor:
    """0-d bool: every value of the floating ``x`` is finite (exact, one reduction: a float32 or
    half sum taken in float64 cannot overflow; float64 values are multiplied by 0 first)."""
    if x.dtype == torch.float64:
        return (x * 0.0).sum() == 0.0  # 0 * finite = 0, 0 * +-inf = NaN
    return torch.isfinite(x.sum(dtype=torch.float64))


def range_ok(x: Tensor, low: float, high: float, *, strict_low: bool = False) -> Tensor:
    """0-d bool: every value of the non-empty ``x`` lies in ``[low, high]`` (``(low, high]`` with
    ``strict_low``; NaN never does), from one ``aminmax``."""
    lo, hi = torch.aminmax(x.detach())
    return ((lo > low) if strict_low else (lo >= low)) & (hi <= high)


def labels_ok(target: Tensor, num_classes: int, ignore_index: int | None = None) -> Tensor:
    """0-d bool: every integer label lies in ``[0, num_classes - 1]`` or equals
    ``ignore_index``; one ``aminmax`` without ``ignore_index``, else an element-wise test."""
    if ignore_index is None:
        lo, hi = torch.aminmax(target)
        return (lo >= 0) & (hi < num_classes)
    good = ((target >= 0) & (target < num_classes)) | (target == ignore_index)
    return good.all()


def host_range(x: Tensor) -> tuple[float, float]:
    """``(min, max)`` of the non-empty ``x`` read on the host (NaN propagates): the CPU path
    of the range checks, one ``aminmax`` and two reads (cheaper than comparing on tensors)."""
    lo, hi = torch.aminmax(x.detach())
    return lo.item(), hi.item()


def first_bad_position(bad: Tensor) -> str:
    """Human-readable index of the first ``True`` in a boolean tensor (e.g. ``(3, 1)``)."""
    flat = int(torch.nonzero(bad.reshape(-1), as_tuple=False)[0, 0])
    if bad.dim() <= 1:
        return str(flat)
    idx = []
    for size in reversed(bad.shape):
        idx.append(flat % size)
        flat //= size
    return "(" + ", ".join(str(i) for i in reversed(idx)) + ")"


def first_bad_value(x: Tensor, bad: Tensor) -> Tensor:
    """The element of ``x`` at the first ``True`` of ``bad`` (same shape), as a 0-d tensor."""
    return x.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0, 0])]


def check_option(name: str, value: _T, choices: Sequence[object]) -> _T:
    """``value`` must be one of ``choices``; returned unchanged."""
    if value not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)!r}, got {value!r}")
    return value


def check_reduction(reduction: str) -> str:
    """``reduction`` must be 'mean', 'sum' or 'none'; returned unchanged."""
    if reduction in REDUCTIONS:  # the hot path: one test (every loss call makes it)
        return reduction
    return check_option("reduction", reduction, REDUCTIONS)


def check_tensor(name: str, x: object) -> Tensor:
    """``x`` must be a ``torch.Tensor``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def check_floating(name: str, x: Tensor) -> None:
    """``x`` must have a floating dtype."""
    check_tensor(name, x)
    if not x.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")


def check_nonempty(name: str, x: Tensor) -> None:
    """``x`` must hold at least one element."""
    check_tensor(name, x)
    if x.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(x.shape)}")


def check_finite(name: str, x: Tensor, *, allow_neg_inf: bool = False) -> None:
    """``x`` must hold no NaN and no +-Inf (``-inf`` allowed as a mask if asked)."""
    if not _VALUE_CHECKS or not x.is_floating_point() or not x.numel():
        return
    what = "NaN or +Inf" if allow_neg_inf else "NaN or Inf"
    if not sync_free(x):  # CPU eager: one reduction, one host read; the scan only on failure
        if allow_neg_inf:
            passed = x.detach().amax().item() < math.inf  # amax propagates NaN
        else:  # a sum of finite values that overflows only sends the call to the scan (a
            # float32 sum: a float64 one converts first, about 7x slower on CPU)
            passed = math.isfinite(x.detach().sum().item())
        if not passed:
            _finite_scan(name, x, allow_neg_inf, what)
        return
    ok = x.detach().amax() < float("inf") if allow_neg_inf else finite_ok(x.detach())
    check_values(ok, f"{name}: expected finite values, found {what}")


def _finite_scan(name: str, x: Tensor, allow_neg_inf: bool, what: str) -> None:
    """Slow path of :func:`check_finite` (CPU, after a failed reduction): name the position."""
    bad = (torch.isnan(x) | (x == float("inf"))) if allow_neg_inf else ~torch.isfinite(x)
    if bool(bad.any()):
        raise ValueError(
            f"{name}: expected finite values, found {what} at position {first_bad_position(bad)}"
        )


def check_same_shape(name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    """``a`` and ``b`` must have exactly the same shape."""
    if a.shape != b.shape:
        raise ValueError(
            f"{name_b}: expected the shape of {name_a} {tuple(a.shape)}, got {tuple(b.shape)}"
        )


def check_probabilities(name: str, x: Tensor) -> None:
    """``x`` must be finite and in [0, 1]."""
    check_floating(name, x)
    if not _VALUE_CHECKS or not x.numel():
        return

    def scan() -> None:
        bad = ~((x >= 0) & (x <= 1))  # NaN fails both comparisons
        if bool(bad.any()):
            pos = first_bad_position(bad)
            val = first_bad_value(x, bad).item()
            raise ValueError(
                f"{name}: expected probabilities in [0, 1], got {val!r} at position {pos}"
            )

    if not sync_free(x):
        lo, hi = host_range(x)
        if not (lo >= 0 and hi <= 1):  # NaN fails both
            scan()
        return
    check_values(range_ok(x, 0.0, 1.0), f"{name}: expected probabilities in [0, 1]")


def check_positive(name: str, x: Tensor, *, strict: bool = True) -> None:
    """``x`` must be finite and > 0 (or >= 0 with ``strict=False``)."""
    if not _VALUE_CHECKS or not x.numel():
        return
    rel = "> 0" if strict else ">= 0"

    def scan() -> None:
        check_finite(name, x)
        bad = x <= 0 if strict else x < 0
        if bool(bad.any()):
            pos = first_bad_position(bad)
            val = first_bad_value(x, bad).item()
            raise ValueError(f"{name}: expected values {rel}, got {val!r} at position {pos}")

    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    # one reduction decides (a NaN fails both comparisons); the scans only on failure
    if not sync_free(x):
        lo, hi = host_range(x)
        if not ((lo > 0 if strict else lo >= 0) and hi < math.inf):
            scan()
        return
    least, most = torch.aminmax(x.detach())
    ok = ((least > 0) if strict else (least >= 0)) & (most < float("inf"))
    check_values(ok, f"{name}: expected finite values {rel}")


def check_binary_target(name: str, target: Tensor, *, ignore_index: int | None = None) -> None:
    """``target`` must hold only 0 and 1 (and ``ignore_index`` where given)."""
    check_tensor(name, target)
    if not _VALUE_CHECKS or not target.numel():
        return
    if target.dtype == torch.bool:
        return
    bad = (target != 0) & (target != 1)
    if ignore_index is not None:
        bad &= target != ignore_index

    def scan() -> None:
        pos = first_bad_position(bad)
        val = first_bad_value(target, bad).item()
        raise ValueError(
            f"{name}: expected binary labels in {{0, 1}}, got {val!r} at position {pos}"
        )

    check_values(~bad.any(), f"{name}: expected binary labels in {{0, 1}}", scan)


def check_class_target(
    name: str, target: Tensor, num_classes: int, *, ignore_index: int | None = None
) -> None:
    """``target`` must be an integer tensor of class indices in ``[0, num_classes - 1]``."""
    check_tensor(name, target)
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise ValueError(
            f"{name}: expected integer class indices (torch.long), got dtype "
            f"{target.dtype}; for binary targets pass logits of the target's shape"
        )
    if not _VALUE_CHECKS or not target.numel():
        return

    def scan() -> None:
        bad = (target < 0) | (target >= num_classes)
        if ignore_index is not None:
            bad &= target != ignore_index
        if bool(bad.any()):
            pos = first_bad_position(bad)
            val = int(first_bad_value(target, bad))
            raise ValueError(
                f"{name}: expected class indices in [0, {num_classes - 1}], got {val} at "
                f"position {pos}"
            )

    # CPU: one aminmax first (the element-wise scan decides only when it fails, e.g. an
    # ignored item); sync-free: the exact test, since nothing can be decided afterwards
    if not sync_free(target):
        lo, hi = host_range(target)
        if not (lo >= 0 and hi < num_classes):
            scan()
        return
    check_values(
        labels_ok(target, num_classes, ignore_index),
        f"{name}: expected class indices in [0, {num_classes - 1}]",
    )


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """``value`` must be a Python int (not a bool), ``>= minimum`` where given."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def check_bool(name: str, value: object) -> bool:
    """``value`` must be a Python bool (a flag such as ``multilabel`` or ``squared``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return value


def check_number(
    name: str,
    value: object,
    *,
    minimum: float = 0.0,
    strict: bool = False,
    expected: str = "a number",
) -> float:
    """``value`` must be a finite Python number (not a bool) ``>= minimum`` (``> minimum``
    with ``strict=True``); returned as a float. ``expected`` names the accepted types in
    the ``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected {expected}, got {type(value).__name__}")
    if not (math.isfinite(value) and (value > minimum if strict else value >= minimum)):
        rel = ">" if strict else ">="
        raise ValueError(f"{name}: expected a finite number {rel} {minimum:g}, got {value!r}")
    return float(value)


def check_open_unit(name: str, value: float | Tensor) -> None:
    """``value`` (number or tensor) must lie strictly inside (0, 1)."""
    if isinstance(value, Tensor):
        if not _VALUE_CHECKS or not value.numel():
            return
        lo, hi = torch.aminmax(value.detach())

        def scan() -> None:
            bad = ~((value > 0) & (value < 1))
            raise ValueError(
                f"{name}: expected values in the open interval (0, 1), bad value at position "
                f"{first_bad_position(bad)}"
            )

        check_values((lo > 0) & (hi < 1), f"{name}: expected values in (0, 1)", scan)
        return
    if isinstance(value, bool) or not isinstance(value, Real):  # "0.5", True: not levels
        raise TypeError(f"{name}: expected a number in (0, 1), got {type(value).__name__}")
    if not (0.0 < float(value) < 1.0):
        raise ValueError(f"{name}: expected a value in the open interval (0, 1), got {value!r}")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a score is computed (and returned) in: float16/bfloat16 -> float32."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


#: at::internal::GRAIN_SIZE: a CPU reduction of at most this many values runs on one thread
PARALLEL_GRAIN = 32768


def fixed_sum(x: Tensor) -> Tensor:
    """``x.sum()`` whose last bit does not depend on the thread count (docs/design.md section
    3, Determinism). torch splits a CPU reduction with several outputs between threads by
    output only (each output is one thread's cascade sum), and one of at most
    :data:`PARALLEL_GRAIN` values runs on one thread; only a larger full reduction is split
    by position. So a larger sum is taken in two such steps: over the trailing dims first
    (a tensor of two or more rows: native ops, whose backward is an expand, no copy;
    :func:`_row_dims`), or, for one long row, over fixed blocks of a flat view
    (:class:`_BlockSum`). float16/bfloat16 accumulate in float32 and round once. Smaller
    sums and other devices (their reductions do not depend on the host's threads) are
    ``x.sum()``."""
    n = x.numel()
    if n <= PARALLEL_GRAIN or not x.is_cpu or not x.is_floating_point():
        return x.sum()
    rows = _row_dims(x.shape)
    if rows:
        acc = torch.float32 if x.dtype in HALF_DTYPES else None
        total = fixed_sum(x.sum(dim=rows, dtype=acc))
        return total if acc is None else total.to(x.dtype)
    return _BlockSum.apply(x)


def fixed_mean(x: Tensor) -> Tensor:
    """``x.mean()`` whose last bit does not depend on the thread count, as :func:`fixed_sum`:
    the mean of the row means (rows of one length, so that is the mean), or one long row's
    :func:`fixed_sum` divided by its length (float16/bfloat16: in float32, rounded once, so
    a mean does not overflow where the sum would)."""
    n = x.numel()
    if n <= PARALLEL_GRAIN or not x.is_cpu or not x.is_floating_point():
        return x.mean()
    acc = torch.float32 if x.dtype in HALF_DTYPES else None
    rows = _row_dims(x.shape)
    if rows:
        total = fixed_mean(x.mean(dim=rows, dtype=acc))
    elif acc is None:
        return _BlockSum.apply(x) / n
    else:  # a float16 sum of many values overflows where their mean does not
        total = _BlockSum.apply(x.to(acc)) / n
    return total if acc is None else total.to(x.dtype)


def _row_dims(shape: torch.Size) -> tuple[int, ...]:
    """The trailing dims of a first reduction step of :func:`fixed_sum` / :func:`fixed_mean`:
    all but the fewest leading dims that hold two or more rows (so the step has several
    outputs, each one thread's), e.g. ``(1,)`` for ``(B, C)`` and ``(1, 2)`` for ``(B, C,
    Q)``; ``()`` (one long row: fixed blocks instead) where no leading dims do, or where the
    rows would be shorter than 16 values."""
    lead = 1
    for k in range(len(shape) - 1):
        lead *= shape[k]
        if lead >= 2:
            if math.prod(shape[k + 1 :]) < 16:
                return ()
            return tuple(range(k + 1, len(shape)))
    return ()


class _BlockSum(torch.autograd.Function):
    """:func:`fixed_sum` of one long row: the sum of fixed blocks of at most
    :data:`PARALLEL_GRAIN` values of its flat view (each block one output, so one thread's),
    then of the block sums; the backward is ``sum``'s (an expand: a reshape of the expanded
    gradient would copy it)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        ctx.shape = x.shape
        acc = torch.float32 if x.dtype in HALF_DTYPES else None
        flat = x.reshape(-1)
        n = flat.numel()
        width = _block_width(n)
        if width:
            parts = flat.view(n // width, width).sum(dim=1, dtype=acc)
        else:  # no divisor of n fits a block: whole blocks, then the rest as one more block
            head = n - n % PARALLEL_GRAIN
            parts = torch.cat(
                (
                    flat[:head].view(-1, PARALLEL_GRAIN).sum(dim=1, dtype=acc),
                    flat[head:].sum(dtype=acc).reshape(1),
                )
            )
        return fixed_sum(parts).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        return grad.expand(ctx.shape)


@functools.lru_cache(maxsize=1024)
def _block_width(n: int) -> int:
    """The widest block ``n // r`` (``r`` dividing ``n``, at most a few more blocks than
    needed) of at most :data:`PARALLEL_GRAIN` values; 0 where there is none (e.g. ``n``
    prime)."""
    first = -(-n // PARALLEL_GRAIN)
    for r in range(first, 2 * first + 64):
        if n % r == 0:
            return n // r
    return 0


def reduce(loss: Tensor, reduction: str, weight: Tensor | None = None) -> Tensor:
    """Reduce per-item ``loss`` like ``F.cross_entropy``.

    ``weight`` (same shape as ``loss``, zero for ignored items) makes 'mean' the
    weighted mean ``sum(w * l) / sum(w)`` and 'sum' the weighted sum; 'none'
    returns ``w * l``. The sums are :func:`fixed_sum` (independent of the thread count).
    """
    if weight is None:  # the hot path first: an unweighted mean
        if reduction == "mean":
            return fixed_mean(loss)
    else:
        loss = loss * weight
        if reduction == "mean":
            return fixed_sum(loss) / fixed_sum(weight)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return fixed_sum(loss)
    check_reduction(reduction)
    raise AssertionError("unreachable")
