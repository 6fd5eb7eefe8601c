"""Models: the toy checkpoint writer, the byte tokenizer, twinrun's own pure-torch Llama,
LoRA apply/save/load in PEFT's format, and KV-cached decoding.

Submodules are imported explicitly (`from twinrun.model.llama import load_base_model`); this
package imports nothing, so `twinrun --help` never pays for torch or transformers.
"""
