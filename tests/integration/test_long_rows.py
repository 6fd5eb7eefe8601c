"""Long rows for every objective: rows longer than one head chunk (`HEAD_CHUNK` positions) run
the output head and loss by position chunks, so no [B, T, V] tensor is kept for the backward
(SFT with eager attention, DPO, IPO, reward, GRPO's update) or made at all (evaluation, the
rollout prefill); and the short-row bytes of the objectives test_pinned_bytes.py does not pin
(IPO, evaluation) are pinned here.

The probes: `torch.autograd.graph.saved_tensors_hooks` records the shape of every tensor a
training run keeps for its backward (a chunk's logits are kept by its checkpoint, never here);
a `TorchDispatchMode` records the shape of every tensor an op makes (evaluation and sampling run
without a graph). A vocabulary-wide tensor of more than `HEAD_CHUNK` positions per row is one
whole-row logits copy.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from testkit.toy_runs import SHAPED_MODULE, run_args, sha256_of, write_examples
from twinrun.cli.main import run_cli
from twinrun.golden.fingerprint import fingerprint
from twinrun.model.toy import VOCAB_SIZE

PROMPT = "Tell me about the river and the stone. " * 12  # 468 bytes: one token each
COMPLETION = "The river runs past the stone, and the cloud. " * 6  # 282 bytes
LONG = 720  # tokens per row at least (more than one head chunk)
HIDDEN = 64  # the toy checkpoint's hidden size


@contextmanager
def kept_shapes() -> Iterator[list[tuple[int, ...]]]:
    """The shapes of the floating tensors autograd keeps for a backward while open."""
    shapes: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield shapes


@contextmanager
def made_shapes() -> Iterator[list[tuple[int, ...]]]:
    """The shapes of every floating tensor an op returns while open (the portable kernels'
    integer digit planes of the head's weight are not logits)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    shapes: list[tuple[int, ...]] = []

    class Made(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.is_floating_point():  # not digit planes
                    shapes.append(tuple(t.shape))
            return out

    with Made():
        yield shapes


def vocabulary_positions(shapes: list[tuple[int, ...]]) -> int:
    """The most positions one vocabulary-wide tensor of `shapes` holds (0: none). The head's
    weight transposed ([H, V], an operand of the portable kernels' product) is not logits."""
    wide = [s for s in shapes if s and s[-1] == VOCAB_SIZE and s[-2:] != (HIDDEN, VOCAB_SIZE)]
    return max((int(torch.Size(s).numel()) // VOCAB_SIZE for s in wide), default=0)


def hidden_positions(shapes: list[tuple[int, ...]]) -> int:
    """The most positions one hidden-state tensor of `shapes` holds: how long the rows were."""
    return max((int(torch.Size(s).numel()) // HIDDEN for s in shapes if s and s[-1] == HIDDEN),
               default=0)  # fmt: skip


@pytest.fixture(scope="module")
def long_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("long")
    short = write_examples(folder)  # the shaped GRPO environment on sys.path
    sft = folder / "sft-long.jsonl"
    sft.write_text("".join(json.dumps({"prompt": f"{i} {PROMPT}", "completion": COMPLETION})
                           + "\n" for i in range(2)))  # fmt: skip
    pairs = folder / "pairs-long.jsonl"
    pairs.write_text(json.dumps({"prompt": PROMPT, "chosen": COMPLETION,
                                 "rejected": COMPLETION[::-1]}) + "\n")  # fmt: skip
    prompts = folder / "prompts-long.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPT * 2, "answer": "3"}) + "\n")
    return {"sft": sft, "dpo": pairs, "ipo": pairs, "simpo": pairs, "reward": pairs,
            "grpo": prompts, "short_pairs": short["dpo"], "short_sft": short["sft"]}  # fmt: skip


def long_run_args(objective: str, model: Path, data: dict[str, Path], out: Path) -> list[str]:
    """One step over the long rows: sft a forward of both rows, the pair objectives one pair."""
    args = run_args("dpo" if objective in ("ipo", "simpo") else objective, model, data[objective],
                    out)  # fmt: skip
    args[1] = objective
    args[args.index("--accumulation") + 1] = "1"
    args[args.index("--warmup-steps") + 1] = "0"
    if objective == "ipo":
        args += ["--beta", "0.1"]
    if objective == "simpo":
        args += ["--gamma", "0.5"]
    return args


@pytest.mark.parametrize("objective", ["sft", "dpo", "ipo", "simpo", "reward"])
def test_a_long_row_keeps_no_whole_logits_for_the_backward(
    tmp_path: Path, toy_model_dir: Path, long_data: dict[str, Path], objective: str
) -> None:
    from twinrun.model.head_chunks import HEAD_CHUNK

    with kept_shapes() as shapes:
        assert run_cli(long_run_args(objective, toy_model_dir, long_data, tmp_path / "o")) == 0
    assert hidden_positions(shapes) >= LONG  # the rows were long: T x hidden states were kept
    # the chunks' logits are kept by their checkpoints and made again in the backward: none here
    assert vocabulary_positions(shapes) == 0, sorted({s for s in shapes if s[-1] == VOCAB_SIZE})
    assert HEAD_CHUNK < LONG


def test_a_long_update_forward_keeps_no_whole_logits_and_gives_the_whole_bits(
    toy_model_dir: Path, portable: None
) -> None:
    """GRPO's update forward with more kept positions than one head chunk: the float64
    log-probs at temperature and their gradient are, bit for bit, those of the kept positions'
    whole logits (`logits_at`), and autograd keeps no vocabulary-wide tensor."""
    from twinrun.model.build import FreshLora, build_model
    from twinrun.model.head_chunks import HEAD_CHUNK
    from twinrun.objectives.grpo_logprobs import kept_at, rows_logprobs
    from twinrun.train.recipes.grpo import policy_logprobs

    model = build_model(toy_model_dir, precision="f32", device="cpu",
                        lora=FreshLora(rank=4, alpha=8, seed=1))  # fmt: skip
    lora = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():  # B nonzero, so the adapter changes the logits
        for p in lora:
            p.add_(0.01 * torch.sin(torch.arange(p.numel(), dtype=p.dtype)).view(p.shape))
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, VOCAB_SIZE, (2, LONG), generator=g)
    attn = torch.ones_like(ids)
    attn[1, LONG - 40 :] = 0
    kept = torch.zeros(2, LONG - 1, dtype=torch.bool)
    kept[0, 20:] = True
    kept[1, 200 : LONG - 41] = True
    assert int(kept.sum()) > 2 * HEAD_CHUNK and int(kept.sum()) % HEAD_CHUNK
    s = SimpleNamespace(model=model)
    weights = torch.rand(kept.shape, generator=g, dtype=torch.float64)

    with kept_shapes() as shapes:
        got, logits = policy_logprobs(s, ids, attn, kept, 0.7)  # type: ignore[arg-type]
    (got * weights).sum().backward()
    got_grads = [p.grad.clone() for p in lora]  # type: ignore[union-attr]
    model.hf.zero_grad()
    rows, _ = model.logits_at(ids, attn, kept_at(kept))
    want = rows_logprobs(rows, ids, kept, 0.7)
    (want * weights).sum().backward()

    assert logits == [] and vocabulary_positions(shapes) == 0
    assert hidden_positions(shapes) >= 2 * LONG
    assert torch.equal(got.view(torch.int64), want.view(torch.int64))
    assert torch.equal(got[~kept], torch.zeros(int((~kept).sum()), dtype=torch.float64))
    for a, p in zip(got_grads, lora, strict=True):
        assert p.grad is not None and torch.equal(a, p.grad)


def test_long_evaluation_and_a_long_prompt_rollout_make_no_whole_logits(
    tmp_path: Path, toy_model_dir: Path, long_data: dict[str, Path]
) -> None:
    """`tune evaluate` on long rows (two a forward) makes at most one chunk's logits per row;
    a GRPO run whose prompt is longer than a chunk prefills it with the last position's logits
    only, and its update (3 kept tokens a row) runs the head on the kept positions."""
    from twinrun.model.head_chunks import HEAD_CHUNK

    adapter = tmp_path / "sft"
    assert run_cli(long_run_args("sft", toy_model_dir, long_data, adapter)) == 0
    report = tmp_path / "eval.json"
    with made_shapes() as shapes:
        assert run_cli(["tune", "evaluate", "--model", str(toy_model_dir), "--adapter",
                        str(adapter), "--examples", str(long_data["sft"]), "--chat-template",
                        "on", "--precision", "f32", "--batch-size", "2", "--output", str(report),
                        "--threads", "1", "--quiet"]) == 0  # fmt: skip
    assert hidden_positions(shapes) >= 2 * LONG
    assert 0 < vocabulary_positions(shapes) <= 2 * HEAD_CHUNK
    assert json.loads(report.read_text())["tokens"] > 0

    args = run_args("grpo", toy_model_dir, long_data["grpo"], tmp_path / "grpo")
    args[args.index("--prompts-per-step") + 1] = "1"
    args[args.index("--steps") + 1] = "1"
    args[args.index("--warmup-steps") + 1] = "0"
    args[args.index("--env") + 1] = f"{SHAPED_MODULE}:make"
    args += ["--kl-beta", "0.05"]
    with made_shapes() as shapes:
        assert run_cli(args) == 0
    assert hidden_positions(shapes) >= LONG
    assert 0 < vocabulary_positions(shapes) <= 4 * 3  # the update's kept rows; a prefill: 1


# IPO and evaluation at short rows (the pinned objectives are in test_pinned_bytes.py): the bytes
# they wrote before the head ran by chunks, with the portable kernels (the diag files' as the
# diag format v2 writes them: XXH3-128 leaf digests).
SHORT_BY_PLATFORM: dict[str, dict[str, str]] = {"cpu:x86_64-portable-digits": {
    "ipo.adapter": "229f583d25a4fabc4f4ff896e09d27ad5c6fe18efffb8f438455072482556878",
    "ipo.diag": "0f714c44d578e8544205426dc64efcdf9cc9160336798d27556c76db59e53827",
    "eval.per_example": "e4431afda85488f968763a5fd487dbd0faa3fcc6cb21d904aa72f69deebba235",
    "eval.diag": "5a8d8ecd4a115391bed8dd47e5fc434b0d9847054cf3d891fe7fb7e731d2e1b0",
}}  # fmt: skip
SHORT = SHORT_BY_PLATFORM.get(fingerprint()["device"], {})


@pytest.mark.skipif(not SHORT, reason=f"no pinned bytes for {fingerprint()['device']}")
def test_short_ipo_and_evaluation_bytes_are_unchanged(
    tmp_path: Path, toy_model_dir: Path, long_data: dict[str, Path]
) -> None:
    ipo = tmp_path / "ipo"
    args = run_args("dpo", toy_model_dir, long_data["short_pairs"], ipo, "--diag")
    args[1] = "ipo"
    assert run_cli(args) == 0
    report, diag = tmp_path / "eval.json", tmp_path / "eval.diag"
    assert run_cli(["tune", "evaluate", "--model", str(toy_model_dir), "--adapter", str(ipo),
                    "--examples", str(long_data["short_sft"]), "--chat-template", "on",
                    "--precision", "f32", "--batch-size", "3", "--output", str(report),
                    "--threads", "1", "--quiet", "--diag", str(diag)]) == 0  # fmt: skip
    per_example = json.dumps(json.loads(report.read_text())["per_example"]).encode()
    got = {
        "ipo.adapter": sha256_of(ipo / "adapter_model.safetensors"),
        "ipo.diag": sha256_of(ipo / "diag.jsonl"),
        "eval.per_example": hashlib.sha256(per_example).hexdigest(),
        "eval.diag": sha256_of(diag),
    }
    assert got == SHORT, got
