"""The bytes of a short run of every objective on the toy model, pinned as literal SHA256s.

A refactor of the training step must keep every one of them. When a change is meant to move the
bytes (a new model implementation, new tokenization), re-pin: run this module, and copy the
"got" values it reports into PINNED below.

The values are keyed by platform fingerprint. The suite runs with the portable CPU kernels, so on
every x86-64 machine the key is `cpu:x86_64-portable-exact` and one set of values must hold on
an Intel AVX-512 and an AMD AVX2 machine alike (these were written on an Intel Xeon, AVX-512,
once, when the portable mode moved to exact products; the AMD-written values of the mode before
them did not hold on Intel); a platform with no values of its own skips, naming its key, and
never fails for being elsewhere. A failure on another x86-64 machine is a portability bug: do not
re-pin there (tests/integration/test_cpu_emulation.py emulates other CPUs on this one).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.toy_runs import OBJECTIVES, run_args, sha256_of, write_examples
from twinrun.cli.main import run_cli
from twinrun.golden.fingerprint import fingerprint

FILES = {
    "adapter": "adapter_model.safetensors",
    "diag": "diag.jsonl",
    "head": "reward_head.safetensors",
}
PLATFORM = fingerprint()["device"]
BY_PLATFORM: dict[str, dict[str, dict[str, str]]] = {"cpu:x86_64-portable-exact": {
    "sft": {
        "adapter": "3dc3c4719a65b62962c71a8202ca679a02bc6edd11faa4d7468a03c56cbcf7aa",
        "diag": "1dc75c7a4ad3aa223d329ee0efa9834def907f09443473ba1dfaa95d24677231",
    },
    "dpo": {
        "adapter": "b6e110afa5327dd0450eb4ff7d383c5705a137661d37599cd1adeb8f9d69c8c7",
        "diag": "7b52c6ae360b5be689f8f1b0db3b8fd83669d5d4294e4aa9153d126a2f537789",
    },
    "reward": {
        "adapter": "39a5dd3c9d7b5ad63112031b82db4845274da128b2e6e4f92479fb1889deeff6",
        "diag": "60052354baa69fecc2d53d2740f8b7c692bda6551afc4485bc906f66b6c5961e",
        "head": "004bceaa926a87fc3a7b1392c3c9877a48a4dd231a7a67c002a6f072a60709f4",
    },
    "grpo": {
        "adapter": "85a705c9250b0cd842b03a61fe091eff098e672fbd8d24dff6309c3f91ab3b5f",
        "diag": "dfde80bd1c16ecf5b015f669d2bd8873a0c6fc427669f8afe44bfbe23191dc28",
    },
}}  # fmt: skip
PINNED = BY_PLATFORM.get(PLATFORM, {})
needs_pins = pytest.mark.skipif(
    not PINNED, reason=f"no pinned bytes for platform {PLATFORM} (pinned: {sorted(BY_PLATFORM)})"
)
# GRPO with --rollout-block 1 (each prompt group decoded alone, as every GRPO run was before
# block decoding): a block of one prompt is exactly the per-group decode, so these are the
# per-group bytes (re-pinned with the rest for the exact products).
PER_GROUP_GRPO_BY_PLATFORM: dict[str, dict[str, str]] = {"cpu:x86_64-portable-exact": {
    "adapter": "85a705c9250b0cd842b03a61fe091eff098e672fbd8d24dff6309c3f91ab3b5f",
    "diag": "dfde80bd1c16ecf5b015f669d2bd8873a0c6fc427669f8afe44bfbe23191dc28",
}}  # fmt: skip


@needs_pins
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


@needs_pins
def test_grpo_rollout_block_of_one_keeps_the_per_group_bytes(
    tmp_path: Path, toy_model_dir: Path
) -> None:
    examples = write_examples(tmp_path / "data")["grpo"]
    out = tmp_path / "run"
    args = run_args("grpo", toy_model_dir, examples, out, "--diag", "--rollout-block", "1")
    assert run_cli(args) == 0
    want = PER_GROUP_GRPO_BY_PLATFORM[PLATFORM]
    got = {key: sha256_of(out / FILES[key]) for key in want}
    assert got == want
