"""Models: the one builder (transformers' own causal LM plus twinrun's switches), TRL-rule
tokens over AutoTokenizer, LoRA apply/save/load in PEFT's format, KV-cached decoding with keyed
draws, batch-invariant mode, the reward head and the toy checkpoint writer.

Submodules are imported explicitly (`from twinrun.model.build import build_model`); this
package imports nothing, so `twinrun --help` never pays for torch or transformers.
"""
