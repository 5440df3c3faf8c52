"""The recipe in one screen: only torchcal's touch points, in plain PyTorch.

1. train with a proper score (``torchcal.losses.LogScoreLoss``),
2. audit calibration (``torchcal.metrics.CalibrationError``),
3. repair it with one temperature (``torchcal.scaling.TemperatureScaler``),
4. assert that the repair moved no ranking (``torchcal.functional.check_monotone_map``).

``python -m recipes.complex_link_prediction.minimal``; the full recipe (filtered ranks, the
triple audit, reports) is ``python -m recipes.complex_link_prediction``.
"""

from __future__ import annotations

import torch

from recipes.complex_link_prediction.datasets import load_dataset, with_reciprocals
from recipes.complex_link_prediction.evaluation import TripleFilter, mask_known
from recipes.complex_link_prediction.model import ComplEx
from torchcal.functional import check_monotone_map
from torchcal.losses import LogScoreLoss
from torchcal.metrics import CalibrationError
from torchcal.scaling import TemperatureScaler


def main(epochs: int = 20, seed: int = 0) -> dict[str, float]:
    """Train, audit, repair, check; returns the numbers it prints."""
    torch.manual_seed(seed)
    data = load_dataset("family", num_families=8, generations=4, seed=seed)
    E, R = data.num_entities, data.num_relations
    model = ComplEx(E, R, rank=64)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.1)
    proper_score = LogScoreLoss()  # 1. a proper scoring rule over all entities
    train = with_reciprocals(data.train, R)
    for _ in range(epochs):
        for batch in train[torch.randperm(len(train))].split(500):
            h, r, t = batch.unbind(1)
            scores, n3 = model.scores_and_n3(h, r, t)
            loss = proper_score(scores, t) + 0.01 * n3
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    # held-out queries (both directions), the other known answers masked; float64 logits
    queries = with_reciprocals(data.test, R)
    h, r, t = queries.unbind(1)
    known = TripleFilter(with_reciprocals(data.known(), R), E, 2 * R)
    with torch.no_grad():
        logits = mask_known(model.score_all(h, r, dtype=torch.float64), t, known.mask(h, r))
    fit_half = torch.arange(len(t)) % 2 == 0  # fit T on one half, report on the other

    ece = CalibrationError(n_bins=15, reading="confidence", input="logits")  # 2. audit
    ece_before = float(ece(logits[~fit_half], t[~fit_half]))
    scaler = TemperatureScaler()  # 3. repair
    temperature = scaler.fit(logits[fit_half], t[fit_half]).temperature
    with torch.no_grad():
        scaled = scaler(logits)
    ece.reset()
    ece_after = float(ece(scaled[~fit_half], t[~fit_half]))

    check = check_monotone_map(logits, scaled, decisions=False)  # 4. nothing reordered
    assert check.strict_inversions == 0 and check.ties_broken == 0 and check.top1_kept, check
    print(
        f"T = {temperature:.4f}, ECE {ece_before:.4f} -> {ece_after:.4f}, invariants ok "
        f"({check.ties_created} ties created by / T)"
    )
    return {"temperature": temperature, "ece_before": ece_before, "ece_after": ece_after}


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(  # no options: --help prints this docstring and exits
        prog="python -m recipes.complex_link_prediction.minimal",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args()
    main()
