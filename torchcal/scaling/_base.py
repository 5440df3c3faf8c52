"""Shared pieces of the post-hoc calibrators: the result type, warnings, state, inputs."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from torchcal.functional._checks import check_floating, check_tensor, values_checked

__all__ = [
    "FitResult",
    "NLLFit",
    "TemperatureFit",
    "GroupTemperatureFit",
    "VarianceFit",
    "QuantileFit",
    "CalibrationWarning",
    "NotFittedError",
]


class CalibrationWarning(UserWarning):
    """A fit met a degenerate set (no better than uniform, perfectly separated), hit a bound
    or stopped before its tolerance. The same text is in the result's ``warnings``."""


class NotFittedError(RuntimeError):
    """``forward`` was called on a calibrator that has not been fitted (or loaded)."""


@dataclass(frozen=True, kw_only=True)
class FitResult:
    """Base of every calibrator's result type: ``isinstance(result, FitResult)`` holds for all.

    Each kind of calibrator returns its own frozen dataclass with honest field names:
    :class:`TemperatureFit` (``TemperatureScaler``), :class:`GroupTemperatureFit`
    (``GroupTemperatureScaler``), :class:`NLLFit` (Platt, vector/matrix, isotonic: maps fitted
    to the NLL), :class:`VarianceFit` (``VarianceScaler``: a scale factor and the NLL or CRPS)
    and :class:`QuantileFit` (``QuantileRecalibrator``). All of them have ``iterations``,
    ``converged``, ``warnings`` (also issued as :class:`CalibrationWarning`), ``passes``
    (objective evaluations, each one pass over the data) and ``method`` (the optimiser).

    The attributes the single ``FitResult`` of earlier releases had (``temperature``,
    ``nll_before``, ``nll_after``, ``grad_norm``, ``temperatures``) still read on every
    result type with a :class:`FutureWarning` where the kind has no field of that name (e.g.
    ``VarianceFit.temperature`` is its ``scale``, ``NLLFit.temperature`` is ``None``); they
    go in the release after next.
    """

    # old name -> the field it reads (a str) or the constant it always held (None, 0.0)
    deprecated_aliases: ClassVar[dict[str, object]] = {}

    iterations: int
    converged: bool
    warnings: tuple[str, ...] = ()
    passes: int = 0
    method: str = ""

    def __getattr__(self, name: str) -> Any:  # only reached when normal lookup fails
        aliases = type(self).deprecated_aliases
        if name not in aliases:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        new = aliases[name]
        where = f"; read .{new}" if isinstance(new, str) else f"; it is always {new!r} here"
        warnings.warn(
            f"{type(self).__name__}.{name} is deprecated (FitResult is one type per kind of "
            f"calibrator now){where}",
            FutureWarning,
            stacklevel=2,
        )
        return getattr(self, new) if isinstance(new, str) else new


@dataclass(frozen=True, kw_only=True)
class NLLFit(FitResult):
    """What the fit of a map fitted to the NLL did (Platt, vector/matrix, isotonic).

    Attributes:
        nll_before: mean NLL (nats) of the fitting set before calibration (identity map).
        nll_after: mean NLL (nats) of the fitting set after calibration (the objective
            without regularisation).
        grad_norm: norm of the objective's gradient at the returned parameters (``0`` for
            the isotonic map, which has no gradient).
        iterations: optimiser iterations (Newton steps, LBFGS iterations; PAV rounds).
        converged: the tolerance was met at an interior point; ``False`` when the optimum
            lies beyond a bound (degenerate set) or the iteration cap stopped the fit.
        warnings, passes, method: see :class:`FitResult`.
    """

    deprecated_aliases: ClassVar[dict[str, object]] = {"temperature": None, "temperatures": None}

    nll_before: float
    nll_after: float
    grad_norm: float

    @classmethod
    def of(cls, sol: Any, method: str) -> NLLFit:
        """The result of a Newton fit's solution (``nll_before``, ``nll_after``, ``grad_norm``,
        ``iterations``, ``messages``, ``passes``): converged when it has no messages, which
        are issued as :class:`CalibrationWarning` at the caller of the scaler's ``fit``."""
        return cls(
            nll_before=sol.nll_before,
            nll_after=sol.nll_after,
            grad_norm=sol.grad_norm,
            iterations=sol.iterations,
            converged=not sol.messages,
            warnings=warn_all(sol.messages, stacklevel=4),
            passes=sol.passes,
            method=method,
        )


