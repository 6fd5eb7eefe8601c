"""The toy checkpoint: a tiny, real Llama-architecture Hugging Face checkpoint initialised from
twinrun's generator, with a byte-level tokenizer and a chat template.

`write_toy_checkpoint(out_dir, seed)` writes `model.safetensors`, `config.json`,
`generation_config.json` (via `LlamaForCausalLM.save_pretrained`) and the tokenizer files (via
`PreTrainedTokenizerFast.save_pretrained`). Every weight tensor is drawn from
`stream(seed, "toy_init", name)`: linear and embedding weights uniform in ±s·√3 (the variance of
a normal(0, s) init; `init_std` s is 0.02 by default, HF's `initializer_range`), RMSNorm weights
ones.

Why `init_std` is a choice: after the final RMSNorm the hidden state has unit RMS, so the logits'
spread is about s·√hidden. At s = 0.02 and hidden 64 that is ±0.16 — a flat distribution LoRA on
the decoder layers cannot sharpen (the loss stays near ln 259 ≈ 5.56). At s = 0.2 the toy can
learn: `twinrun demo` trains it to answer its shipped questions. The same seed gives the same
bytes in every file; another seed gives another `model.safetensors`.

Vocabulary (259): ids 0..255 are the byte values, then `<|bos|>` 256, `<|eos|>` 257,
`<|pad|>` 258. The tokenizer behaves like a real one: its own rule (`add_special_tokens=True`)
puts `<|bos|>` first, and the chat template starts with the BOS token and ends every turn with
`<|eos|>` (the end of turn); role markers such as `<|user|>` are plain text (bytes).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinrun.core import interrupts
from twinrun.core.errors import OutputError
from twinrun.core.fileio import fsync_dir
from twinrun.core.owned import Layout, remove, survey

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
BOS_ID, EOS_ID, PAD_ID = 256, 257, 258
VOCAB_SIZE = 259
INIT_STD = 0.02
# what save_pretrained writes for the toy (transformers as locked): all `--overwrite` replaces
TOY_FILES = (
    "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
    "tokenizer_config.json", "chat_template.jinja",
)  # fmt: skip
TOY_LAYOUT: Layout = {re.escape(name): None for name in TOY_FILES}

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable-character table (the ByteLevel pre-tokenizer's alphabet)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def build_byte_tokenizer() -> Any:
    """A `tokenizers.Tokenizer` mapping byte value b to id b, plus bos/eos/pad special tokens;
    its post-processor adds `<|bos|>` in front (when special tokens are asked for)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from tokenizers.processors import TemplateProcessing

    table = bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)]
    )
    if tok.get_vocab_size() != VOCAB_SIZE or tok.token_to_id(PAD_TOKEN) != PAD_ID:
        raise RuntimeError("byte tokenizer construction gave an unexpected vocabulary")
    tok.post_processor = TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, BOS_ID)],
    )
    return tok


def toy_tokenizer() -> Any:
    """The toy's transformers tokenizer (byte-level, BOS rule, chat template), in memory."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=build_byte_tokenizer(),
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="right",
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def toy_state_dict(
    seed: int, names_shapes: list[tuple[str, tuple[int, ...]]], init_std: float = INIT_STD
) -> dict[str, Any]:
    """The toy weights: each tensor from `stream(seed, "toy_init", name)`, uniform with standard
    deviation `init_std`; norms are ones."""
    import torch

    from twinrun.core.rng import stream, torch_tensor

    out: dict[str, Any] = {}
    for name, shape in names_shapes:
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=torch.float32)
        else:
            bound = init_std * math.sqrt(3.0)  # uniform(-b, b) has variance b²/3 = std²
            draw = stream(seed, "toy_init", name).uniform_fill(shape, bound)
            out[name] = torch_tensor(draw, torch.float32)
    return out


@dataclass(frozen=True)
class ToySize:
    """The toy's architecture (its Llama config's sizes) and the scale of its weights."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    init_std: float

    def check(self) -> None:
        """ValueError for a size that is not positive, a weight scale that is not a positive
        finite number, or heads that do not divide the hidden size (or kv heads the heads)."""
        for label, value in (
            ("layers", self.layers), ("hidden", self.hidden), ("intermediate", self.intermediate)
        ):  # fmt: skip
            if value <= 0:
                raise ValueError(f"{label} must be positive, got {value}")
        if not (math.isfinite(self.init_std) and self.init_std > 0):
            raise ValueError(f"init_std must be a positive finite number, got {self.init_std}")
        hidden, heads, kv_heads = self.hidden, self.heads, self.kv_heads
        if heads <= 0 or kv_heads <= 0 or hidden % heads or heads % kv_heads:
            raise ValueError(
                f"need hidden % heads == 0 and heads % kv_heads == 0 (hidden={hidden}, "
                f"heads={heads}, kv_heads={kv_heads})"
            )


