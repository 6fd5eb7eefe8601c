"""The bytes of a short run of every objective on the toy model, pinned as literal SHA256s.

A refactor of the training step must keep every one of them. When a change is meant to move the
bytes (a new model implementation, new tokenization), re-pin: run this module, and copy the
"got" values it reports into PINNED below.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.toy_runs import OBJECTIVES, run_args, sha256_of, write_examples
from twinrun.cli.main import run_cli

FILES = {
    "adapter": "adapter_model.safetensors",
    "diag": "diag.jsonl",
    "head": "reward_head.safetensors",
}
PINNED: dict[str, dict[str, str]] = {
    "sft": {
        "adapter": "85ddfb6769e46d542f6a007be950f2c65c201f36193a0f43f5a80e9ee48e1894",
        "diag": "bd569031dac56f2abe208c965d4f4a9f03bc2e0792f07a2c0df4f84e9a08e83d",
    },
    "dpo": {
        "adapter": "921d22dc4ec5b2420ceb83228441ddf521e5e3dd3e47ae954abd6b7a143a90c5",
        "diag": "94a0be08ef3a651ad6b2865c4504857711fe3700a2a0ef7139ffada6d9344be2",
    },
    "reward": {
        "adapter": "6d2efc3593348e5af0d921db1dad327b852fc0b53bc4521caa980b60d31f8884",
        "diag": "4fa8851871bd1c29e6dab577793dd6d960cc47bff20c6559b1acab61c505b974",
        "head": "79ad729d083354c5f81d8e22222fe46a0f073724ade10ee97dcbbe01dc867d23",
    },
    "grpo": {
        "adapter": "9ee04aa4abd638a22025e2898305aa2fdd65c38b767dc5aa4a661ed7c3a0e24a",
        "diag": "216faf2a6f6076216e418313a800a08b2ded5a23ffffef807851b6c2644696d4",
    },
}
# GRPO with --rollout-block 1 (each prompt group decoded alone, as every GRPO run was before
# block decoding): the bytes pinned then, unchanged — a block of one prompt is exactly the
# per-group decode.
PER_GROUP_GRPO = {
    "adapter": "9d401b2b1947d100df93b6c9aadb4c4b6213f19046f0c44858b62e49926992bb",
    "diag": "b55d0731dbdca4cbfcb8e3d9dae318ba889bbe1109e243140573b5c7af84f35b",
}


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_pinned_bytes(
    tmp_path: Path, toy_model_dir: Path, objective: str, capsys: pytest.CaptureFixture[str]
) -> None:
    examples = write_examples(tmp_path / "data")[objective]
    out = tmp_path / "run"
    assert run_cli(run_args(objective, toy_model_dir, examples, out, "--diag")) == 0
    got = {key: sha256_of(out / FILES[key]) for key in PINNED[objective]}
    changed = {name: (PINNED[objective][name], h) for name, h in got.items()
               if h != PINNED[objective][name]}  # fmt: skip
    report = "; ".join(f"{name}: pinned {want or '(none)'} got {h}" for name, (want, h) in
                       changed.items())  # fmt: skip
    assert not changed, (
        f"{objective} run bytes changed ({report}). If the change is on purpose, copy the "
        "'got' values into PINNED in tests/integration/test_pinned_bytes.py"
    )


def test_grpo_rollout_block_of_one_keeps_the_per_group_bytes(
    tmp_path: Path, toy_model_dir: Path
) -> None:
    examples = write_examples(tmp_path / "data")["grpo"]
    out = tmp_path / "run"
    args = run_args("grpo", toy_model_dir, examples, out, "--diag", "--rollout-block", "1")
    assert run_cli(args) == 0
    got = {key: sha256_of(out / FILES[key]) for key in PER_GROUP_GRPO}
    assert got == PER_GROUP_GRPO