@dataclass(frozen=True, kw_only=True)
class TemperatureFit(NLLFit):
    """What :meth:`TemperatureScaler.fit <torchcal.scaling.TemperatureScaler.fit>` did: the
    fields of :class:`NLLFit` (``grad_norm`` is ``|d mean NLL / d log T|``; ``passes`` counts
    the warm start's passes over a 1/64 or 1/8 row subsample of a large in-memory fit) and
    ``temperature``, the fitted ``T``.

    Example:
        >>> import torch
        >>> from torchcal.scaling import TemperatureScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> logits = 3 * torch.randn(500, 4, generator=g)
        >>> target = torch.multinomial(torch.softmax(logits / 3, 1), 1, generator=g).squeeze(1)
        >>> res = TemperatureScaler().fit(logits, target)
        >>> res.converged, res.nll_after <= res.nll_before, round(res.temperature, 1)
        (True, True, 3.1)
    """

    deprecated_aliases: ClassVar[dict[str, object]] = {"temperatures": None}

    temperature: float


@dataclass(frozen=True, kw_only=True)
class GroupTemperatureFit(TemperatureFit):
    """What ``GroupTemperatureScaler.fit`` did: ``temperature`` is the global T,
    ``temperatures`` the per-group ones; the NLLs are over all groups."""

    deprecated_aliases: ClassVar[dict[str, object]] = {}

    temperatures: tuple[float, ...]


@dataclass(frozen=True, kw_only=True)
class VarianceFit(FitResult):
    """What ``VarianceScaler.fit`` did.

    Attributes:
        scale: the fitted factor ``s`` on the predicted scale.
        objective: ``"nll"`` (mean NLL, nats) or ``"crps"`` (mean CRPS): what ``before`` and
            ``after`` hold.
        before: the mean objective at ``s = 1``.
        after: the mean objective at the fitted ``s``.
        grad_norm: ``|d mean objective / d log s|`` at the fitted ``s``.
        iterations, converged, warnings, passes, method: see :class:`FitResult`.
    """

    deprecated_aliases: ClassVar[dict[str, object]] = {
        "temperature": "scale",
        "nll_before": "before",
        "nll_after": "after",
        "temperatures": None,
    }

    scale: float
    objective: str
    before: float
    after: float
    grad_norm: float


@dataclass(frozen=True, kw_only=True)
class QuantileFit(FitResult):
    """What ``QuantileRecalibrator.fit`` did (no likelihood: a PAV fit of the PIT's CDF).

    Attributes:
        gap_before: mean absolute gap between the sorted fitting PIT values and their
            nominal ranks ``k / (n + 1)``.
        gap_after: the same after the map ``R``.
        iterations: PAV rounds; ``converged`` is always ``True``.
        warnings, passes, method: see :class:`FitResult`.
    """

    deprecated_aliases: ClassVar[dict[str, object]] = {
        "temperature": None,
        "nll_before": "gap_before",
        "nll_after": "gap_after",
        "grad_norm": 0.0,
        "temperatures": None,
    }

    gap_before: float
    gap_after: float
    converged: bool = True


def warn_all(messages: Sequence[str], stacklevel: int = 3) -> tuple[str, ...]:
    """Issue each message as a :class:`CalibrationWarning`; return them as a tuple."""
    for msg in messages:
        warnings.warn(msg, CalibrationWarning, stacklevel=stacklevel)
    return tuple(messages)


