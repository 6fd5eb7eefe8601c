"""Inference commands as library calls: `evaluate` (per-example losses), `generate` (greedy or
seeded sampling), `extract` (hidden states, steering vectors) and `steering` (adding a vector
at generation time)."""
