"""`twinrun tune ipo` end to end on the toy model: its first loss by hand (the adapter starts at
zero, so every log-ratio gap is 0 and each pair costs (0 - 1/(2 tau))^2), a later step's loss
recomputed independently with transformers + PEFT from per-token log-probs, the same bytes
twice, and other bytes than DPO's on the same pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from twinrun.cli.main import run_cli
from twinrun.data.examples import load_rows, shipped_examples
from twinrun.data.pairs import encode_pairs
from twinrun.model.tokens import load_tokenizer

TAU = 0.1


def args(model: Path, examples: Path, out: Path, objective: str, epochs: int) -> list[str]:
    return [
        "tune", objective, "--model", str(model), "--examples", str(examples), "--output",
        str(out), "--seed", "3", "--epochs", str(epochs), "--batch-size", "4",
        "--accumulation", "1", "--learning-rate", "5e-2", "--warmup-steps", "0",
        "--lr-schedule", "constant", "--lora-rank", "4", "--lora-alpha", "8",
        "--precision", "f32", "--chat-template", "on", "--beta", str(TAU), "--quiet",
        "--threads", "1",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ipo")
    examples = root / "pairs4.jsonl"
    lines = shipped_examples("pairs.jsonl").read_text().splitlines()[:4]
    examples.write_text("\n".join(lines) + "\n")
    out = {"examples": examples}
    for name, objective, epochs in (
        ("one", "ipo", 1), ("again", "ipo", 1), ("two", "ipo", 2), ("dpo", "dpo", 1),
    ):  # fmt: skip
        assert run_cli(args(toy_model_dir, examples, root / name, objective, epochs)) == 0
        out[name] = root / name
    return out


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_first_step_costs_the_target_squared(runs: dict[str, Path]) -> None:
    # LoRA's B starts at zero: policy = reference bit for bit, h = 0 for every pair
    assert losses(runs["one"]) == [(0 - 1 / (2 * TAU)) ** 2]


def test_a_later_step_is_per_token_ipo_recomputed_with_peft(
    runs: dict[str, Path], toy_model_dir: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(toy_model_dir)
    pairs = encode_pairs(tok, load_rows(runs["examples"]), True, 10_000)
    base = AutoModelForCausalLM.from_pretrained(toy_model_dir, torch_dtype=torch.float32)
    # the one-step run's adapter is the two-step run's after step 0 (constant lr, same seed)
    policy = PeftModel.from_pretrained(base, str(runs["one"])).eval()

    def per_token(ids: tuple[int, ...], mask: tuple[int, ...]) -> float:
        x = torch.tensor([ids])
        logp = torch.log_softmax(policy(input_ids=x).logits[0, :-1].double(), -1)
        picked = logp.gather(1, x[0, 1:, None])[:, 0]
        m = torch.tensor(mask[1:], dtype=torch.float64)
        return float((picked * m).sum() / m.sum())

    expected = []
    with torch.no_grad():
        for p in pairs:
            pc = per_token(p.chosen.input_ids, p.chosen.loss_mask)
            pr = per_token(p.rejected.input_ids, p.rejected.loss_mask)
            with policy.disable_adapter():
                rc = per_token(p.chosen.input_ids, p.chosen.loss_mask)
                rr = per_token(p.rejected.input_ids, p.rejected.loss_mask)
            expected.append(((pc - rc) - (pr - rr) - 1 / (2 * TAU)) ** 2)
    first, second = losses(runs["two"])
    assert first == losses(runs["one"])[0]
    assert second != first  # the update moved the gaps
    assert second == pytest.approx(sum(expected) / len(expected), rel=1e-4)


def test_same_bytes_twice_and_not_dpos(runs: dict[str, Path]) -> None:
    name = "adapter_model.safetensors"
    assert (runs["one"] / name).read_bytes() == (runs["again"] / name).read_bytes()
    assert (runs["one"] / name).read_bytes() != (runs["dpo"] / name).read_bytes()
    side = json.loads((runs["one"] / "twinrun.json").read_text())
    assert side["train"]["objective"] == "ipo" and side["train"]["beta"] == TAU
