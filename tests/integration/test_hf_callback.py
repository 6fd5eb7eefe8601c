"""`twinrun.integrations.hf.DiagCallback` with a real `transformers.Trainer` on the toy model:
two runs at one seed write byte-identical diag files; another seed diverges at step 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from twinrun.cli.main import run_cli
from twinrun.integrations.hf import HF_LEAVES, DiagCallback


class TokenRows(torch.utils.data.Dataset):
    """Eight fixed rows of 12 byte tokens (labels = inputs)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(0, 256, (12,), generator=g) for _ in range(8)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.rows[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def train(model_dir: Path, out: Path, seed: int) -> Path:
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=3,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        seed=seed,
        use_cpu=True,
        report_to="none",
        dataloader_num_workers=0,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        optim="adamw_torch",
    )
    callback = DiagCallback(out)
    Trainer(model=model, args=args, train_dataset=TokenRows(), callbacks=[callback]).train()
    assert not callback._handles  # removed at on_train_end
    return callback.path


def test_two_trainer_runs_write_identical_diag_files(
    toy_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = train(toy_model_dir, tmp_path / "a", seed=7)
        b = train(toy_model_dir, tmp_path / "b", seed=7)
        c = train(toy_model_dir, tmp_path / "c", seed=8)
    finally:
        torch.set_num_threads(old)
    assert a == tmp_path / "a" / "diag.jsonl"
    assert a.read_bytes() == b.read_bytes()
    rows = [json.loads(line) for line in a.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(list(r["checksums"]) == list(HF_LEAVES) for r in rows)
    assert rows[0]["checksums"]["loss"] > 0 and rows[0]["checksums"]["grads.trainable"] > 0
    assert rows[1]["checksums"]["params.trainable"] != rows[0]["checksums"]["params.trainable"]

    capsys.readouterr()
    assert run_cli(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--bitwise"]) == 0
    assert run_cli(["diff", str(a), str(c), "--bitwise"]) == 1
    first = capsys.readouterr().out.splitlines()[2]
    # seed 8 shuffles the rows differently: the data is the first thing to differ
    assert first.startswith("FIRST_DIVERGENCE: step=1 leaf=batch.tokens "), first


def test_leaf_subset_and_validation(tmp_path: Path) -> None:
    cb = DiagCallback(tmp_path / "x.jsonl", leaves=["rng.state", "loss"])
    assert cb.leaves == ("loss", "rng.state")  # dataflow order
    cb.close()
    with pytest.raises(ValueError, match="unknown DiagCallback leaves"):
        DiagCallback(tmp_path, leaves=["grads.lora"])
