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
        "adapter": "e88afb3c4bb738f99c6bce28d4a843d195a3cd1ed46cf33c09a65a4b2bdb6f08",
        "diag": "7700e3f34a55fc1bb92018b208091d3d9fd6f9da4c99095dbe2916a0ff4c2c2f",
    },
    "dpo": {
        "adapter": "b978b1e823db1d8bd62b3767d66e7085c8779c4e538243bccf69dabf0fa06723",
        "diag": "aa1eafd429f4f1ef23582f9f969d1fb8debb68bea3b602afe55a32e32d2fcd9c",
    },
    "reward": {
        "adapter": "3dfecf9421b3e4df7858bac5b6a1762b2669fe715e879c26d43bc3fdb8e84095",
        "diag": "9f941cdfcbaff6e1ec92cc3667918b65c0497b481569473e0ba1c44149c22858",
        "head": "79bd34522452ea3119ab5925d12696a52849f4ec073b42748cb8135f9e09758b",
    },
    "grpo": {
        "adapter": "f2bf09ba61eed8c6b23180dc1ddf71f8b67c9f2aad3d50baa568df22bbd5a44c",
        "diag": "a1b39bae1c38290ea3bcc293db0885fc90b5978024283d4743977dee4ff2b127",
    },
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
