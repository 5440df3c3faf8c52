"""Post-hoc calibrators fitted on held-out logits."""
