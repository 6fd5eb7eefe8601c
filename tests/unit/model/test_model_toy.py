"""The toy checkpoint writer and the transformers-free byte tokenizer."""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import pytest
import torch

from twinrun.core.errors import ModelError, OutputError
from twinrun.core.rng import stream
from twinrun.model.tokens import load_tokenizer
from twinrun.model.toy import BOS_ID, EOS_ID, PAD_ID, write_toy_checkpoint

TEXTS = ["hello world", "héllo ✓ 日本", "", "a\nb\tc  d", "<|user|>\nhi<|eos|>", "\x00\xff"]


def _header(path: Path) -> dict:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n])


def test_files_written(toy_model_dir: Path) -> None:
    names = {p.name for p in toy_model_dir.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= names
    assert "tokenizer_config.json" in names
    assert not [n for n in names if n.startswith(".")]
    cfg = json.loads((toy_model_dir / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert cfg["vocab_size"] == 259 and cfg["tie_word_embeddings"] is False
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]) == (4, 64, 128)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (4, 2)
    assert _header(toy_model_dir / "model.safetensors")["__metadata__"] == {"format": "pt"}


def test_weights_pinned_to_stream(toy_model_dir: Path) -> None:
    from safetensors.torch import load_file

    state = load_file(str(toy_model_dir / "model.safetensors"))
    assert "lm_head.weight" in state
    bound = 0.02 * math.sqrt(3.0)
    for name, t in state.items():
        assert t.dtype == torch.float32
        if name.endswith("norm.weight"):
            assert torch.equal(t, torch.ones_like(t))
        else:
            assert t.abs().max() <= bound
    name = "model.layers.1.self_attn.k_proj.weight"
    t = state[name]
    want = stream(0, "toy_init", name).uniform_fill(tuple(t.shape), bound)
    assert torch.equal(t, torch.from_numpy(want).float())


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path, toy_model_dir: Path) -> None:
    state = torch.get_rng_state()
    write_toy_checkpoint(tmp_path / "a", seed=0)
    write_toy_checkpoint(tmp_path / "b", seed=1)
    assert torch.equal(state, torch.get_rng_state()), "the writer must not draw from torch's RNG"
    for f in toy_model_dir.iterdir():
        assert (tmp_path / "a" / f.name).read_bytes() == f.read_bytes(), f.name
    a, b = (tmp_path / d / "model.safetensors" for d in "ab")
    assert a.read_bytes() != b.read_bytes()
    assert (tmp_path / "a/config.json").read_bytes() == (tmp_path / "b/config.json").read_bytes()


def test_shape_options(tmp_path: Path) -> None:
    write_toy_checkpoint(
        tmp_path / "m", seed=3, layers=2, hidden=32, intermediate=48, heads=2, kv_heads=1
    )
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_key_value_heads"]) == (2, 32, 1)
    with pytest.raises(ValueError):
        write_toy_checkpoint(tmp_path / "bad", seed=0, hidden=30, heads=4)


def test_refuses_non_empty_dir_unless_overwrite(tmp_path: Path) -> None:
    small = {"layers": 1, "hidden": 8, "intermediate": 8, "heads": 2, "kv_heads": 1}
    out = tmp_path / "m"
    write_toy_checkpoint(out, seed=0, **small)
    with pytest.raises(OutputError, match="not empty"):
        write_toy_checkpoint(out, seed=0, **small)
    first = (out / "model.safetensors").read_bytes()
    write_toy_checkpoint(out, seed=1, overwrite=True, **small)  # a toy replaces a toy
    assert (out / "model.safetensors").read_bytes() != first
    assert [p.name for p in tmp_path.iterdir()] == ["m"], "no temporary directories left"
    (out / "keep.txt").write_text("x")  # anything else: --overwrite refuses, nothing lost
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(OutputError, match="holds keep.txt, which the toy checkpoint does not"):
        write_toy_checkpoint(out, seed=0, overwrite=True, **small)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (out / "keep.txt").unlink()
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"vocab_size": 32000}))
    with pytest.raises(OutputError, match="not a twinrun toy checkpoint"):  # a real model's names
        write_toy_checkpoint(out, seed=0, overwrite=True, **small)
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 32000
    (tmp_path / "link").symlink_to(out)
    with pytest.raises(OutputError, match="is a symbolic link"):
        write_toy_checkpoint(tmp_path / "link", seed=0, overwrite=True, **small)
    empty = tmp_path / "empty"
    empty.mkdir()
    write_toy_checkpoint(empty, seed=0, **small)  # an existing empty directory is fine
    with pytest.raises(OutputError):
        write_toy_checkpoint(tmp_path / "m" / "model.safetensors", seed=0)


def test_the_toy_writes_exactly_the_files_overwrite_may_replace(toy_model_dir: Path) -> None:
    from twinrun.model.toy import TOY_FILES

    assert sorted(p.name for p in toy_model_dir.iterdir()) == sorted(TOY_FILES)


# -- tokenizer -------------------------------------------------------------------------------


def test_bytes_map_to_ids(toy_model_dir: Path) -> None:
    tok = load_tokenizer(toy_model_dir)
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (BOS_ID, EOS_ID, PAD_ID, 259)
    every_byte = bytes(range(256))
    text = every_byte.decode("latin-1")
    assert tok.encode(text) == list(text.encode("utf-8"))
    for t in TEXTS:
        assert tok.encode(t) == list(t.encode("utf-8")) or "<|eos|>" in t
        assert tok.decode(tok.encode(t)) == t.replace("<|eos|>", "")
    assert tok.encode("a<|eos|>") == [97, EOS_ID]
    assert tok.decode([97, EOS_ID], skip_special=False) == "a<|eos|>"


def test_agrees_with_autotokenizer(toy_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(toy_model_dir)
    tok = load_tokenizer(toy_model_dir)
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)
    for t in TEXTS:
        assert tok.encode(t) == hf.encode(t, add_special_tokens=False)
        assert hf(t)["input_ids"] == [BOS_ID, *tok.encode(t)]  # its own rule: BOS once
    chat = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+2? ✓"},
        {"role": "assistant", "content": "4"},
    ]
    for gen in (False, True):
        want = hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
        assert tok.render_chat(chat, add_generation_prompt=gen) == want
    assert tok.render_chat(chat[1:2], True) == "<|bos|><|user|>\n2+2? ✓<|eos|><|assistant|>\n"
    assert tok.end_ids == (EOS_ID,)


def test_missing_template_and_files(tmp_path: Path, toy_model_dir: Path) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(toy_model_dir, plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((plain / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = load_tokenizer(plain)
    assert tok.chat_template is None
    with pytest.raises(ModelError, match="chat template"):
        tok.render_chat([{"role": "user", "content": "x"}], True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (plain / name).unlink()
    with pytest.raises(ModelError, match="no tokenizer files in .*plain") as err:
        load_tokenizer(plain)
    assert "\n" not in err.value.one_line()


def test_tokenizer_module_does_not_import_transformers() -> None:
    import subprocess
    import sys

    code = (
        "import sys, twinrun.model.tokens, twinrun.model.loading, twinrun.model; "
        "assert 'transformers' not in sys.modules; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
