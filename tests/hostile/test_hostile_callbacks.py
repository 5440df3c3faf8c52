"""Hostile inputs for the Lightning callbacks' public entry points (what ``validation_step``
returns, the constructors, ``TemperatureScaling.load_scaler``): each case raises a
ValueError naming the argument, warns, or gives the right number against an independent
reference (scipy's Brent on log T, ``F.cross_entropy``) -- never a plausible wrong one."""

from __future__ import annotations

import math
import warnings

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from torchcal.callbacks import CalibrationMonitor, TemperatureScaling
from torchcal.scaling import TemperatureScaler

NAN, INF = float("nan"), float("inf")


def data(n: int = 64, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, :3] + torch.randn(n, 3, generator=g)).argmax(1)
    return TensorDataset(x, y)


class Step(L.LightningModule):
    """``validation_step`` returns ``{"logits": bend(z), "target": twist(y, z)}``."""

    def __init__(self, bend=lambda z: z, twist=lambda y, z: y, scale: float = 3.0) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 3)
        self.temperature_scaler = TemperatureScaler()
        self.bend, self.twist, self.scale = bend, twist, scale

    def validation_step(self, batch, batch_idx):
        x, y = batch
        z = self.scale * self.net(x)
        return {"logits": self.bend(z), "target": self.twist(y, z)}


def validate(cb: L.Callback, model: Step, ds: TensorDataset | None = None, bs: int = 32):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*(LeafSpec|workers).*")
        tr = L.Trainer(
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            callbacks=[cb],
        )
        return tr.validate(model, DataLoader(ds or data(), batch_size=bs), verbose=False)[0]


def brent_t(z: torch.Tensor, y: torch.Tensor) -> float:
    from scipy.optimize import minimize_scalar

    z = z.double()
    r = minimize_scalar(
        lambda u: float(F.cross_entropy(z / math.exp(u), y)),
        bounds=(-10, 10),
        method="bounded",
        options={"xatol": 1e-10},
    )
    return math.exp(r.x)


def _set(z: torch.Tensor, i: int, j: int, v: float) -> torch.Tensor:
    z = z.clone()
    z[i, j] = v
    return z


# (id, bend, twist, expected error regex for TemperatureScaling, for CalibrationMonitor)
RAISES = [
    ("nan", lambda z: _set(z, 1, 0, NAN), None, r"^logits: expected finite", r"^preds"),
    ("+inf", lambda z: _set(z, 2, 1, INF), None, r"^logits: expected finite", r"^preds"),
    ("int_logits", lambda z: z.long(), None, r"^logits", r"^preds"),
    ("3d_logits", lambda z: z[:, :, None], None, r"^logits: expected", r"^(preds|target)"),
    ("(N,1)_target", None, lambda y, z: y[:, None], r"^target: expected shape", r"^target"),
    ("one_hot_target", None, lambda y, z: F.one_hot(y, 3).float(), r"^target", r"^target"),
    ("float_target", None, lambda y, z: y.float(), r"^target", r"^target"),
    ("label_range", None, lambda y, z: y - 1, r"^target: expected class indices", r"^target"),
    (
        "(N,1)_logits",
        lambda z: z[:, :1],
        None,
        r"^logits: expected at least 2 classes",
        r"^(preds|target)",
    ),
    (
        "all_-inf_row",
        lambda z: torch.cat([torch.full_like(z[:1], -INF), z[1:]]),
        None,
        r"^logits",
        r"^preds",
    ),
]


@pytest.mark.parametrize("case", RAISES, ids=[c[0] for c in RAISES])
@pytest.mark.parametrize("who", ["temperature", "monitor"])
def test_bad_step_outputs_raise_naming_the_argument(case, who):
    _, bend, twist, m_ts, m_mon = case
    model = Step(bend or (lambda z: z), twist or (lambda y, z: y))
    cb = (
        TemperatureScaling(fit_on_validate=True)
        if who == "temperature"
        else CalibrationMonitor(sinks=("loggers", "figures"))
    )
    with pytest.raises(ValueError, match=m_ts if who == "temperature" else m_mon):
        validate(cb, model)


def test_empty_batch_raises():
    model = Step(lambda z: z[:0], lambda y, z: y[:0])
    with pytest.raises(ValueError, match=r"^logits: expected a non-empty tensor"):
        validate(TemperatureScaling(fit_on_validate=True), model)


