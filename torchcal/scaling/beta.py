"""Beta calibration of a binary classifier's probabilities (Kull, Silva Filho & Flach, 2017)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from torchcal.functional._checks import check_int, check_option
from torchcal.functional._validation import check_finite_value
from torchcal.functional.beta import PARAMETERS, beta_logits, beta_midpoint, fit_beta
from torchcal.scaling._base import FittedMixin, NLLFit, check_state_finite, logits_as
from torchcal.scaling._scores import check_input, check_scores

__all__ = ["BetaScaler"]


class BetaScaler(FittedMixin):
    r"""Beta calibration of binary probabilities: ``forward(p) = a ln p - b ln(1 - p) + c``
    (calibrated logits; ``predict_proba`` gives ``sigmoid`` of them).

    The map family of Kull, Silva Filho & Flach (2017), "Beta calibration: a well-founded and
    easily implemented improvement on logistic calibration for binary classifiers": a
    logistic regression on ``(ln p, -ln(1 - p))``, which contains the identity (``a = b = 1,
    c = 0``) and maps skewed or S-shaped miscalibration that one slope (Platt) cannot. The
    ``parameters`` of ``betacal`` (its ``BetaCalibration(parameters=...)``, whose conventions
    are kept):

    - ``"abm"`` (3 parameters): ``a``, ``b``, ``c`` free; when the fitted ``a < 0`` (else
      ``b < 0``) that coefficient is set to 0 and the other two are refitted (betacal's rule,
      which keeps the map monotone; the refitted one is not checked again).
    - ``"ab"`` (2): the midpoint fixed at ``m = 1/2``, i.e. ``c = (a - b) ln 2`` (betacal's
      regression on ``(ln 2p, ln 2(1 - p))`` without an intercept).
    - ``"am"`` (2): ``a = b``, i.e. Platt scaling of ``logit(p)`` with 0/1 targets.

    ``m`` (betacal's ``map_[2]``) is the ``p`` mapped to 1/2. Fit: the exact minimum of
    betacal's objective (the mean NLL; betacal's penalty ``C = 1e11`` is left out) by a
    float64 damped Newton with the exact Hessian (``docs/design.md`` section 4) to ``grad_tol``
    on the gradient norm -- betacal's lbfgs stops at scikit-learn's ``tol=1e-4``, about 1e-3
    short in the coefficients.

    ``input="probs"`` (default, as the paper and betacal): ``scores`` are ``P(y = 1)`` in
    ``[0, 1]``, clipped to ``[eps, 1 - eps]`` with ``eps`` the machine epsilon of their dtype
    (betacal's clip, so that 0 and 1 have finite logs). ``input="logits"``: ``scores`` are
    logits ``s`` and ``ln p = logsigmoid(s)``, ``ln(1 - p) = logsigmoid(-s)`` in float64, no
    clip (equal to betacal on ``sigmoid(s)`` where that does not round to 0 or 1, up to the
    rounding of ``1 - p``). A set whose classes are perfectly separated by ``p`` (every
    negative's ``p <=`` every positive's, or the reverse) has no maximum-likelihood map: a
    ``ValueError`` (betacal returns whatever its iteration cap reaches).

    State: ``a``, ``b``, ``c`` (0-dim float64 parameters; finite on load) and ``fitted``.
    ``forward`` returns the input's shape and dtype (computed in float64); before ``fit`` it
    raises :class:`~torchcal.scaling.NotFittedError`.

    Example:
        >>> import torch
        >>> from torchcal.scaling import BetaScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> p = torch.rand(4000, generator=g, dtype=torch.float64) * 0.98 + 0.01
        >>> y = torch.bernoulli(torch.sigmoid(2 * p.log() - 0.5 * torch.log1p(-p)), generator=g)
        >>> beta = BetaScaler()              # parameters="abm", input="probs"
        >>> res = beta.fit(p, y)
        >>> round(beta.a.item(), 1), round(beta.b.item(), 1), res.converged
        (1.9, 0.6, True)
        >>> beta.predict_proba(torch.tensor([0.5], dtype=torch.float64)).round(decimals=2)
        tensor([0.2500], dtype=torch.float64)
    """

    a: nn.Parameter
    b: nn.Parameter
    c: nn.Parameter

    def __init__(
        self,
        parameters: str = "abm",
        *,
        input: str = "probs",
        grad_tol: float = 1e-12,
        max_iter: int = 100,
    ) -> None:
        super().__init__()
        self.map_parameters = check_option("parameters", parameters, PARAMETERS)
        self.input = check_input(input)
        self.grad_tol = check_finite_value("grad_tol", grad_tol)
        self.max_iter = check_int("max_iter", max_iter, minimum=1)
        self.a = nn.Parameter(torch.ones((), dtype=torch.float64))
        self.b = nn.Parameter(torch.ones((), dtype=torch.float64))
        self.c = nn.Parameter(torch.zeros((), dtype=torch.float64))
        self._init_fitted()

    @property
    def m(self) -> float:
        """betacal's midpoint: the ``p`` mapped to 1/2 (0.5 for ``"ab"``)."""
        return beta_midpoint(*self._coefficients(), self.map_parameters)

    def _coefficients(self) -> tuple[float, float, float]:
        return float(self.a.detach()), float(self.b.detach()), float(self.c.detach())

    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        check_state_finite(state, prefix, "a", "b", "c")

    def _logs(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        """``(ln p, ln(1 - p))`` in float64 (betacal's clip for ``input="probs"``)."""
        x = scores.to(torch.float64)
        if self.input == "logits":
            return F.logsigmoid(x), F.logsigmoid(-x)
        eps = torch.finfo(scores.dtype).eps
        p = x.clamp(eps, 1.0 - eps)
        return p.log(), torch.log1p(-p)

    def _calibrated(self, scores: Tensor) -> Tensor:
        """The float64 calibrated logits of checked ``scores``, flattened to ``(N,)``."""
        self._check_fitted()
        flat, _ = check_scores(scores, input=self.input, binary_only=True)
        log_p, log_q = self._logs(flat)
        return beta_logits(log_p, log_q, *self._coefficients())

    def forward(self, scores: Tensor) -> Tensor:
        """Calibrated logits ``a ln p - b ln(1 - p) + c`` (shape and dtype of ``scores``)."""
        return logits_as(self._calibrated(scores), scores.dtype, None).reshape(scores.shape)

    def predict_proba(self, scores: Tensor) -> Tensor:
        """Calibrated ``P(y = 1)`` (float64, the shape of ``scores``)."""
        return torch.sigmoid(self._calibrated(scores)).reshape(scores.shape)

    def fit(self, scores: Tensor, target: Tensor) -> NLLFit:
        """Fit the map on binary ``scores`` ``(N,)`` (or ``(N, 1)``; probabilities or logits
        per ``input``) and 0/1 ``target`` of both classes."""
        scores, checked = check_scores(scores, target, input=self.input, binary_only=True)
        assert checked is not None
        y = checked.detach().to(device=scores.device, dtype=torch.float64)
        if bool((y == y[0]).all()):
            raise ValueError("target: expected both classes 0 and 1, got one")
        with torch.inference_mode(False), torch.no_grad():
            log_p, log_q = self._logs(scores.detach())
            z = log_p - log_q  # logit(p), monotone in p
            neg, pos = z[y < 0.5], z[y > 0.5]
            if float(neg.max()) <= float(pos.min()) or float(pos.max()) <= float(neg.min()):
                raise ValueError(
                    "target: the classes are perfectly separated by the scores (every "
                    "negative's p <= every positive's, or the reverse): beta calibration's "
                    "likelihood has no maximum (use IsotonicCalibrator, or more data)"
                )
            sol = fit_beta(
                log_p,
                log_q,
                y,
                parameters=self.map_parameters,
                grad_tol=self.grad_tol,
                max_iter=self.max_iter,
            )
        self._store("a", sol.a)
        self._store("b", sol.b)
        self._store("c", sol.c)
        self._mark_fitted()
        return NLLFit.of(sol, "newton")
