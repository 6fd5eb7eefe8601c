"""On SmolLM2-135M-Instruct, twinrun's numbers are transformers' numbers: greedy tokens equal
`generate`'s, per-example losses of `tune evaluate` equal a forward of transformers' model over
TRL's tokens (rel 1e-5), and `extract` returns transformers' `output_hidden_states`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.real.reference import completion_loss_reference, greedy_reference, reference_model
from tests.real.test_smollm2_tokens import trl_tokenize
from twinrun.cli.main import run_cli
from twinrun.data.examples import load_rows, sft_parts, shipped_examples
from twinrun.model.build import load_causal_lm
from twinrun.model.decoding import generate_tokens
from twinrun.model.tokens import load_tokenizer

pytestmark = pytest.mark.real

QUESTIONS = ("What is 2 + 2?", "Say hello in French.")


def examples_file(folder: Path, n: int, name: str = "sft.jsonl") -> Path:
    """The first `n` shipped rows (prompt/completion and messages rows alternate)."""
    lines = shipped_examples(name).read_text().splitlines()[:n]
    path = folder / f"{n}-{name}"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_greedy_tokens_are_transformers_generate(smollm2_dir: Path) -> None:
    import torch

    torch.set_num_threads(1)  # as every command's --threads 1 does
    tok = load_tokenizer(smollm2_dir)
    model = load_causal_lm(smollm2_dir, precision="f32", device="cpu")
    for question in QUESTIONS:
        prompt = tok.prompt_ids([{"role": "user", "content": question}], chat_template=True)
        ours = generate_tokens(model, prompt, 6, temperature=0.0, end_ids=tok.end_ids)
        assert ours == greedy_reference(smollm2_dir, prompt, 6), question
        assert len(ours) >= 2


def test_evaluate_losses_are_a_forward_over_trls_tokens(smollm2_dir: Path, tmp_path: Path) -> None:
    data = examples_file(tmp_path, 4)
    report = tmp_path / "eval.json"
    assert run_cli(["tune", "evaluate", "--model", str(smollm2_dir), "--examples", str(data),
                    "--chat-template", "on", "--precision", "f32", "--batch-size", "2",
                    "--output", str(report), "--threads", "1", "--quiet"]) == 0  # fmt: skip
    got = json.loads(report.read_text())["per_example"]
    tok = load_tokenizer(smollm2_dir)
    want = []
    for row in load_rows(data):
        messages, completion = sft_parts(row)
        ids, mask = trl_tokenize(tok.hf, messages, completion, conversational=True)
        want.append((completion_loss_reference(smollm2_dir, ids, mask), sum(mask[1:])))
    assert [e["index"] for e in got] == [0, 1, 2, 3]
    assert [e["tokens"] for e in got] == [n for _, n in want]
    for entry, (loss, _) in zip(got, want, strict=True):
        assert entry["loss"] == pytest.approx(loss, rel=1e-5)
    assert len({round(e["loss"], 6) for e in got}) == 4  # four different rows, four numbers


@pytest.mark.parametrize("layer", [7, 30])
def test_extract_is_transformers_hidden_states(
    smollm2_dir: Path, tmp_path: Path, layer: int
) -> None:
    import torch

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in QUESTIONS))
    out = tmp_path / "h.safetensors"
    assert run_cli(["extract", "--model", str(smollm2_dir), "--examples", str(data),
                    "--layer", str(layer), "--pool", "last", "--chat-template", "on",
                    "--precision", "f32", "--batch-size", "2", "--output", str(out),
                    "--threads", "1", "--quiet"]) == 0  # fmt: skip
    hidden = load_file(out)["hidden"]
    tok = load_tokenizer(smollm2_dir)
    hf = reference_model(smollm2_dir)
    assert hidden.shape == (2, 576) and hf.config.num_hidden_layers == 30
    for i, question in enumerate(QUESTIONS):
        ids = tok.prompt_ids([{"role": "user", "content": question}], chat_template=True)
        with torch.no_grad():
            states = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states
        # atol 5e-5: the portable products keep 22 bits of each line's range, and in the padded
        # batch of 2 the pad keys' values enter a value column's range (alone they do not)
        if layer < hf.config.num_hidden_layers:
            want = states[layer][0, -1]
            torch.testing.assert_close(hidden[i], want, rtol=1e-5, atol=5e-5)
        else:
            # transformers' last entry is after the final norm; twinrun's is the stream before it
            with torch.no_grad():
                normed = hf.model.norm(hidden[i])
            torch.testing.assert_close(normed, states[layer][0, -1], rtol=1e-5, atol=5e-5)
            assert not torch.allclose(hidden[i], states[layer][0, -1], atol=1e-2)
