"""twinrun: reproducible LLM post-training (LoRA SFT, DPO, reward modelling, GRPO).

The package root imports nothing heavy: `twinrun --help` must answer without torch.
"""

__version__ = "0.1.0"
