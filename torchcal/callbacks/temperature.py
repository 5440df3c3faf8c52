"""``TemperatureScaling``: fit a temperature on the validation logits and ship it inside the
LightningModule (and therefore inside every checkpoint written afterwards)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor, nn
from typing_extensions import override

from torchcal.callbacks._outputs import check_extract_fn, check_key, read_outputs
from torchcal.functional._validation import check_int, check_option
from torchcal.metrics import CalibrationError
from torchcal.scaling import FitResult, TemperatureScaler
from torchcal.scaling._objective import all_reduce_, distributed_active

__all__ = ["TemperatureScaling"]

_LOGGED = ("temperature", "nll_before_scaling", "nll_after_scaling", "ece_before_scaling",
           "ece_after_scaling")


def _missing_to_current(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any
                        ) -> None:
    """``load_state_dict`` pre-hook of an attached scaler: a checkpoint written without the
    callback has no ``<attr>.*`` keys; keep the scaler's current (unfitted) state instead of
    failing a strict load."""
    for name, t in list(module.state_dict(keep_vars=False).items()):
        state_dict.setdefault(prefix + name, t)


class TemperatureScaling(Callback):
    """Fit one temperature (Guo et al. 2017) on the validation logits and attach it to the
    LightningModule as ``pl_module.<attr_name>`` (a :class:`torchcal.scaling.TemperatureScaler`
    submodule), so the temperature is in the module's ``state_dict`` and checkpoints, and
    ``predict_step`` can return ``self.temperature_scaler(logits)``.

    The logits come from what ``validation_step`` returns (default keys ``"logits"``,
    ``"target"``; multiclass ``(B, C)`` with class indices, or binary ``(B,)`` with 0/1
    targets; ``-inf`` entries are masks); no extra forward pass is run. They are kept (on
    their device) for the current validation epoch only and fitted with the scaler's streamed
    Newton solver (:meth:`~torchcal.scaling.TemperatureScaler.fit_stream`), whose sums are
    all-reduced under DDP, so every rank gets the same T. Fitting runs outside inference mode
    on detached tensors, so it also works in ``trainer.validate()``.

    When:
        ``when="fit_end"`` (default): once, at the end of ``fit``, on the last validation
        epoch's logits. The fitted T is then in the module (and in checkpoints written after
        ``fit``, e.g. ``trainer.save_checkpoint(path)``), but not in the ``ModelCheckpoint``
        files written during training. ``when="epoch"``: after every validation epoch, so each
        ``ModelCheckpoint`` file carries the T fitted to its own weights. ``trainer.validate()``
        fits at the end of its epoch (unless ``fit_on_validate=False``).

    Logged: ``{stage}/temperature``, ``{stage}/nll_before_scaling``,
    ``{stage}/nll_after_scaling``, ``{stage}/ece_before_scaling``,
    ``{stage}/ece_after_scaling`` (ECE: equal-width L1, ``n_bins``, confidence reading for
    multiclass, binary reading for binary logits) through ``pl_module.log`` in epoch mode and
    in ``validate``; at fit end (where ``pl_module.log`` is not allowed) straight to the
    loggers and into ``trainer.callback_metrics``. Every fit is appended to :attr:`history`
    (kept in the callback's checkpoint state); :attr:`result` is the last
    :class:`~torchcal.scaling.FitResult`.

    Loading: with this callback in the ``Trainer``, ``trainer.predict(model,
    ckpt_path=...)`` / ``validate`` / ``fit`` restore the temperature into a fresh module (the
    scaler is attached in ``setup``, before the checkpoint's weights are loaded; a checkpoint
    without a temperature leaves it unfitted). Without a Trainer, call
    :meth:`TemperatureScaling.attach` from the module's ``on_load_checkpoint`` (then
    ``Model.load_from_checkpoint`` works) or read the scaler alone with
    :meth:`TemperatureScaling.load_scaler`.

    Args:
        when: ``"fit_end"`` or ``"epoch"``.
        logits_key: key of the logits in the step's output dict.
        target_key: key of the targets.
        extract_fn: ``fn(pl_module, batch, outputs) -> (logits, target)`` (or a dict),
            replacing the dict lookup.
        dataloader_idx: which validation dataloader to fit on.
        attr_name: attribute under which the scaler is attached.
        n_bins: bins of the logged ECE.
        bounds: ``(t_min, t_max)`` of the temperature (degenerate sets stop there with a
            warning).
        method: ``"newton"`` (default) or ``"lbfgs"``, see
            :class:`~torchcal.scaling.TemperatureScaler`.
        fit_on_validate: fit in ``trainer.validate()`` (default); ``False`` keeps the
            temperature loaded from a checkpoint when validating it.
        verbose: print T and NLL/ECE before and after each fit (rank 0).

    Example:
        >>> import torch, lightning as L
        >>> from torchcal.callbacks import TemperatureScaling
        >>> class Model(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(4, 3)
        ...     def validation_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         return {"logits": 5 * self.net(x), "target": y}
        >>> g = torch.Generator().manual_seed(0)
        >>> data = torch.utils.data.TensorDataset(torch.randn(128, 4, generator=g),
        ...                                       torch.randint(0, 3, (128,), generator=g))
        >>> trainer = L.Trainer(callbacks=[TemperatureScaling()], logger=False,
        ...                     enable_progress_bar=False, enable_model_summary=False)
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
        when: Literal["fit_end", "epoch"] = "fit_end",
        logits_key: str = "logits",
        target_key: str = "target",
        extract_fn: Callable[[LightningModule, Any, Any], Any] | None = None,
        dataloader_idx: int = 0,
        attr_name: str = "temperature_scaler",
        n_bins: int = 15,
        bounds: tuple[float, float] = (1e-3, 1e3),
        method: Literal["newton", "lbfgs"] = "newton",
        fit_on_validate: bool = True,
        verbose: bool = False,
    ) -> None:
        super().__init__()
        check_option("when", when, ("fit_end", "epoch"))
        check_option("method", method, ("newton", "lbfgs"))
        if not isinstance(attr_name, str) or not attr_name.isidentifier():
            raise ValueError(f"attr_name: expected a Python identifier, got {attr_name!r}")
        self.dataloader_idx = check_int("dataloader_idx", dataloader_idx, minimum=0)
        self.n_bins = check_int("n_bins", n_bins, minimum=1)
        try:
            lo, hi = (float(b) for b in bounds)
        except (TypeError, ValueError):
            raise ValueError(f"bounds: expected (t_min, t_max), got {bounds!r}") from None
        if not (0 < lo < hi < math.inf):
            raise ValueError(f"bounds: expected 0 < t_min < t_max < inf, got {bounds!r}")
        self.when = when
        self.logits_key = check_key("logits_key", logits_key)
        self.target_key = check_key("target_key", target_key)
        self.extract_fn = check_extract_fn(extract_fn)
        self.attr_name = attr_name
        self.bounds = (lo, hi)
        self.method = method
        self.fit_on_validate = bool(fit_on_validate)
        self.verbose = bool(verbose)
        #: One dict per fit: ``stage, epoch, step, n`` and the logged values.
        self.history: list[dict[str, Any]] = []
        #: The :class:`~torchcal.scaling.FitResult` of the last fit (not checkpointed).
        self.result: FitResult | None = None
        self._chunks: list[tuple[Tensor, Tensor]] = []
        self._chunks_at = (0, 0)  # (epoch, global step) of the collected validation epoch

    # ------------------------------------------------------------------ identity / state
    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(attr_name=self.attr_name, when=self.when,
                                        logits_key=self.logits_key,
                                        dataloader_idx=self.dataloader_idx)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"history": [dict(h) for h in self.history]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [dict(h) for h in state_dict.get("history", [])]

    # ------------------------------------------------------------------ attaching
    @staticmethod
    def attach(pl_module: nn.Module, checkpoint: dict[str, Any] | None = None, *,
               attr_name: str = "temperature_scaler", **scaler_kwargs: Any
               ) -> TemperatureScaler | None:
        """Attach a :class:`~torchcal.scaling.TemperatureScaler` as ``pl_module.<attr_name>``
        (or return the one already there) before a state dict is loaded into it.

        Call it from ``LightningModule.on_load_checkpoint`` so that
        ``Model.load_from_checkpoint(path)`` restores the temperature; with ``checkpoint``
        given, the scaler is attached only if the checkpoint holds one (returns the scaler
        or ``None`` then).

        Example:
            >>> import torch
            >>> m = torch.nn.Linear(2, 2)
            >>> s = TemperatureScaling.attach(m)
            >>> sorted(k for k in m.state_dict() if k.startswith("temperature_scaler."))
            ['temperature_scaler.fitted', 'temperature_scaler.log_temperature']
        """
        current = getattr(pl_module, attr_name, None)
        if current is not None:
            if not isinstance(current, TemperatureScaler):
                raise ValueError(f"attr_name: pl_module.{attr_name} exists and is a "
                                 f"{type(current).__name__}, not a TemperatureScaler; pick "
                                 f"another attr_name")
            return current
        if checkpoint is not None and not any(
                k.startswith(attr_name + ".") for k in checkpoint.get("state_dict", {})):
            return None
        scaler = TemperatureScaler(**scaler_kwargs)
        # the temperature is fitted post hoc, never by the training optimiser (and DDP must
        # not expect a gradient for it)
        scaler.log_temperature.requires_grad_(False)
        scaler.register_load_state_dict_pre_hook(_missing_to_current)
        try:
            device = next(pl_module.parameters()).device
        except StopIteration:
            device = torch.device("cpu")
        pl_module.add_module(attr_name, scaler.to(device))
        return scaler

    @staticmethod
    def load_scaler(checkpoint: str | dict[str, Any], *,
                    attr_name: str = "temperature_scaler") -> TemperatureScaler:
        """The fitted scaler stored in a Lightning checkpoint (a path, read with
        ``torch.load(..., weights_only=True)``, or the loaded dict)."""
        if not isinstance(checkpoint, dict):
            checkpoint = torch.load(checkpoint, map_location="cpu", weights_only=True)
        prefix = attr_name + "."
        state = {k[len(prefix):]: v for k, v in checkpoint.get("state_dict", {}).items()
                 if k.startswith(prefix)}
        if not state:
            raise ValueError(f"checkpoint: expected the keys '{prefix}*' written by "
                             f"TemperatureScaling, found none")
        scaler = TemperatureScaler()
        scaler.load_state_dict(state)
        return scaler

    def _scaler(self, pl_module: LightningModule) -> TemperatureScaler:
        scaler = self.attach(pl_module, attr_name=self.attr_name, bounds=self.bounds,
                             method=self.method)
        assert scaler is not None  # no checkpoint given: always attached
        return scaler

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._scaler(pl_module)

    # ------------------------------------------------------------------ collecting
    @override
    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._chunks = []

    @override
    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule,
                                outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        if trainer.sanity_checking or dataloader_idx != self.dataloader_idx:
            return
        logits, target = read_outputs("TemperatureScaling", "val", pl_module, batch, outputs,
                                      keys=[self.logits_key, self.target_key],
                                      extract_fn=self.extract_fn)
        self._chunks.append((logits, target))

    # ------------------------------------------------------------------ fitting
    @override
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self._chunks_at = (int(trainer.current_epoch), int(trainer.global_step))
        validating = trainer.state.fn == TrainerFn.VALIDATING
        if (self.when == "epoch" and not validating) or (validating and self.fit_on_validate):
            values = self._fit(trainer, pl_module, "val")
            if values is None:
                return
            dev = pl_module.device
            dtype = torch.float32 if dev.type == "mps" else torch.float64
            for key in _LOGGED:
                pl_module.log(f"val/{key}", torch.tensor(values[key], dtype=dtype, device=dev),
                              on_step=False, on_epoch=True,
                              sync_dist=True, add_dataloader_idx=False)

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.when != "fit_end":
            return
        values = self._fit(trainer, pl_module, "val")
        if values is None:
            return
        metrics = {f"val/{k}": v for k, v in values.items()}
        for k, v in metrics.items():
            trainer.callback_metrics[k] = torch.tensor(v, dtype=torch.float64)
        if trainer.is_global_zero:
            for lg in trainer.loggers:
                lg.log_metrics(metrics, step=trainer.global_step)
                lg.save()

    def _any_chunks(self) -> bool:
        """Whether any rank collected logits (a collective under DDP)."""
        n = torch.tensor([float(len(self._chunks))], dtype=torch.float64)
        if distributed_active():
            all_reduce_(n)
        return bool(n.item() > 0)

    def _ece(self, chunks: list[tuple[Tensor, Tensor]], scaler: TemperatureScaler | None,
             device: torch.device) -> float:
        binary = chunks[0][0].dim() == 1
        metric = CalibrationError(self.n_bins, reading="binary" if binary else "confidence")
        metric = metric.to(device)
        with torch.no_grad():  # in whatever (inference) mode the hook runs
            for logits, target in chunks:
                z = logits if scaler is None else scaler(logits)
                metric.update(z, target)
            return float(metric.compute())

    def _fit(self, trainer: Trainer, pl_module: LightningModule, stage: str
             ) -> dict[str, float] | None:
        if not self._any_chunks():
            return None
        chunks = self._chunks
        scaler = self._scaler(pl_module)
        ece_before = self._ece(chunks, None, pl_module.device)
        result = scaler.fit_stream(chunks)
        ece_after = self._ece(chunks, scaler, pl_module.device)
        self.result = result
        values = {"temperature": float(result.temperature or math.nan),
                  "nll_before_scaling": result.nll_before, "nll_after_scaling": result.nll_after,
                  "ece_before_scaling": ece_before, "ece_after_scaling": ece_after}
        n = sum(int(t.shape[0]) for _, t in chunks)
        self.history.append({"stage": stage, "epoch": self._chunks_at[0],
                             "step": self._chunks_at[1], "n_local": n,
                             "converged": bool(result.converged), **values})
        if self.verbose and trainer.is_global_zero:
            print(f"[TemperatureScaling] epoch {self._chunks_at[0]}: T = "
                  f"{values['temperature']:.4f}; NLL {result.nll_before:.4f} -> "
                  f"{result.nll_after:.4f}; ECE ({self.n_bins} bins) {ece_before:.4f} -> "
                  f"{ece_after:.4f}")
        return values
