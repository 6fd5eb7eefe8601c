"""`twinrun.integrations.hf.DiagCallback` with a real `transformers.Trainer` on the toy model:
two runs at one seed write byte-identical diag files; another seed diverges at the first step;
and a Trainer + PEFT run lines up with a `twinrun tune sft` run of the same rows, LoRA init and
optimizer, leaf by leaf (`twinrun diff --common-leaves`)."""

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
    assert [r["step"] for r in rows] == [0, 1, 2]  # numbered as twinrun numbers its steps
    assert all(list(r["checksums"]) == list(HF_LEAVES) for r in rows)
    assert rows[0]["checksums"]["loss"] > 0 and rows[0]["checksums"]["grads.trainable"] > 0
    assert rows[1]["checksums"]["params.trainable"] != rows[0]["checksums"]["params.trainable"]

    capsys.readouterr()
    assert run_cli(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--bitwise"]) == 0
    assert run_cli(["diff", str(a), str(c), "--bitwise"]) == 1
    first = capsys.readouterr().out.splitlines()[2]
    # seed 8 shuffles the rows differently: the data is the first thing to differ
    assert first.startswith("FIRST_DIVERGENCE: step=0 leaf=batch.tokens "), first


def test_leaf_subset_and_validation(tmp_path: Path) -> None:
    cb = DiagCallback(tmp_path / "x.jsonl", leaves=["rng.state", "loss"])
    assert cb.leaves == ("loss", "rng.state")  # dataflow order
    cb.close()
    with pytest.raises(ValueError, match="unknown DiagCallback leaves"):
        DiagCallback(tmp_path, leaves=["grads.lora"])


def peft_run(model_dir: Path, init: Path, rows: list, out: Path, max_grad_norm: float) -> Path:
    """The Trainer with PEFT on `rows` in the given order (a sequential sampler), one row a
    step, the LoRA factors loaded from twinrun's initial adapter, AdamW at a constant rate."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    class InOrder(Trainer):
        def _get_train_sampler(self, *args: object, **kwargs: object) -> object:
            return torch.utils.data.SequentialSampler(self.train_dataset)

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                attn_implementation="eager")  # fmt: skip
    model = PeftModel.from_pretrained(base, init, is_trainable=True)
    data = [{"input_ids": torch.tensor(r.input_ids),
             "labels": torch.tensor([t if m else -100 for t, m in zip(r.input_ids, r.loss_mask,
                                                                     strict=True)])}
            for r in rows]  # fmt: skip
    args = TrainingArguments(
        output_dir=str(out), max_steps=len(rows), per_device_train_batch_size=1,
        gradient_accumulation_steps=1, learning_rate=1e-2, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        max_grad_norm=max_grad_norm, seed=0, use_cpu=True, report_to="none",
        dataloader_num_workers=0, save_strategy="no", logging_strategy="no", disable_tqdm=True,
        optim="adamw_torch",
    )  # fmt: skip
    leaves = [leaf for leaf in HF_LEAVES if leaf != "rng.state"]  # other generators than twinrun's
    callback = DiagCallback(out, leaves=leaves)
    InOrder(model=model, args=args, train_dataset=data, callbacks=[callback]).train()
    return out


def test_a_trainer_run_lines_up_with_a_twinrun_run(
    toy_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from testkit.captures import shipped
    from twinrun.data.batching import epoch_order
    from twinrun.data.examples import encode_sft_rows, load_rows
    from twinrun.model.tokens import load_tokenizer

    examples = shipped("sft.jsonl", tmp_path, 3)
    init = tmp_path / "init"
    assert run_cli(["init-adapter", str(init), "--model", str(toy_model_dir), "--seed", "7",
                    "--lora-rank", "4", "--lora-alpha", "8"]) == 0  # fmt: skip
    ours = tmp_path / "twinrun"
    assert run_cli([
        "tune", "sft", "--model", str(toy_model_dir), "--examples", str(examples),
        "--output", str(ours), "--seed", "1", "--epochs", "1", "--batch-size", "1",
        "--accumulation", "1", "--learning-rate", "1e-2", "--warmup-steps", "0",
        "--lr-schedule", "constant", "--lora-rank", "4", "--lora-alpha", "8",
        "--precision", "f32", "--chat-template", "on", "--threads", "1", "--quiet", "--diag",
        "--init-adapter", str(init),
    ]) == 0  # fmt: skip
    encoded = encode_sft_rows(load_tokenizer(toy_model_dir), load_rows(examples), True, 2048)
    rows = [encoded[i] for i in epoch_order(1, 0, len(encoded))]  # twinrun's epoch-0 order
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        same = peft_run(toy_model_dir, init, rows, tmp_path / "trainer", max_grad_norm=0.0)
        clipped = peft_run(toy_model_dir, init, rows, tmp_path / "clipped", max_grad_norm=1e-4)
    finally:
        torch.set_num_threads(old)
    capsys.readouterr()
    # the same rows, init and optimizer: every leaf both record agrees within tolerance
    assert run_cli(["diff", "--common-leaves", str(ours), str(same)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("COMMON_LEAVES: left out, recorded by one run only: "
                      "batch.sample_indices (A only), rng.state (A only)")  # fmt: skip
    assert out[1].startswith("DETERMINISTIC: 3 rows, 8 leaves compared")
    # the Trainer's gradient clipping (on by default) is where a default TRL/Trainer run parts
    assert run_cli(["diff", "--common-leaves", str(ours), str(clipped)]) == 1
    first = capsys.readouterr().out.splitlines()[1]
    assert first.startswith("FIRST_DIVERGENCE: step=0 leaf=grads.lora "), first
    # without --common-leaves the runs' different leaf sets are what diff names, and the line
    # under it says that a Trainer run never records that leaf and which flag compares the rest
    assert run_cli(["diff", str(ours), str(same)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "leaf=batch.sample_indices" in out[0]
    assert out[1] == "  run B has no leaf batch.sample_indices at this step"
    assert out[2].startswith("  a Trainer run's DiagCallback never records batch.sample_indices")
    assert out[2].endswith("--common-leaves compares the leaves both runs record")
