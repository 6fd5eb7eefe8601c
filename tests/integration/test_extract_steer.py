"""`twinrun extract` (hidden states, steering artifacts) and `twinrun generate --steer`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from twinrun.cli.main import run_cli
from twinrun.data.examples import shipped_examples


def extract_args(model: Path, examples: Path, out: Path, *extra: str, layer: int = 2,
                 pool: str = "last", bs: int = 8, precision: str = "f32") -> list[str]:  # fmt: skip
    return [
        "extract", "--model", str(model), "--examples", str(examples), "--layer", str(layer),
        "--pool", pool, "--chat-template", "on", "--precision", precision, "--batch-size",
        str(bs), "--output", str(out), "--threads", "1", "--quiet", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("pool", ["last", "mean"])
def test_extract_batch_1_and_8_match_float_for_float(
    tmp_path: Path, toy_model_dir: Path, pool: str
) -> None:
    """With --batch-invariant (the portable CPU kernels' matrix multiplies block by the number
    of rows, so ordinary batching moves the last bits of some floats)."""
    examples = shipped_examples("sft.jsonl")
    got = {}
    for bs in (1, 8):
        out = tmp_path / f"h{bs}.safetensors"
        args = extract_args(toy_model_dir, examples, out, pool=pool, bs=bs)
        assert run_cli([*args, "--batch-invariant"]) == 0
        got[bs] = load_file(str(out))["hidden"]
    assert got[1].shape == (64, 64) and got[1].dtype == torch.float32
    matching = int((got[1] == got[8]).sum())
    assert matching == got[1].numel() == 4096, f"{matching} of {got[1].numel()} floats match"
    side = json.loads((tmp_path / "h8.json").read_text())
    assert side["layer"] == 2 and side["pool"] == pool and side["batch_size"] == 8
    assert side["precision"] == "f32" and side["chat_template"] == "on"
    assert len(side["model_sha256"]) == 64 and len(side["data_sha256"]) == 64
    assert side["runtime"]["torch"] and side["tensors"] == {"hidden": [64, 64]}


def test_batch_invariant_extract_on_the_wide_toy_in_bf16(tmp_path: Path) -> None:
    from twinrun.model.toy import write_toy_checkpoint

    wide = tmp_path / "wide"
    write_toy_checkpoint(wide, seed=0, hidden=256, intermediate=512, heads=4, kv_heads=2)
    examples = shipped_examples("sft.jsonl")
    got = {}
    for bs in (1, 8):
        out = tmp_path / f"w{bs}.safetensors"
        args = extract_args(wide, examples, out, "--batch-invariant", bs=bs, layer=4,
                            pool="mean", precision="bf16")  # fmt: skip
        assert run_cli(args) == 0
        got[bs] = load_file(str(out))["hidden"]
    assert int((got[1] == got[8]).sum()) == 64 * 256


@pytest.fixture(scope="module")
def steer_file(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("steer") / "steer.safetensors"
    pairs = shipped_examples("pairs.jsonl")
    assert run_cli(extract_args(toy_model_dir, pairs, out, "--steering", layer=2)) == 0
    return out


def test_steering_artifact_and_its_metadata(
    tmp_path: Path, toy_model_dir: Path, steer_file: Path
) -> None:
    with safe_open(str(steer_file), framework="pt") as fh:
        meta = fh.metadata()
        vector = fh.get_tensor("steering_vector")
        assert list(fh.keys()) == ["steering_vector"]
    assert meta["format"] == "twinrun.infer.steering.v1"
    assert meta["precision"] == "f32" and meta["chat_template"] == "on"
    assert meta["layer"] == "2" and meta["pool"] == "last" and meta["examples"] == "32"
    side = json.loads(steer_file.with_suffix(".json").read_text())
    assert side["precision"] == "f32" and side["chat_template"] == "on"
    assert side["tensors"] == {"steering_vector": [64]} and side["examples"] == 32
    # the vector is mean(chosen) - mean(rejected) of the pooled states of the same pairs
    sides = tmp_path / "sides.safetensors"
    assert run_cli(extract_args(toy_model_dir, shipped_examples("pairs.jsonl"), sides)) == 0
    both = load_file(str(sides))
    expected = (both["chosen"].double().mean(0) - both["rejected"].double().mean(0)).float()
    assert torch.equal(vector, expected) and vector.abs().sum() > 0


def generate(model: Path, *extra: str, capsys: pytest.CaptureFixture[str]) -> list[int]:
    capsys.readouterr()
    args = [
        "generate", "--model", str(model), "--prompt", "What is 2 + 3?", "--max-new-tokens",
        "12", "--temperature", "0", "--chat-template", "on", "--seed", "1", "--threads", "1",
        "--precision", "f32", "--json", *extra,
    ]  # fmt: skip
    assert run_cli(args) == 0
    return json.loads(capsys.readouterr().out)["tokens"]


def test_generate_with_steer_changes_output_and_reproduces(
    toy_model_dir: Path, steer_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = generate(toy_model_dir, capsys=capsys)
    steer = ("--steer", str(steer_file), "--steer-scale", "64")
    steered = generate(toy_model_dir, *steer, capsys=capsys)
    assert steered != plain
    assert generate(toy_model_dir, *steer, capsys=capsys) == steered
    zero = generate(toy_model_dir, "--steer", str(steer_file), "--steer-scale", "0", capsys=capsys)
    assert zero == plain


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--layer": "5"}, "--layer must be in [0, 4]"),
        ({"--layer": "-1"}, "--layer must be >= 0"),
        ({"--pool": "max"}, "--pool must be last or mean"),
        ({"--examples": "missing.jsonl"}, "examples file not found"),
        ({"--model": "no_model_here"}, "no_model_here"),
        ({"--output": "out.bin"}, "must end in .safetensors"),
        ({"--steering": None}, "--steering needs preference pairs"),
    ],
)
def test_bad_extract_inputs_are_clear_errors(
    tmp_path: Path,
    toy_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, str | None],
    message: str,
) -> None:
    args = extract_args(toy_model_dir, shipped_examples("sft.jsonl"), tmp_path / "x.safetensors")
    for flag, value in change.items():
        if value is None:
            args.append(flag)
            continue
        value = str(tmp_path / value) if flag in ("--examples", "--output") else value
        args[args.index(flag) + 1] = value
    capsys.readouterr()
    assert run_cli(args) != 0
    err = capsys.readouterr().err
    assert err.startswith("twinrun: error:") and message in err and err.count("\n") == 1
    assert not (tmp_path / "x.safetensors").exists()


def test_bad_steering_files_are_clear_errors(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hidden = tmp_path / "h.safetensors"
    assert run_cli(extract_args(toy_model_dir, shipped_examples("sft.jsonl"), hidden)) == 0
    for path, message in ((tmp_path / "none.safetensors", "steering file not found"),
                          (hidden, "not a twinrun steering artifact")):  # fmt: skip
        capsys.readouterr()
        args = [
            "generate", "--model", str(toy_model_dir), "--prompt", "hi", "--max-new-tokens", "2",
            "--temperature", "0", "--chat-template", "on", "--seed", "1", "--precision", "f32",
            "--threads", "1", "--steer", str(path),
            "--steer-scale", "1",
        ]  # fmt: skip
        assert run_cli(args) != 0
        assert message in capsys.readouterr().err
