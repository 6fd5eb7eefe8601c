"""`--max-grad-norm` (TRL's `max_grad_norm`): each step's gradient is scaled to at most that L2
norm by torch's rule, `max / (norm + 1e-6)`, the norm in a fixed order; the setting is recorded
(sidecar, optimizer contract) and a replay, built by the same loop builder, clips exactly as its
source did — so an update with clipping replays bit for bit, and a replay that would not clip
is refused by the contract."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from testkit.captures import (
    Capture,
    epoch_source,
    init_adapter,
    metrics,
    run_config,
    shipped,
)
from twinrun.train.step.loop import CLIP_EPS, clip_to_norm, fixed_order_norm


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_clipping_scales_by_torch_s_rule_exactly() -> None:
    grads = [torch.tensor([3.0, 0.0]), torch.tensor([[4.0]])]
    norm = fixed_order_norm(grads)
    assert norm == 5.0
    coef = clip_to_norm(grads, norm, 1.0)
    assert coef == 1.0 / (5.0 + CLIP_EPS)  # hand-computed: 0.19999996...
    assert torch.equal(grads[0], torch.tensor([3.0, 0.0]) * coef)
    assert torch.equal(grads[1], torch.tensor([[4.0]]) * coef)
    kept = [torch.tensor([3.0, 4.0])]
    assert clip_to_norm(kept, 5.0, 10.0) == 1.0  # under the bound: untouched
    assert torch.equal(kept[0], torch.tensor([3.0, 4.0]))


def source(tmp_path: Path, toy_model_dir: Path, max_grad_norm: float | None) -> Capture:
    tmp_path.mkdir(parents=True, exist_ok=True)
    init = init_adapter(tmp_path / "init", toy_model_dir, seed=5)
    data = shipped("sft.jsonl", tmp_path)
    doc = epoch_source("sft", toy_model_dir, init, tmp_path / "src", data)
    if max_grad_norm is not None:
        doc["training"]["max_grad_norm"] = max_grad_norm
    assert run_config(tmp_path / "src.toml", doc) == 0
    return Capture(doc, tmp_path / "src", 0)


def test_a_clipped_step_is_recorded_and_replays_bitwise(
    tmp_path: Path, toy_model_dir: Path
) -> None:
    cap = source(tmp_path, toy_model_dir, 0.01)
    (row,) = metrics(cap.out)
    assert row["grad_norm"] > 0.01  # the toy's first step is far above the bound
    assert row["grad_clip"] == 0.01 / (row["grad_norm"] + CLIP_EPS)
    sidecar = json.loads((cap.out / "twinrun.json").read_text())
    assert sidecar["train"]["max_grad_norm"] == 0.01
    manifest = json.loads(cap.manifest.read_text())
    assert manifest["optimizer_contract"]["values"]["training.max_grad_norm"] == 0.01
    assert run_config(tmp_path / "rep.toml", cap.replay_config(tmp_path / "rep")) == 0
    (rep,) = metrics(tmp_path / "rep")
    assert rep["grad_clip"] == row["grad_clip"] and rep["loss"] == row["loss"]
    final = "final/adapter_model.safetensors"
    assert sha(tmp_path / "rep" / final) == sha(cap.out / final)


def test_a_replay_without_the_clip_is_refused(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = source(tmp_path, toy_model_dir, 0.01)
    doc = cap.replay_config(tmp_path / "rep")
    del doc["training"]["max_grad_norm"]
    assert run_config(tmp_path / "rep.toml", doc) != 0
    err = capsys.readouterr().err
    assert "undeclared difference training.max_grad_norm: source 0.01, replay absent" in err
    assert not (tmp_path / "rep").exists()


def test_off_records_nothing_and_clipping_changes_the_update(
    tmp_path: Path, toy_model_dir: Path
) -> None:
    off = source(tmp_path / "off", toy_model_dir, None)
    (row,) = metrics(off.out)
    assert "grad_clip" not in row
    assert "max_grad_norm" not in json.loads((off.out / "twinrun.json").read_text())["train"]
    on = source(tmp_path / "on", toy_model_dir, 0.01)
    final = "final/adapter_model.safetensors"
    assert sha(on.out / final) != sha(off.out / final)  # AdamW sees a scaled gradient
