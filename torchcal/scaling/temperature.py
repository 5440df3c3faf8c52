"""Temperature scaling (Guo et al., 2017), fitted to the NLL optimum."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from torchcal.functional._checks import check_finite, check_int
from torchcal.functional._validation import check_finite_value, check_temperature_bounds
from torchcal.functional.temperature.chunks import Chunk, tensor_chunks
from torchcal.functional.temperature.distributed import check_distributed, distributed_active
from torchcal.functional.temperature.fit import (
    TemperatureSolution,
    fit_temperature,
    solve_temperature,
)
from torchcal.scaling._base import (
    FittedMixin,
    TemperatureFit,
    as_binary_vector,
    check_logits_target,
    check_state_finite,
    collect_logits,
    logits_as,
    warn_all,
    warn_if_probabilities,
    working_dtype,
)

__all__ = ["TemperatureScaler"]


class TemperatureScaler(FittedMixin):
    r"""Temperature scaling: ``forward(logits) = logits / T`` with one ``T > 0``.

    Fit on held-out logits by minimising the NLL (Guo et al., 2017, "On Calibration of Modern
    Neural Networks", ICML). Binary logits ``(N,)`` with targets in {0, 1} use
    ``sigmoid(z / T)``; multiclass logits ``(N, C)`` with class indices use
    ``softmax(z / T)``. ``-inf`` logits are masks (probability 0): allowed anywhere except at
    the target class (multiclass) or with target 1 (binary).

    The NLL is convex in ``beta = 1/T``. Two solvers minimise the same float64 objective to
    the same tolerances and return the same optimum (tested against Brent's method):

    - ``method="lbfgs"`` (**the default of** :meth:`fit` / :meth:`fit_model`):
      ``torch.optim.LBFGS`` with strong-Wolfe line search on ``log T``, in float64, stopped
      by the gradient tolerance (no loss-change test, no small iteration cap).
    - ``method="newton"`` (**the default of** :meth:`fit_stream`, and an option everywhere): a
      safeguarded 1-D Newton iteration on ``log beta = -log T`` with the exact curvature
      ``Var_p[z]``, computed in the same float64 pass as the loss and the gradient, kept inside
      a bracket of the optimum. Its statistics are sums, so it streams (:meth:`fit_stream`,
      DDP), and it needs fewer passes over the data (4-10 against LBFGS's 6-15 on the tested
      sets).

    Both stop when ``|d NLL / d log T| <= grad_tol`` or the Newton step on ``log T`` (from the
    exact curvature) is below ``step_tol``, at the point they return. Large inputs are
    processed in chunks (float64 per chunk, ~256 KB), so the extra memory is O(chunk), not
    O(N x C); on CPU the chunks run on ``torch.get_num_threads()`` threads and their sums are
    added in chunk order, so the fitted T is bit-identical for any thread count.

    Degenerate sets: when the NLL keeps falling as ``T -> inf`` (logits no better than
    uniform) or ``T -> 0`` (perfectly separated), ``T`` stops at ``bounds`` with a
    :class:`~torchcal.scaling.CalibrationWarning` and ``converged=False``; when it does not
    depend on ``T`` at all (every row's logits equal), ``T`` stays at 1, with the same. A
    perfectly separated set (every target is a row maximum -- binary: no score on the wrong
    side of 0) is detected exactly from the data, not from the gradient (which underflows
    below any tolerance long before ``T`` reaches 0), and gets ``T = t_min``.

    Invariance (tested): multiclass -- every argmax (top-1 prediction, accuracy) is kept;
    binary -- the ranking of the scores, hence the AUC and the decision at logit 0, is kept.
    The NLL on the fitting set never increases (T = 1 is feasible). ``forward`` divides in the
    logits' dtype, and rounding is monotone: no pair is ever inverted and every original
    top-1 stays a top-1, but in float16/bfloat16 two adjacent values can round to a tie, after
    which ``argmax`` (first index) may pick the other one (about 2e-4 / 3e-3 of the rows of
    random 100-class logits; none in float32). Where exact ties matter, scale in float32.

    ``forward`` before ``fit`` raises :class:`~torchcal.scaling.NotFittedError` (setting
    :attr:`temperature` by hand or loading a fitted state counts as fitted).

    State: ``log_temperature`` (float64 parameter) and ``fitted`` (bool buffer); both
    round-trip through ``state_dict`` / ``torch.load(weights_only=True)``, stay float64 under
    ``.to(dtype)`` / ``.half()`` / ``.bfloat16()``, and are validated on load (a finite
    ``log_temperature`` with ``0 < T < inf``). Binary logits may be ``(N,)`` or ``(N, 1)``.

    Args:
        bounds: ``(t_min, t_max)``; the fitted T is kept inside.
        method: ``None`` (default: ``"lbfgs"`` in memory, ``"newton"`` when streaming),
            ``"lbfgs"`` or ``"newton"`` (see above).
        grad_tol: stop when ``|d NLL / d log T| <= grad_tol`` (mean NLL, nats).
        step_tol: or when the Newton step on ``log T`` is below ``step_tol``.
        max_iter: iteration cap (reached only on pathological input; reported as
            ``converged=False`` with a warning).

    Example:
        >>> import torch
        >>> from torchcal.scaling import TemperatureScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> logits = 4 * torch.randn(2000, 10, generator=g)    # over-confident model
        >>> target = torch.multinomial(torch.softmax(logits / 4, 1), 1, generator=g).squeeze(1)
        >>> scaler = TemperatureScaler()
        >>> result = scaler.fit(logits, target)
        >>> abs(result.temperature - 4) < 0.3, result.converged
        (True, True)
        >>> bool((scaler(logits).argmax(1) == logits.argmax(1)).all())
        True
    """

    log_temperature: nn.Parameter

    def __init__(
        self,
        *,
        bounds: tuple[float, float] = (1e-3, 1e3),
        method: str | None = None,
        grad_tol: float = 1e-10,
        step_tol: float = 1e-8,
        max_iter: int = 100,
    ) -> None:
        super().__init__()
        if method not in (None, "newton", "lbfgs"):
            raise ValueError(f"method: expected None, 'newton' or 'lbfgs', got {method!r}")
        self.bounds = check_temperature_bounds("bounds", bounds)
        self.method = method
        self.grad_tol = check_finite_value("grad_tol", grad_tol)
        self.step_tol = check_finite_value("step_tol", step_tol)
        self.max_iter = check_int("max_iter", max_iter, minimum=1)
        self.log_temperature = nn.Parameter(torch.zeros((), dtype=torch.float64))
        self._init_fitted()

    # ------------------------------------------------------------------ state
    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        check_state_finite(state, prefix, "log_temperature")
        lt = state.get("log_temperature")
        if lt is not None and lt.numel() == 1:
            if not abs(float(lt)) <= 700.0:  # exp() finite and > 0 in float64
                raise ValueError(
                    f"{prefix}log_temperature: expected a temperature "
                    f"0 < exp(log_temperature) < inf in float64, got "
                    f"log_temperature = {float(lt)!r}"
                )

    @property
    def temperature(self) -> float:
        """The temperature ``T = exp(log_temperature)``; settable (``> 0``, marks fitted)."""
        return math.exp(float(self.log_temperature.detach()))

    @temperature.setter
    def temperature(self, value: float) -> None:
        v = check_finite_value("temperature", value, strict=True)
        self._store("log_temperature", math.log(v))
        self._mark_fitted()

    def forward(self, logits: Tensor) -> Tensor:
        """``logits / T`` (same shape and dtype; ``-inf`` masks stay ``-inf``). Half-precision
        logits are divided in float64 and rounded back without overflow (a row whose maximum
        would not fit is shifted to maximum 0: the same softmax)."""
        self._check_fitted()
        if not isinstance(logits, Tensor) or not logits.is_floating_point():
            raise ValueError("logits: expected a floating-point tensor")
        check_finite("logits", logits, allow_neg_inf=True)
        work = working_dtype(logits)
        t = torch.exp(self.log_temperature).to(device=logits.device, dtype=work)
        out = logits.to(work) / t
        return logits_as(out, logits.dtype, 1 if logits.dim() >= 2 else None)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature:.6g}, fitted={self.is_fitted}"

    # ------------------------------------------------------------------ fitting
    def fit(self, logits: Tensor, target: Tensor, *, distributed: bool = False) -> TemperatureFit:
        """Fit T on in-memory held-out ``logits`` and ``target`` (see the class docstring).

        ``distributed=True`` treats each rank's tensors as a shard and all-reduces the sums
        (every rank must call it); by default the tensors are the whole set.
        """
        check_distributed(distributed)
        logits, target, _ = as_binary_vector(logits, target)
        check_logits_target(logits, target)
        warn_if_probabilities(logits)
        sol = fit_temperature(
            logits,
            target,
            distributed=distributed,
            method=self.method or "lbfgs",
            **self._options(),
        )
        return self._accept(sol)

    def _options(self) -> dict[str, Any]:
        return dict(
            bounds=self.bounds,
            grad_tol=self.grad_tol,
            step_tol=self.step_tol,
            max_iter=self.max_iter,
        )

    def _accept(self, sol: TemperatureSolution) -> TemperatureFit:
        """Store T, warn (pointing at the caller of ``fit`` / ``fit_stream``) and report."""
        msgs = warn_all(sol.messages, stacklevel=4)
        self._store("log_temperature", sol.log_temperature)
        self._mark_fitted()
        return TemperatureFit(
            temperature=self.temperature,
            nll_before=sol.nll_before,
            nll_after=sol.nll_after,
            grad_norm=sol.grad_norm,
            iterations=sol.iterations,
            converged=sol.converged,
            warnings=msgs,
            passes=sol.passes,
            method=sol.method,
        )

    def fit_stream(
        self,
        batches: Iterable[tuple[Tensor, Tensor]] | Callable[[], Iterable],
        *,
        distributed: bool | None = None,
    ) -> TemperatureFit:
        """Fit T from chunks ``(logits, target)`` in O(chunk) memory (a few passes).

        ``batches`` must be re-iterable (a list, a ``DataLoader`` of logits) or a zero-argument
        callable returning a fresh iterable: the solver passes over it several times (one
        pass per Newton step, about 4-7). Chunks may differ in size, not in the number of
        classes. With ``distributed=None`` the sums are all-reduced whenever
        ``torch.distributed`` is initialised, so every rank gets the T of the union of the
        shards (every rank must call it; a rank whose shard is empty passes ``[]``).

        Example:
            >>> import torch
            >>> from torchcal.scaling import TemperatureScaler
            >>> g = torch.Generator().manual_seed(0)
            >>> z = 3 * torch.randn(3000, 5, generator=g)
            >>> y = torch.multinomial(torch.softmax(z / 3, 1), 1, generator=g).squeeze(1)
            >>> chunks = list(zip(z.split(1000), y.split(1000)))
            >>> t_stream = TemperatureScaler().fit_stream(chunks).temperature
            >>> t_full = TemperatureScaler(method="newton").fit(z, y).temperature
            >>> abs(t_stream / t_full - 1) < 1e-9
            True
        """
        if callable(batches) and not hasattr(batches, "__iter__"):
            factory = batches
        else:
            if iter(batches) is batches:  # type: ignore[arg-type]
                raise ValueError(
                    "batches: expected a re-iterable (list, DataLoader) or a "
                    "callable returning a fresh iterable; a one-shot iterator "
                    "cannot be read several times"
                )

            def factory() -> Iterable:
                return batches  # type: ignore[return-value]

        reduce = distributed_active() if distributed is None else check_distributed(distributed)
        kind: dict[str, Any] = {}

        def chunks() -> Iterator[Chunk]:
            return stream_chunks(factory(), kind)

        with torch.inference_mode(False), torch.no_grad():
            # The first pass validates and learns the kind; peek it from the first chunk.
            first = next(iter(chunks()), None)
            if first is None and not reduce:
                raise ValueError("batches: expected at least one (logits, target) chunk, got none")
            # under torch.distributed a rank with an empty shard still joins every all-reduce
            # with zero sums (the other ranks' chunks decide the kind)
            binary = first is not None and first.logits.dim() == 1
            num_classes = None if binary or first is None else first.logits.shape[1]
            sol = solve_temperature(
                chunks,
                binary,
                num_classes,
                torch.zeros(1, dtype=torch.float64),
                reduce=reduce,
                method=self.method or "newton",
                **self._options(),
            )
        return self._accept(sol)

    def fit_model(
        self,
        model: nn.Module,
        dataloader: Iterable,
        *,
        cache_dtype: torch.dtype | None = None,
        input_key: str | None = None,
        target_key: str | None = None,
        distributed: bool = False,
    ) -> TemperatureFit:
        """Collect ``model``'s logits over ``dataloader`` once (``eval()``, no grad) and fit.

        Batches are ``(input, target)`` or dicts; inputs move to the model's device; the
        model's training mode is restored. ``cache_dtype=torch.float16`` halves the logit cache.

        Example:
            >>> import torch
            >>> from torchcal.scaling import TemperatureScaler
            >>> g = torch.Generator().manual_seed(0)
            >>> model = torch.nn.Linear(3, 4)
            >>> x = torch.randn(256, 3, generator=g)
            >>> with torch.no_grad():
            ...     p = torch.softmax(model(x) / 2, 1)
            >>> y = torch.multinomial(p, 1, generator=g).squeeze(1)
            >>> loader = torch.utils.data.DataLoader(list(zip(x, y)), batch_size=64)
            >>> res = TemperatureScaler().fit_model(model, loader)
            >>> res.nll_after <= res.nll_before, model.training
            (True, True)
        """
        logits, target = collect_logits(
            model, dataloader, cache_dtype=cache_dtype, input_key=input_key, target_key=target_key
        )
        return self.fit(logits, target, distributed=distributed)


def stream_chunks(batches: Iterable, kind: dict[str, Any]) -> Iterator[Chunk]:
    """Cache-sized :class:`Chunk` views of ``(logits, target)`` pairs with global offsets;
    ``kind`` (kept across passes) holds the first pair's kind, which every pair must share."""
    offset = 0
    for item in batches:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValueError("batches: expected (logits, target) pairs")
        lg, tg, _ = as_binary_vector(*item)
        binary = check_logits_target(lg, tg)
        c = None if binary else lg.shape[1]
        if "binary" not in kind:
            kind["binary"], kind["classes"] = binary, c
        elif kind["binary"] != binary or kind["classes"] != c:
            raise ValueError(
                f"batches: every chunk must have the same kind and number "
                f"of classes; got shape {tuple(lg.shape)} after "
                f"{'binary' if kind['binary'] else kind['classes']}"
            )
        lg = lg.detach()
        tg = tg.detach().to(lg.device)
        if not binary:
            tg = tg.long()
        for piece in tensor_chunks(lg, tg):  # cache-sized slices, no copies
            piece.offset += offset
            yield piece
        offset += tg.shape[0]
