"""``TemperatureScaling``: fit a temperature on the validation logits and ship it inside the
LightningModule's own ``TemperatureScaler``, so every checkpoint carries the T fitted to its weights."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import Tensor, nn
from typing_extensions import override

from torchcal.callbacks._history import HistoryCallback
from torchcal.callbacks._outputs import (
    check_extract_fn,
    check_key,
    check_logits_batch,
    read_outputs,
)
from torchcal.functional._checks import check_bool, check_int, check_option
from torchcal.functional.temperature.distributed import all_reduce_, distributed_active
from torchcal.metrics.calibration import CalibrationError
from torchcal.scaling._base import TemperatureFit
from torchcal.scaling.temperature import TemperatureScaler

__all__ = ["TemperatureScaling"]

_LOGGED = (
    "temperature",
    "nll_before_scaling",
    "nll_after_scaling",
    "ece_before_scaling",
    "ece_after_scaling",
    "refinement_nll",
    "calibration_gap",
)


def _missing_to_current(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any
) -> None:
    """``load_state_dict`` pre-hook put on the scaler by :meth:`TemperatureScaling.setup`: a
    checkpoint written before the module had a scaler has no ``<attr>.*`` keys; keep the
    scaler's current (unfitted) state instead of failing a strict load."""
    for name, t in list(module.state_dict(keep_vars=False).items()):
        state_dict.setdefault(prefix + name, t)


def _fix_message(model: str, attr_name: str) -> str:
    return (
        f"add `self.{attr_name} = TemperatureScaler()` (from torchcal.scaling import "
        f"TemperatureScaler) to {model}.__init__; the fitted temperature then lives in the "
        f"module's state_dict, so every checkpoint carries it and "
        f"{model}.load_from_checkpoint(path) restores it"
    )


def _warn(message: str) -> None:
    """A ``UserWarning`` from rank 0 that names the callback (attributed to the same frame
    as a direct ``rank_zero_warn`` in the hook)."""
    rank_zero_warn(f"TemperatureScaling: {message}", stacklevel=5, category=UserWarning)


