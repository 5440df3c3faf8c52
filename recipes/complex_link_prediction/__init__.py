"""ComplEx link prediction: train with a proper scoring rule, audit calibration, repair it with
one temperature and prove by exact assertion that no decision and no ranking moved.

Run ``python -m recipes.complex_link_prediction --config configs/complex/family.yaml``.
Modules: :mod:`.datasets` (family generator, pykeen and TSV loaders), :mod:`.data` (the
LightningDataModule), :mod:`.model` (ComplEx-N3, LightningModule), :mod:`.evaluation` (filtered
ranks), :mod:`.items` (the audits' halves and corruptions), :mod:`.audit` (the two calibration
audits), :mod:`.report` (outputs), :mod:`.cli` (the command). Only torchcal's touch points, on
one screen: :mod:`.minimal`.
"""
