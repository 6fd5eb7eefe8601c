"""The bytes of a short run of every objective on the toy model, pinned as literal SHA256s.

A refactor of the training step must keep every one of them. When a change is meant to move the
bytes (a new model implementation, new tokenization), re-pin: run this module, and copy the
"got" values it reports into PINNED below.

The values are keyed by platform fingerprint. The suite runs with the portable CPU kernels, so on
every x86-64 machine the key is `cpu:x86_64-portable-AVX2` and one set of values must hold on an
Intel AVX-512 and an AMD AVX2 machine alike (these were written on an AMD EPYC, AVX2); a
platform with no values of its own skips, naming its key, and never fails for being elsewhere.
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
BY_PLATFORM: dict[str, dict[str, dict[str, str]]] = {"cpu:x86_64-portable-AVX2": {
    "sft": {
        "adapter": "a41241ab401c761723f5d5569fc20c16953ee73106b9ba08f7ce62957f06cf90",
        "diag": "b4d5af0919df8dea2a2b92e9b5b4873f5b0fb9da5d5129127eee3cf31ebaf258",
    },
    "dpo": {
        "adapter": "178746acfdf0df1e24509cb71fb3f776186e6830dc8cf910e47663edff5c7071",
        "diag": "a9b07485faebd61e96a3f0a8fde7e3b0089e886203ffb40b970bde2cd2a90a55",
    },
    "reward": {
        "adapter": "d04a7453bbea4c98ad6346cd9fb0165b00bf3ebf090cf80d1b959d93a54d3b08",
        "diag": "fcd271a13906e02e7e88adfdc59f77cbd8030ae1c97b4490ae157a1ed55be39a",
        "head": "7d37e7b5570221e2e2668e530531289075ebb7fb8e545aebec735629367ee53e",
    },
    "grpo": {  # diag re-pinned when GRPO rows gained observation leaves; the adapter held
        "adapter": "94e603d825a1d09237a28a1565a75821f0762d923266516252bb62d1d44314da",
        "diag": "2e96507a57be371a6a87cf91c9a44e4f7437d007c8c5fe498125856410457970",
    },
}}  # fmt: skip
PINNED = BY_PLATFORM.get(PLATFORM, {})
needs_pins = pytest.mark.skipif(
    not PINNED, reason=f"no pinned bytes for platform {PLATFORM} (pinned: {sorted(BY_PLATFORM)})"
)
# GRPO with --rollout-block 1 (each prompt group decoded alone, as every GRPO run was before
# block decoding): a block of one prompt is exactly the per-group decode, so these are the
# per-group bytes (re-pinned with the rest for the portable kernels).
PER_GROUP_GRPO_BY_PLATFORM: dict[str, dict[str, str]] = {"cpu:x86_64-portable-AVX2": {
    "adapter": "3d833c5fc4b324c831c55bbe03cb956977347f0296fb15684627a63205ee5736",
    "diag": "f6c5120af05243ccfba8a71f021eb819e9662045f74f54e2ab2a0e8927a01142",
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
