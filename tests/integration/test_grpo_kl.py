"""`--kl-beta` (TRL's GRPO `beta`): each active token's loss gains `beta * k3`, the k3 estimate
of KL(policy || reference) with the reference the base (adapter off) — hand-computed here; the
setting is recorded and in the optimizer contract, changes the update once the adapter has
moved, reproduces, and a captured step with the term replays bit for bit (the replay runs the
reference forward again from the same model)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import torch

from testkit.captures import Capture, grpo_source, init_adapter, run_config
from testkit.toy_runs import SHAPED_MODULE, run_args, write_examples
from twinrun.cli.main import run_cli
from twinrun.objectives.grpo import grpo_loss


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_kl_term_is_beta_times_k3_per_active_token() -> None:
    logp = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]], dtype=torch.float64)
    logp.requires_grad_(True)
    ref = torch.tensor([[math.log(0.25), math.log(0.25), 5.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])  # the third token is not active
    zero_adv = torch.zeros(1, dtype=torch.float64)  # the surrogate is 0: the loss is the KL
    out = grpo_loss(logp, logp.detach(), zero_adv, mask, 2, 0.2, None, (0.1, ref))
    # token 1: gap = ln 0.25 - ln 0.5 = -ln 2, k3 = 0.5 + ln 2 - 1; token 2: gap 0, k3 0
    assert math.isclose(float(out.loss.detach()), 0.1 * (math.log(2) - 0.5) / 2, rel_tol=1e-15)
    out.loss.backward()
    # d/dlogp of beta * (exp(ref - logp) - (ref - logp) - 1) = beta * (1 - exp(ref - logp))
    assert logp.grad is not None
    assert torch.allclose(logp.grad, torch.tensor([[0.1 * 0.5 / 2, 0.0, 0.0]], dtype=torch.float64))
    plain = grpo_loss(logp.detach(), logp.detach(), zero_adv, mask, 2, 0.2)
    assert float(plain.loss) == 0.0


def cli_run(tmp_path: Path, toy_model_dir: Path, name: str, *extra: str) -> Path:
    data = write_examples(tmp_path / "data")
    out = tmp_path / name
    assert run_cli(run_args("grpo", toy_model_dir, data["grpo"], out, *extra)) == 0
    return out


def test_the_kl_term_is_recorded_changes_the_update_and_reproduces(
    tmp_path: Path, toy_model_dir: Path
) -> None:
    on = cli_run(tmp_path, toy_model_dir, "on", "--kl-beta", "0.5")
    again = cli_run(tmp_path, toy_model_dir, "again", "--kl-beta", "0.5")
    off = cli_run(tmp_path, toy_model_dir, "off")
    final = "adapter_model.safetensors"
    assert sha(on / final) == sha(again / final)
    assert sha(on / final) != sha(off / final)  # from step 1 on the policy is off the reference
    assert json.loads((on / "twinrun.json").read_text())["train"]["kl_beta"] == 0.5
    assert "kl_beta" not in json.loads((off / "twinrun.json").read_text())["train"]


def test_a_captured_step_with_the_kl_term_replays_bitwise(
    tmp_path: Path, toy_model_dir: Path
) -> None:
    data = write_examples(tmp_path / "data")
    init = init_adapter(tmp_path / "init", toy_model_dir, seed=5)
    doc = grpo_source(toy_model_dir, data["grpo"], f"{SHAPED_MODULE}:make", init, tmp_path / "src")
    doc["grpo"]["kl_beta"] = 0.5
    assert run_config(tmp_path / "src.toml", doc) == 0
    cap = Capture(doc, tmp_path / "src", 0)
    manifest = json.loads(cap.manifest.read_text())
    assert manifest["optimizer_contract"]["values"]["grpo.kl_beta"] == 0.5
    assert run_config(tmp_path / "rep.toml", cap.replay_config(tmp_path / "rep")) == 0
    final = "final/adapter_model.safetensors"
    assert sha(tmp_path / "rep" / final) == sha(cap.out / final)
    without = cap.replay_config(tmp_path / "bare")
    del without["grpo"]["kl_beta"]  # a replay without the term is refused by the contract
    assert run_config(tmp_path / "bare.toml", without) != 0
    assert not (tmp_path / "bare").exists()