class TemperatureScaling(HistoryCallback):
    """Fit the temperature of the LightningModule's own
    :class:`~torchcal.scaling.TemperatureScaler` (Guo et al. 2017) on the validation logits,
    at the end of every validation epoch of ``fit``.

    The module declares the scaler in ``__init__`` (the callback never adds modules)::

        def __init__(self):
            super().__init__()
            self.net = ...
            self.temperature_scaler = TemperatureScaler()   # fitted by the callback

    so the temperature is part of the module's ``state_dict``: every checkpoint holds it,
    ``Model.load_from_checkpoint(path)`` and ``trainer.test(..., ckpt_path="best")`` restore
    it with no other code, and ``test_step``/``predict_step`` can return
    ``self.temperature_scaler(logits)``. Without the attribute, ``setup`` raises a
    ``ValueError`` that names this fix. The callback turns off ``requires_grad`` of the
    scaler's parameter (the training optimiser never moves T, and DDP expects no gradient
    for it) and lets a checkpoint without ``<attr_name>.*`` keys load (the scaler keeps its
    state).

    The logits come from what ``validation_step`` returns (default keys ``"logits"``,
    ``"target"``; multiclass ``(B, C)`` with class indices, or binary ``(B,)`` with 0/1
    targets; ``-inf`` entries are masks); no extra forward pass is run. The first batch of
    every validation epoch, the sanity check's included, is checked (missing keys, shapes,
    dtypes, NaN/``+inf``, label values, and a warning for multiclass rows that look like
    probabilities), so a wrong ``validation_step`` fails before any training. The logits are
    kept (on their device) for the current validation epoch only and fitted with the scaler's
    streamed solver (:meth:`~torchcal.scaling.TemperatureScaler.fit_stream`), whose sums are
    all-reduced under DDP, so every rank gets the same T. A rank with no validation batch (an
    uneven ``IterableDataset``) joins every collective with an empty shard and warns; an
    epoch without any sample on any rank, and a ``fit`` that runs no validation
    (``limit_val_batches=0``), leave T as it is with a warning.

    When T is (re)fitted:
        ``when="epoch"`` (default): at the end of every validation epoch of ``fit`` (not the
        sanity check), before ``ModelCheckpoint`` saves (it saves in ``on_validation_end`` or
        at the end of the training epoch), so each checkpoint, ``best`` and ``last``
        included, holds the T fitted to its own weights. ``when="fit_end"``: once, at the end
        of ``fit``, on the last validation epoch's logits (checkpoints written during
        training then hold the previous T). ``trainer.validate()`` and ``trainer.test()``
        never refit (evaluating a checkpoint on another loader must not change it), unless
        ``fit_on_validate=True`` asks ``validate`` to fit on its loader.

    Logged (``fit``'s validation epochs, and ``validate`` with ``fit_on_validate=True``):
    ``val/temperature``, ``val/nll_before_scaling``, ``val/nll_after_scaling``,
    ``val/ece_before_scaling``, ``val/ece_after_scaling`` (ECE: equal-width L1, ``n_bins``,
    confidence reading for multiclass, binary reading for binary logits, computed from the
    float64 logits), ``val/refinement_nll`` and ``val/calibration_gap`` through
    ``pl_module.log``; with ``when="fit_end"`` straight to the loggers and into
    ``trainer.callback_metrics``. Every fit is appended to :attr:`history` (kept in the
    callback's checkpoint state); :attr:`result` is the last
    :class:`~torchcal.scaling.TemperatureFit`.

    Refine, then calibrate (Berta et al. 2025, "Rethinking Early Stopping: Refine, Then
    Calibrate", arXiv 2501.19195): ``val/refinement_nll`` is the validation NLL after the
    fitted T (the refinement error's temperature-scaling estimate; the same number as
    ``val/nll_after_scaling``, under the name to monitor) and ``val/calibration_gap`` the NLL
    before T minus after (what T removes). Both are read off the fit's own float64 sums (no
    extra pass over the logits; under DDP the sums of every rank), in the validation epoch's
    end, before ``ModelCheckpoint`` saves: ``ModelCheckpoint(monitor="val/refinement_nll")``
    keeps the epoch whose NLL *after* its own T is lowest, with that T inside, and
    ``EarlyStopping(monitor="val/refinement_nll")`` stops on it. With ``when="fit_end"``
    nothing is logged during training, so a checkpoint or early stopping that monitors one
    of these names is a ``ValueError`` at the start of ``fit``.

    Args:
        when: ``"epoch"`` (default) or ``"fit_end"``.
        logits_key: key of the logits in the step's output dict.
        target_key: key of the targets.
        extract_fn: ``fn(pl_module, batch, outputs) -> (logits, target)`` (or a dict),
            replacing the dict lookup.
        dataloader_idx: which validation dataloader to fit on (default 0).
        attr_name: the module's attribute holding the
            :class:`~torchcal.scaling.TemperatureScaler`.
        n_bins: bins of the logged ECE.
        fit_on_validate: also fit in ``trainer.validate()`` (default ``False``).
        verbose: log T and NLL/ECE before and after each fit (``rank_zero_info``: the
            ``lightning.pytorch`` logger, rank 0).

    Example:
        >>> import torch, lightning as L
        >>> from torchcal.callbacks import TemperatureScaling
        >>> from torchcal.scaling import TemperatureScaler
        >>> class Model(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(4, 3)
        ...         self.temperature_scaler = TemperatureScaler()
        ...     def validation_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         return {"logits": 5 * self.net(x), "target": y}
        >>> g = torch.Generator().manual_seed(0)
        >>> data = torch.utils.data.TensorDataset(torch.randn(128, 4, generator=g),
        ...                                       torch.randint(0, 3, (128,), generator=g))
        >>> trainer = L.Trainer(callbacks=[TemperatureScaling(fit_on_validate=True)],
        ...                     logger=False, enable_progress_bar=False,
        ...                     enable_model_summary=False)
        >>> model = Model()
        >>> out = trainer.validate(model, torch.utils.data.DataLoader(data, batch_size=32),
        ...                        verbose=False)
        >>> out[0]["val/nll_after_scaling"] <= out[0]["val/nll_before_scaling"]
        True
        >>> model.temperature_scaler.temperature == out[0]["val/temperature"]
        True
    """

    def __init__(
        self,
        when: Literal["epoch", "fit_end"] = "epoch",
        logits_key: str = "logits",
        target_key: str = "target",
        extract_fn: Callable[[LightningModule, Any, Any], Any] | None = None,
        dataloader_idx: int = 0,
        attr_name: str = "temperature_scaler",
        n_bins: int = 15,
        fit_on_validate: bool = False,
        verbose: bool = False,
    ) -> None:
        super().__init__()
        check_option("when", when, ("epoch", "fit_end"))
        if not isinstance(attr_name, str) or not attr_name.isidentifier():
            raise ValueError(f"attr_name: expected a Python identifier, got {attr_name!r}")
        self.dataloader_idx = check_int("dataloader_idx", dataloader_idx, minimum=0)
        self.n_bins = check_int("n_bins", n_bins, minimum=1)
        self.when = when
        self.logits_key = check_key("logits_key", logits_key)
        self.target_key = check_key("target_key", target_key)
        self.extract_fn = check_extract_fn(extract_fn)
        self.attr_name = attr_name
        self.fit_on_validate = check_bool("fit_on_validate", fit_on_validate)
        self.verbose = check_bool("verbose", verbose)
        #: One dict per fit: ``stage, epoch, step, n_local, n, converged`` and the logged values.
        self.history: list[dict[str, Any]] = []
        #: The :class:`~torchcal.scaling.TemperatureFit` of the last fit (not checkpointed).
        self.result: TemperatureFit | None = None
        self._chunks: list[tuple[Tensor, Tensor]] = []
        self._chunks_at = (0, 0)  # (epoch, global step) of the collected validation epoch
        self._kind: tuple[bool, int | None] | None = None  # (binary, C) seen this epoch
        self._first = True  # the next checked batch is the epoch's first: check its values
        self._fits_in_run = 0
        self._warned_no_val = False

    # ------------------------------------------------------------------ identity / state
    _key_settings = ("attr_name", "when", "logits_key", "dataloader_idx")

    # ------------------------------------------------------------------ the scaler
    def _scaler(self, pl_module: nn.Module) -> TemperatureScaler:
        """``pl_module.<attr_name>``, or a ``ValueError`` naming the fix."""
        scaler = getattr(pl_module, self.attr_name, None)
        model = type(pl_module).__name__
        if scaler is None:
            raise ValueError(
                f"pl_module: TemperatureScaling fits the TemperatureScaler that "
                f"the LightningModule declares as `self.{self.attr_name}`, and "
                f"{model} has none; {_fix_message(model, self.attr_name)}"
            )
        if not isinstance(scaler, TemperatureScaler):
            raise ValueError(
                f"attr_name: {model}.{self.attr_name} is a "
                f"{type(scaler).__name__}, not a torchcal.scaling."
                f"TemperatureScaler; {_fix_message(model, self.attr_name)} (or "
                f"pass TemperatureScaling(attr_name=...) naming the attribute "
                f"that holds it)"
            )
        return scaler

    @staticmethod
    def load_scaler(
        checkpoint: str | dict[str, Any], *, attr_name: str = "temperature_scaler"
    ) -> TemperatureScaler:
        """The scaler stored in a Lightning checkpoint (a path, read with
        ``torch.load(..., weights_only=True)``, or the loaded dict), without the module."""
        if not isinstance(checkpoint, dict):
            checkpoint = torch.load(checkpoint, map_location="cpu", weights_only=True)
        prefix = attr_name + "."
        state = {
            k[len(prefix) :]: v
            for k, v in checkpoint.get("state_dict", {}).items()
            if k.startswith(prefix)
        }
        if not state:
            raise ValueError(
                f"checkpoint: expected the keys '{prefix}*' of the module's "
                f"TemperatureScaler, found none"
            )
        scaler = TemperatureScaler()
        scaler.load_state_dict(state)
        return scaler

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        scaler = self._scaler(pl_module)
        # fitted post hoc, never by the training optimiser (and DDP must expect no gradient)
        for p in scaler.parameters():
            p.requires_grad_(False)
        # DDP leaves the scaler alone: no gradient bucket for T, and no broadcast of its
        # buffers in every forward (a collective per validation batch, which would hang a
        # rank that has fewer validation batches than the others); every rank fits the same T
        names = {f"{self.attr_name}.{n}" for n, _ in scaler.named_parameters()}
        names |= {f"{self.attr_name}.{n}" for n, _ in scaler.named_buffers()}
        ignored = set(getattr(pl_module, "_ddp_params_and_buffers_to_ignore", ()))
        pl_module._ddp_params_and_buffers_to_ignore = sorted(ignored | names)
        if not getattr(scaler, "_torchcal_missing_hook", False):
            scaler.register_load_state_dict_pre_hook(_missing_to_current)
            scaler._torchcal_missing_hook = True  # type: ignore[assignment]

    # ------------------------------------------------------------------ when
    def _fits_in(self, trainer: Trainer) -> bool:
        """Whether validation epochs of this run are read (checked, and kept for a fit)."""
        fn = trainer.state.fn
        return fn == TrainerFn.FITTING or (fn == TrainerFn.VALIDATING and self.fit_on_validate)

    def _check_monitors(self, trainer: Trainer) -> None:
        """With ``when="fit_end"`` nothing is logged during training: a ``ModelCheckpoint`` or
        ``EarlyStopping`` that monitors one of the logged names would find no value."""
        if self.when != "fit_end":
            return
        logged = {f"val/{k}" for k in _LOGGED}
        for cb in trainer.callbacks:  # type: ignore[attr-defined]
            monitor = getattr(cb, "monitor", None)
            if isinstance(cb, (ModelCheckpoint, EarlyStopping)) and monitor in logged:
                raise ValueError(
                    f"when: {type(cb).__name__}(monitor={monitor!r}) needs the value at "
                    f"every validation epoch, and TemperatureScaling(when='fit_end') logs "
                    f"it once, at the end of fit; use TemperatureScaling(when='epoch')"
                )

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check_monitors(trainer)
        self._fits_in_run = 0
        self._warned_no_val = False
        if trainer.limit_val_batches == 0:
            self._warned_no_val = True
            _warn(
                f"limit_val_batches=0 runs no validation, so "
                f"the temperature of {type(pl_module).__name__}.{self.attr_name} "
                f"is not fitted during this fit (it keeps its current state); "
                f"give the Trainer validation batches"
            )

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if (
            trainer.state.fn == TrainerFn.VALIDATING
            and not self.fit_on_validate
            and not self._scaler(pl_module).is_fitted
        ):
            _warn(
                f"{type(pl_module).__name__}.{self.attr_name} "
                f"is not fitted and trainer.validate() does not fit it (it fits "
                f"during fit's validation); pass "
                f"TemperatureScaling(fit_on_validate=True) to fit it on this "
                f"loader"
            )

    # ------------------------------------------------------------------ collecting
    @override
    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._first = True
        self._kind = None
        if not trainer.sanity_checking and self._fits_in(trainer):
            self._chunks = []

    @override
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if dataloader_idx != self.dataloader_idx or not self._fits_in(trainer):
            return
        logits, target = read_outputs(
            "TemperatureScaling",
            "val",
            pl_module,
            batch,
            outputs,
            keys=[self.logits_key, self.target_key],
            extract_fn=self.extract_fn,
        )
        binary = check_logits_batch("TemperatureScaling", logits, target, values=self._first)
        self._first = False
        kind = (binary, None if binary else int(logits.shape[1]))
        if self._kind is None:
            self._kind = kind
        elif kind != self._kind:
            raise ValueError(
                f"logits: every validation batch must have the same kind and "
                f"number of classes; got shape {tuple(logits.shape)} after "
                f"{'binary (B,)' if self._kind[0] else self._kind[1]} logits"
            )
        if not trainer.sanity_checking:
            self._chunks.append((logits, target))

    # ------------------------------------------------------------------ fitting
    @override
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or not self._fits_in(trainer):
            return
        self._chunks_at = (int(trainer.current_epoch), int(trainer.global_step))
        if trainer.state.fn == TrainerFn.FITTING and self.when == "fit_end":
            return  # fitted in on_fit_end, on the last epoch's logits
        values = self._fit(trainer, pl_module, "val")
        self._chunks = []
        if values is None:
            return
        dev = pl_module.device
        dtype = torch.float32 if dev.type == "mps" else torch.float64
        for key in _LOGGED:
            pl_module.log(
                f"val/{key}",
                torch.tensor(values[key], dtype=dtype, device=dev),
                on_step=False,
                on_epoch=True,
                sync_dist=True,
                add_dataloader_idx=False,
            )

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.when == "fit_end" and (values := self._fit(trainer, pl_module, "val")):
            self._chunks = []
            metrics = {f"val/{k}": v for k, v in values.items()}
            for k, v in metrics.items():
                trainer.callback_metrics[k] = torch.tensor(v, dtype=torch.float64)
            if trainer.is_global_zero:
                for lg in trainer.loggers:
                    lg.log_metrics(metrics, step=trainer.global_step)
                    lg.save()
        if self._fits_in_run == 0 and not self._warned_no_val:
            _warn(
                f"no validation logits reached the callback "
                f"during this fit (no val_dataloader, check_val_every_n_epoch "
                f"beyond max_epochs, or empty validation data), so the temperature "
                f"of {type(pl_module).__name__}.{self.attr_name} was not fitted"
            )

    def _global_kind(self) -> tuple[int, bool, int | None]:
        """``(n, binary, C)`` over all ranks (a collective under DDP; every rank calls it)."""
        n_local = float(sum(int(t.shape[0]) for _, t in self._chunks))
        binary, c = self._kind if (self._kind and self._chunks) else (False, None)
        has = float(bool(self._chunks))
        v = torch.tensor(
            [n_local, has * binary, has * (not binary), float(c or 0)], dtype=torch.float64
        )
        if distributed_active():
            all_reduce_(v)
        n, n_bin, n_multi, c_sum = (float(x) for x in v)
        if n_bin and n_multi:
            raise ValueError("logits: binary (B,) logits on some ranks and (B, C) on others")
        if n_multi and c_sum != n_multi * (c_sum // n_multi):
            raise ValueError("logits: the number of classes differs between ranks")
        return int(n), bool(n_bin), (int(c_sum // n_multi) if n_multi else None)

    def _ece(self, binary: bool, temperature: float | None, device: torch.device) -> float:
        """Equal-width L1 ECE of the kept logits (divided by ``temperature``), all ranks
        pooled by :class:`~torchcal.metrics.CalibrationError`'s own DDP sync (a collective
        under DDP; a rank with an empty shard joins it with zero counts)."""
        metric = CalibrationError(
            self.n_bins, norm="l1", reading="binary" if binary else "confidence"
        ).to(device)
        with torch.no_grad(), warnings.catch_warnings():
            # probabilities passed as logits were reported once, at the first batch
            warnings.filterwarnings("ignore", message=r"preds: every row lies in \[0, 1\]")
            # an empty shard (warned about in _fit) computes before any update
            warnings.filterwarnings("ignore", message=r".*called before the ``update``")
            for logits, target in self._chunks:
                z = logits.double() if temperature is None else logits.double() / temperature
                metric.update(z.to(device), target.to(device))
            ece = metric.compute()
        assert isinstance(ece, Tensor)  # no groups: a scalar
        return float(ece)

    def _fit(
        self, trainer: Trainer, pl_module: LightningModule, stage: str
    ) -> dict[str, float] | None:
        scaler = self._scaler(pl_module)
        n, binary, _ = self._global_kind()
        where = f"validation dataloader {self.dataloader_idx}"
        if n == 0:
            _warn(
                f"{where} gave no sample on any rank in this "
                f"epoch; the temperature keeps its current state"
            )
            return None
        if not self._chunks:
            warnings.warn(
                f"TemperatureScaling: rank {trainer.global_rank} had no batch of "
                f"{where} in this epoch; it joins the fit with an empty shard (T "
                f"is fitted on the other ranks' logits)",
                UserWarning,
                stacklevel=2,
            )
        dev = pl_module.device
        ece_before = self._ece(binary, None, dev)
        result = scaler.fit_stream(self._chunks)
        ece_after = self._ece(binary, scaler.temperature, dev)
        self.result = result
        self._fits_in_run += 1
        values = {
            "temperature": scaler.temperature,
            "nll_before_scaling": result.nll_before,
            "nll_after_scaling": result.nll_after,
            "ece_before_scaling": ece_before,
            "ece_after_scaling": ece_after,
            # refine, then calibrate (docs/design.md section 4): read off the fit's own sums
            "refinement_nll": result.nll_after,
            "calibration_gap": result.nll_before - result.nll_after,
        }
        n_local = sum(int(t.shape[0]) for _, t in self._chunks)
        self.history.append(
            {
                "stage": stage,
                "epoch": self._chunks_at[0],
                "step": self._chunks_at[1],
                "n_local": n_local,
                "n": n,
                "converged": bool(result.converged),
                **values,
            }
        )
        if self.verbose:
            rank_zero_info(
                f"[TemperatureScaling] epoch {self._chunks_at[0]}: T = "
                f"{values['temperature']:.4f}; NLL {result.nll_before:.4f} -> "
                f"{result.nll_after:.4f}; ECE ({self.n_bins} bins) "
                f"{ece_before:.4f} -> {ece_after:.4f}"
            )
        return values