def _check_out_dir(out: Path, overwrite: bool) -> None:
    from twinrun.core.paths import output_path

    output_path(out, "toy-model directory")  # a link, under a file, unwritable: one line
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a directory", "choose another output path")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise OutputError(
                f"output directory {out} exists and is not empty",
                "choose a new directory or pass --overwrite",
            )
        _owned_toy(out)


def _owned_toy(out: Path) -> list[Path]:
    """The files of the toy checkpoint in `out`; OutputError when `out` holds anything else or is
    not a toy checkpoint (a real checkpoint has the same file names: its config tells them
    apart), so `--overwrite` never replaces someone's model or notes."""
    found = survey(out, TOY_LAYOUT)
    if not found.entries and found.foreign is None:
        return []  # an empty directory
    if found.foreign is not None:
        raise OutputError(
            f"--overwrite refused: {out} holds {found.foreign.relative_to(out)}, which the toy "
            "checkpoint does not" + (f" ({found.why})" if found.why else ""),
            "move it out of the directory, or choose another; --overwrite replaces only a toy "
            "checkpoint",
        )
    try:
        config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None
    toy = {"vocab_size": VOCAB_SIZE, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
           "pad_token_id": PAD_ID}  # fmt: skip
    if not isinstance(config, dict) or any(config.get(k) != v for k, v in toy.items()):
        raise OutputError(
            f"--overwrite refused: {out} is not a twinrun toy checkpoint (its config.json is "
            "not the toy's)",
            "choose another directory; --overwrite replaces only a toy checkpoint",
        )
    return found.entries


def write_toy_checkpoint(
    out_dir: str | os.PathLike[str],
    seed: int,
    layers: int = 4,
    hidden: int = 64,
    intermediate: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    overwrite: bool = False,
    init_std: float = INIT_STD,
) -> None:
    """Write the toy Llama checkpoint + byte tokenizer to `out_dir` (appears atomically).

    Raises OutputError when `out_dir` exists and is not empty, unless `overwrite` and it holds a
    toy checkpoint and nothing else."""
    from twinrun.core.rng import check_seed

    check_seed(seed)
    size = ToySize(layers, hidden, intermediate, heads, kv_heads, init_std)
    size.check()
    out = Path(out_dir)
    _check_out_dir(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        from twinrun.core.safetensors_io import library_writes

        with library_writes(out):  # a full disk names the output, not the temporary folder
            _write_into(tmp, seed, size)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        for f in tmp.iterdir():
            os.chmod(f, 0o666 & ~umask)
            with open(f, "rb+") as fh:
                os.fsync(fh.fileno())
        fsync_dir(tmp)
        interrupts.check()  # a Ctrl-C a library swallowed stops it before the output is placed
        _check_out_dir(out, overwrite)
        trash: Path | None = None
        if out.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.replace(out, trash / "old")
        os.replace(tmp, out)
        fsync_dir(out.parent)
        if trash is not None:  # the old toy, surveyed again: only its files go
            remove([*_owned_toy(trash / "old"), trash / "old", trash])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_into(tmp: Path, seed: int, size: ToySize) -> None:
    """The checkpoint's files (weights, configs, tokenizer) written into the folder `tmp`."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        hidden_act="silu",
        max_position_embeddings=2048,
        initializer_range=size.init_std,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_theta=10000.0,  # type: ignore[call-arg]  # a LlamaConfig kwarg its stub omits
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        dtype="float32",
    )
    # Built on the meta device: HF's own init never runs and never touches torch's global RNG.
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    names_shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    model.load_state_dict(
        toy_state_dict(seed, names_shapes, size.init_std), assign=True, strict=True
    )
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID
    )
    from twinrun.model.build import quiet_transformers

    with quiet_transformers():
        model.save_pretrained(tmp, safe_serialization=True)

    toy_tokenizer().save_pretrained(tmp)