def test_probabilities_as_logits_warn():
    model = Step(lambda z: z.softmax(1))
    with pytest.warns(UserWarning, match=r"^logits: every row of the first validation batch"):
        validate(TemperatureScaling(fit_on_validate=True), model)


def test_log_probabilities_are_logits_no_warning():
    """log_softmax output is a valid logit vector (same softmax): the same T, no warning."""
    ds = data(96, 1)
    a = Step()
    b = Step(lambda z: z.log_softmax(1))
    b.load_state_dict(a.state_dict())
    ta = validate(TemperatureScaling(fit_on_validate=True), a, ds)["val/temperature"]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=r"^logits: every row")
        tb = validate(TemperatureScaling(fit_on_validate=True), b, ds)["val/temperature"]
    assert tb == pytest.approx(ta, rel=1e-6)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 100.0])
def test_extreme_logit_scales_give_the_reference_temperature(scale):
    ds = data(128, 2)
    model = Step(scale=scale)
    out = validate(TemperatureScaling(fit_on_validate=True), model, ds)
    with torch.no_grad():
        z = scale * model.net(ds.tensors[0])
    assert out["val/temperature"] == pytest.approx(brent_t(z, ds.tensors[1]), rel=1e-6)


def test_single_sample_is_separated_and_warns():
    """N = 1: the NLL falls as T -> 0 (a separated set): T stops at the bound, with a
    warning, never a plausible interior value."""
    ds = data(1, 3)
    model = Step(twist=lambda y, z: z.argmax(1))  # the one sample is classified right
    with pytest.warns(Warning, match=r"T: the NLL keeps decreasing as T shrinks"):
        validate(TemperatureScaling(fit_on_validate=True), model, ds)
    assert model.temperature_scaler.temperature == pytest.approx(model.temperature_scaler.bounds[0])


def test_mixed_binary_and_multiclass_batches_raise():
    model = Step(lambda z: z if z.shape[0] == 32 else z[:, 0])
    with pytest.raises(
        ValueError,
        match=r"^logits: every validation batch must have the "
        r"same kind",
    ):
        validate(TemperatureScaling(fit_on_validate=True), model, data(40))


@pytest.mark.parametrize(
    "bad, match",
    [
        ({}, r"^checkpoint: expected the keys 'temperature_scaler\.\*'"),
        ({"state_dict": {"net.weight": torch.zeros(2)}}, r"^checkpoint"),
    ],
)
def test_load_scaler_rejects_checkpoints_without_a_scaler(bad, match):
    with pytest.raises(ValueError, match=match):
        TemperatureScaling.load_scaler(bad)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(when="never"), "when"),
        (dict(n_bins=0), "n_bins"),
        (dict(dataloader_idx=-1), "dataloader_idx"),
        (dict(attr_name=""), "attr_name"),
        (dict(target_key=None), "target_key"),
        (dict(extract_fn="f"), "extract_fn"),
    ],
)
def test_temperature_scaling_constructor(kwargs, match):
    with pytest.raises(ValueError, match=f"^{match}"):
        TemperatureScaling(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_bins=0), "n_bins"),
        (dict(reading="top1"), "reading"),
        (dict(input="log_probs"), "input"),
        (dict(level=1.0), "level"),
        (dict(reading="classwise"), "num_classes"),
        (dict(dataloader_idx=-1), "dataloader_idx"),
        (dict(name="/a"), "name"),
        (dict(num_groups=0), "num_groups"),
    ],
)
def test_calibration_monitor_constructor(kwargs, match):
    with pytest.raises(ValueError, match=f"^{match}"):
        CalibrationMonitor(**kwargs)


def test_monitor_unnormalised_probs_raise():
    model = Step(lambda z: z.softmax(1) * 0.5)
    with pytest.raises(ValueError, match=r"^preds"):
        validate(
            CalibrationMonitor(input="probs", preds_key="logits", sinks=("loggers", "figures")),
            model,
        )


def test_monitor_nll_matches_cross_entropy_with_masks():
    """-inf masks (not on the target) are allowed: NLL equals F.cross_entropy."""
    ds = data(64, 4)
    model = Step(lambda z: torch.cat([z, torch.full_like(z[:, :1], -INF)], 1))
    out = validate(CalibrationMonitor(sinks=("loggers", "figures")), model, ds)
    with torch.no_grad():
        z = 3.0 * model.net(ds.tensors[0])
    assert out["val/nll"] == pytest.approx(
        float(F.cross_entropy(z.double(), ds.tensors[1])), abs=1e-6
    )