class FittedMixin(nn.Module):
    """Holds the ``fitted`` flag as a (persistent) bool buffer, so that it round-trips through
    ``state_dict`` / ``load_state_dict`` and ``torch.load(weights_only=True)``.

    Fitted state is float64 and stays float64: ``.to(dtype)``, ``.half()``, ``.bfloat16()``,
    ``.float()`` and Lightning's true-precision plugins (``module.to(torch.bfloat16)`` of a
    module holding the calibrator) move it to the new device but keep its dtype, so a fitted
    ``T = 2.4776`` is not rounded to bfloat16's ``2.4750`` (``forward`` still returns the
    dtype of its input). Loaded state is validated before it is copied in
    (:meth:`_check_state`): a ``ValueError`` names the offending key.
    """

    fitted: Tensor

    def _init_fitted(self) -> None:
        self.register_buffer("fitted", torch.tensor(False))

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> FittedMixin:
        """Apply ``fn`` (device moves, dtype casts) but keep float64 tensors float64."""

        def keep_float64(t: Tensor) -> Tensor:
            out = fn(t)
            if t.dtype == torch.float64 and out.dtype != torch.float64:
                return t.to(device=out.device)
            return out

        return super()._apply(keep_float64, recurse)

    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        """Validate incoming state (``state`` maps this module's own names to the tensors to
        be loaded; absent keys are left to ``load_state_dict``'s own missing-key report);
        raise ``ValueError("<prefix><name>: ...")``. The base checks nothing."""

    def _load_from_state_dict(
        self, state_dict: Mapping[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        own = {
            k[len(prefix) :]: v.detach()
            for k, v in state_dict.items()
            if k.startswith(prefix) and "." not in k[len(prefix) :] and isinstance(v, Tensor)
        }
        self._check_state(own, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)  # type: ignore[arg-type]

    @property
    def is_fitted(self) -> bool:
        """Whether ``fit`` ran (or fitted state was loaded or set by hand)."""
        return bool(self.fitted)

    def _mark_fitted(self) -> None:
        self._store("fitted", True)

    def _store(self, name: str, value: Tensor | float) -> None:
        """Write a fitted value in place into the parameter or buffer ``name``, also when the
        module was built, or is fitted, inside ``torch.inference_mode()`` (an inference tensor
        may only be written in inference mode, a normal one anywhere)."""
        t = getattr(self, name)
        with torch.inference_mode(t.is_inference()), torch.no_grad():
            if isinstance(value, Tensor):
                t.copy_(value)
            else:
                t.fill_(value)

    def _check_fitted(self) -> None:
        if not bool(self.fitted):
            raise NotFittedError(
                f"{type(self).__name__}: not fitted; call fit(...) first (or "
                f"load_state_dict a fitted state)"
            )


def working_dtype(x: Tensor) -> torch.dtype:
    """The dtype a calibrator's forward computes in: float64 for float16/bfloat16 (their
    range is too narrow for ``z / T`` with ``T < 1``: float16 overflows at 65504, bfloat16
    at float32's maximum), else the input's."""
    return torch.float64 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def logits_as(out: Tensor, dtype: torch.dtype, class_dim: int | None) -> Tensor:
    """Calibrated logits ``out`` (computed in :func:`working_dtype`) rounded to ``dtype``
    without overflowing: a row (along ``class_dim``) whose maximum does not fit in ``dtype``
    is shifted so that its maximum is 0 (the softmax is unchanged; entries that then fall
    below the dtype's range are ``-inf``, probability 0 as before); binary logits
    (``class_dim=None``) are clamped to the dtype's finite range, where the sigmoid is
    already saturated (0 or 1 in any float). In range, ``out.to(dtype)`` unchanged."""
    if out.dtype == dtype:
        return out
    fmax = torch.finfo(dtype).max
    if class_dim is None:
        return out.clamp(-fmax, fmax).to(dtype)
    top = out.amax(dim=class_dim, keepdim=True)
    shift = torch.where(torch.isfinite(top) & (top.abs() > fmax), top, 0.0)
    return (out - shift).to(dtype)


def check_state_finite(state: Mapping[str, Tensor], prefix: str, *names: str) -> None:
    """Loaded float state must be finite (NaN/Inf would make every output NaN/Inf)."""
    for name in names:
        value = state.get(name)
        if (
            value is not None
            and value.is_floating_point()
            and not bool(torch.isfinite(value).all())
        ):
            raise ValueError(
                f"{prefix}{name}: expected finite values in the loaded state, got "
                f"{value.flatten()[:8].tolist()}"
            )


def as_binary_vector(logits: object, target: object = None) -> tuple[Any, Any, bool]:
    """``(B, 1)`` binary logits (and a ``(B,)`` or ``(B, 1)`` target) as ``(B,)`` views.

    Returns ``(logits, target, squeezed)``; anything else is returned unchanged (and checked
    later by :func:`check_logits_target`).
    """
    if isinstance(logits, Tensor) and logits.dim() == 2 and logits.shape[1] == 1:
        if isinstance(target, Tensor) and target.shape == logits.shape:
            target = target.reshape(-1)
        return logits.reshape(-1), target, True
    return logits, target, False


def warn_if_probabilities(logits: Tensor) -> None:
    """A :class:`CalibrationWarning` when ``logits`` look like probabilities: every value in
    ``[0, 1]`` and (multiclass) every row summing to 1 within ``1e-4`` -- a calibrator fitted
    on them maps probabilities, not logits (pass ``torch.log(probs)`` instead). Value check:
    off inside ``validation_enabled(False)``."""
    if not values_checked() or logits.numel() < 2:
        return
    lo, hi = torch.aminmax(logits.detach())
    if not (float(lo) >= 0.0 and float(hi) <= 1.0):
        return
    if logits.dim() == 2 and not bool(
        ((logits.detach().sum(1, dtype=torch.float64) - 1).abs() <= 1e-4).all()
    ):
        return
    what = (
        "every row is in [0, 1] and sums to 1" if logits.dim() == 2 else "every value is in [0, 1]"
    )
    warnings.warn(
        f"logits: {what}: these look like probabilities, not logits; the calibrator "
        f"maps its input as logits (pass torch.log(probs), or torch.logit(p) for "
        f"binary probabilities)",
        CalibrationWarning,
        stacklevel=3,
    )


def check_logits_target(
    logits: object,
    target: object,
    *,
    binary_only: bool = False,
    multiclass_only: bool = False,
    allow_neg_inf: bool = True,
) -> bool:
    """Shape/dtype checks shared by the calibrators; returns ``True`` for binary input.

    Binary: logits ``(N,)`` and target ``(N,)`` in {0, 1} (``(N, 1)`` logits are squeezed by
    :func:`as_binary_vector` before this check). Multiclass: logits ``(N, C)``,
    ``C >= 2``, and integer target ``(N,)``. Values (NaN, ranges) are checked in the passes.
    """
    logits = check_tensor("logits", logits)
    target = check_tensor("target", target)
    check_floating("logits", logits)
    if (
        logits.dim() not in (1, 2)
        or (binary_only and logits.dim() != 1)
        or (multiclass_only and logits.dim() != 2)
    ):
        want = (
            "(N,) binary logits"
            if binary_only
            else "(N, C) multiclass logits"
            if multiclass_only
            else "(N,) binary or (N, C) multiclass logits"
        )
        raise ValueError(f"logits: expected {want}, got shape {tuple(logits.shape)}")
    if logits.shape[0] == 0 or logits.numel() == 0:
        raise ValueError(f"logits: expected a non-empty tensor, got shape {tuple(logits.shape)}")
    if target.shape != logits.shape[:1]:
        raise ValueError(
            f"target: expected shape {tuple(logits.shape[:1])} (one label per "
            f"row of logits {tuple(logits.shape)}), got {tuple(target.shape)}"
        )
    if target.is_complex():
        raise ValueError(f"target: expected real labels, got dtype {target.dtype}")
    if logits.dim() == 2:
        if logits.shape[1] < 2:
            raise ValueError(
                f"logits: expected at least 2 classes (columns), got shape "
                f"{tuple(logits.shape)}; pass binary logits as shape (N,) or (N, 1)"
            )
        if target.is_floating_point() or target.dtype == torch.bool:
            raise ValueError(
                f"target: expected integer class indices (torch.long), got dtype {target.dtype}"
            )
    if not allow_neg_inf and bool(torch.isneginf(logits).any()):
        raise ValueError("logits: -inf masks are not supported by this calibrator")
    return logits.dim() == 1


def _model_device(model: nn.Module) -> torch.device:
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


_INPUT_KEYS = ("input", "inputs", "x", "features", "image", "images")
_TARGET_KEYS = ("target", "targets", "y", "label", "labels")


def _split_batch(
    batch: object, input_key: str | None, target_key: str | None
) -> tuple[object, Tensor]:
    if isinstance(batch, Mapping):
        ik = input_key or next((k for k in _INPUT_KEYS if k in batch), None)
        tk = target_key or next((k for k in _TARGET_KEYS if k in batch), None)
        if ik is None or tk is None or ik not in batch or tk not in batch:
            raise ValueError(
                f"dataloader: a dict batch needs input and target keys (pass "
                f"input_key= and target_key=), got keys {sorted(batch)}"
            )
        return batch[ik], batch[tk]
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    raise ValueError(
        f"dataloader: expected (input, target) tuples or dicts, got {type(batch).__name__}"
    )


def _to(x: object, device: torch.device) -> object:
    if isinstance(x, Tensor):
        return x.to(device, non_blocking=True)
    if isinstance(x, Mapping):
        return {k: _to(v, device) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_to(v, device) for v in x)
    return x


def collect_logits(
    model: nn.Module,
    dataloader: Iterable,
    *,
    cache_dtype: torch.dtype | None = None,
    input_key: str | None = None,
    target_key: str | None = None,
) -> tuple[Tensor, Tensor]:
    """Run ``model`` once over ``dataloader`` in ``eval()`` mode without gradients.

    Batches are ``(input, target)`` tuples/lists or dicts (keys ``input_key``/``target_key``,
    or the usual names). Inputs go to the model's device; logits stay there. The model's
    training mode is restored afterwards. ``cache_dtype=torch.float16`` halves the cache and
    raises if a logit overflows it.
    """
    device = _model_device(model)
    was_training = model.training
    logits_parts: list[Tensor] = []
    target_parts: list[Tensor] = []
    model.eval()
    try:
        with torch.no_grad():
            for batch in dataloader:
                x, y = _split_batch(batch, input_key, target_key)
                out = model(_to(x, device))
                if not isinstance(out, Tensor):
                    raise ValueError(
                        f"model: expected a logits tensor as output, got {type(out).__name__}"
                    )
                out = out.detach()
                if cache_dtype is not None:
                    cached = out.to(cache_dtype)
                    if bool((torch.isinf(cached) & torch.isfinite(out)).any()):
                        raise ValueError(
                            f"cache_dtype: logits overflow {cache_dtype}; use a "
                            f"wider cache_dtype or None"
                        )
                    out = cached
                logits_parts.append(out)
                target_parts.append(torch.as_tensor(y).to(out.device))
    finally:
        model.train(was_training)
    if not logits_parts:
        raise ValueError("dataloader: expected at least one batch, got none")
    return torch.cat(logits_parts), torch.cat(target_parts)
