"""The bytes of a short run of every objective on the toy model, pinned as literal SHA256s.

A refactor of the training step must keep every one of them. When a change is meant to move the
bytes (a new model implementation, new tokenization), re-pin: run this module, and copy the
"got" values it reports into PINNED below.

The values are keyed by platform fingerprint. The suite runs with the portable CPU kernels, so on
every x86-64 machine the key is `cpu:x86_64-portable-digits` and one set of values must hold on
an Intel AVX-512 and an AMD AVX2 machine alike (these were written on an AMD EPYC, AVX-512, once,
when the portable mode's products moved to int8 digit planes; the values of the float64-slice
scheme before them were written on an Intel Xeon and held on AMD); a platform with no values of
its own skips, naming its key, and never fails for being elsewhere. A failure on another x86-64
machine is a portability bug: do not re-pin there (tests/integration/test_cpu_emulation.py
emulates other CPUs on this one).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.toy_runs import OBJECTIVES, run_args, sha256_of, write_examples
from twinrun.cli.main import run_cli
from twinrun.golden.fingerprint import fingerprint

FILES = {
    "adapter": "adapter_model.safetensors",
    "diag": "diag.jsonl",
    "head": "reward_head.safetensors",
}
PLATFORM = fingerprint()["device"]
BY_PLATFORM: dict[str, dict[str, dict[str, str]]] = {"cpu:x86_64-portable-digits": {
    "sft": {
        "adapter": "09d73b274fd307e7d606dabd2ba238d4b886280713994ac336bd64cc614db057",
        "diag": "e940422f24cefd9e87945c95193232390fac57627320aba1eba92ef3e5e8a741",
    },
    "dpo": {
        "adapter": "eacd91d481559137a940d9e09b9a833b3aa5b2d1a79fdb7b4a0e17a6ee9cbce6",
        "diag": "9fdb93be0898efbb4aad61fcf14bab0c928ae1d45c1ab41f44e5abe28425ba1b",
    },
    "reward": {
        "adapter": "a65a48051130a69046b16214e8c7205d67b57e81af08ad812b2fd612b2e027e5",
        "diag": "8e2cc90a89d525ad3ac1bbf4692c71689e0478901d4ae6bf4fc10628b6ee9232",
        "head": "e8d5ef97efc7959c90e3d6209452125df093b9bee98e5743326af26b0ec04b5e",
    },
    "grpo": {
        "adapter": "3732b25fb209fb6e0a596a69bf0e290d10ac64d964127538989e88074565bf96",
        "diag": "fc48f82eb700698140a393088015265bf94e93d4368f2b23b3839902dd2b6bc5",
    },
}}  # fmt: skip
PINNED = BY_PLATFORM.get(PLATFORM, {})
needs_pins = pytest.mark.skipif(
    not PINNED, reason=f"no pinned bytes for platform {PLATFORM} (pinned: {sorted(BY_PLATFORM)})"
)
# GRPO with --rollout-block 1 (each prompt group decoded alone, as every GRPO run was before
# block decoding): a block of one prompt is exactly the per-group decode, so these are the
# per-group bytes (re-pinned with the rest for the exact products).
PER_GROUP_GRPO_BY_PLATFORM: dict[str, dict[str, str]] = {"cpu:x86_64-portable-digits": {
    "adapter": "3732b25fb209fb6e0a596a69bf0e290d10ac64d964127538989e88074565bf96",
    "diag": "fc48f82eb700698140a393088015265bf94e93d4368f2b23b3839902dd2b6bc5",
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
