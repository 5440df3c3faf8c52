"""``nn.Module`` losses: thin shells over :mod:`torchcal.functional`."""

# ---- classification scoring rules (owner: scoring) ----

# ---- continuous scoring rules (owner: continuous) ----
