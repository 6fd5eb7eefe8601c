"""Inference commands as library calls: `evaluate` (per-example losses), `generate` (greedy or
seeded sampling), `extract` (hidden states, steering vectors), `steering` (adding a vector
at generation time) and `inputs` (whether an examples file holds pairs or examples). Their settings
are config/inference.py's declarations; each opens its model through `twinrun.model.prelude`."""
