"""`twinrun tune grpo` end to end on the toy model: reproducibility, environments, replay."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from twinrun.cli.main import run_cli

PLUGIN = '''
class Shaped:
    """Reward that varies with the sampled bytes, so advantages are not all zero."""

    def __init__(self, modulus=5, bonus=0.0):
        self.modulus = modulus
        self.bonus = bonus

    def prompt(self, row, rng):
        return row["prompt"]

    def reward(self, row, completion):
        return float(len(completion.encode("utf-8")) % self.modulus) + self.bonus


def make(**args):
    return Shaped(**args)
'''


@pytest.fixture(scope="module")
def arith(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("grpo") / "arith.jsonl"
    rows = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(1, 5)
            for b in range(1, 3)]  # fmt: skip
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.fixture(scope="module")
def plugin_module(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("plugin")
    (d / "twinrun_test_shaped_env.py").write_text(PLUGIN)
    import sys

    sys.path.insert(0, str(d))
    return "twinrun_test_shaped_env:make"


def grpo_args(model: Path, examples: Path, out: Path, seed: int, *extra: str) -> list[str]:
    return [
        "tune", "grpo", "--model", str(model), "--examples", str(examples), "--output", str(out),
        "--seed", str(seed), "--steps", "3", "--prompts-per-step", "2", "--group-size", "4",
        "--batch-size", "4", "--max-new-tokens", "4", "--temperature", "1.0",
        "--clip-eps", "0.2", "--advantage-clip", "5", "--token-cap", "3",
        "--learning-rate", "5e-2", "--warmup-steps", "0",
        "--lr-schedule", "cosine", "--lora-rank", "4", "--lora-alpha", "8",
        "--precision", "f32", "--chat-template", "on", "--quiet", "--threads", "1", "--diag",
        *extra,
    ]  # fmt: skip


def run(args: list[str]) -> None:
    assert run_cli(args) == 0


def same_files(a: Path, b: Path, *names: str) -> bool:
    return all((a / n).read_bytes() == (b / n).read_bytes() for n in names)


def test_arithmetic_same_seed_same_bytes_other_seed_differs(
    tmp_path: Path, toy_model_dir: Path, arith: Path
) -> None:
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        run(grpo_args(toy_model_dir, arith, tmp_path / name, seed, "--env", "arithmetic"))
    assert same_files(tmp_path / "a", tmp_path / "b", "adapter_model.safetensors", "diag.jsonl")
    assert not same_files(tmp_path / "a", tmp_path / "c", "adapter_model.safetensors")
    rows = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    for key in (
        "reward_mean",
        "reward_std",
        "zero_advantage_group_fraction",
        "active_tokens",
        "clip_fraction",
        "rollout_s",
        "update_s",
    ):
        assert key in rows[0], key
    assert rows[0]["rows"] == 8 and rows[0]["active_tokens"] <= 8 * 3  # token cap 3


def test_clock_same_seed_differs_at_the_observation(
    tmp_path: Path, toy_model_dir: Path, arith: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("a", "b"):
        run(grpo_args(toy_model_dir, arith, tmp_path / name, 1, "--env", "clock"))
    capsys.readouterr()
    # the observation leaf is the SHA256 of the prompt: it parts without --bitwise too, before
    # the tokens it changed
    assert run_cli(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FIRST_DIVERGENCE: step=0 leaf=observation.prompt_0.turn_0 ")
    assert "the observation of prompt 0 changed; the environment's prompt differs" in out


def test_plugin_environment_trains_reproducibly(
    tmp_path: Path,
    toy_model_dir: Path,
    arith: Path,
    plugin_module: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    extra = ("--env", plugin_module, "--env-arg", "modulus=3", "--env-arg", "bonus=0.5",
             "--replay", "per", "--replay-capacity", "16", "--replay-alpha", "0.6",
             "--replay-beta", "0.4", "--replay-fraction", "0.5")  # fmt: skip
    for name in ("a", "b"):
        run(grpo_args(toy_model_dir, arith, tmp_path / name, 1, *extra))
    a, b = tmp_path / "a", tmp_path / "b"
    assert same_files(a, b, "adapter_model.safetensors", "diag.jsonl", "adapter_config.json")
    rows = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    assert any(r["loss"] != 0.0 for r in rows)  # shaped rewards give real updates
    assert rows[0]["replayed_rows"] == 0 and rows[1]["replayed_rows"] == 4
    diag = [json.loads(x) for x in (a / "diag.jsonl").read_text().splitlines()]
    leaves = list(diag[1]["checksums"])
    assert leaves[:8] == ["batch.sample_indices", "observation.prompt_0.turn_0",
                          "observation.prompt_1.turn_0", "replay.priorities", "replay.draws",
                          "replay.sample_indices", "replay.weights", "rollout.tokens"]  # fmt: skip
    side = json.loads((a / "twinrun.json").read_text())
    assert side["train"]["env"] == plugin_module
    assert side["train"]["env_args"] == {"modulus": "<redacted>", "bonus": "<redacted>"}
    assert side["train"]["replay_alpha"] == 0.6
    # the zero adapter B means the initial adapter differs from the trained one
    assert run_cli(["diff", str(a), str(b), "--bitwise"]) == 0
    capsys.readouterr()


PER = ("--env", "arithmetic", "--replay", "per", "--replay-capacity", "16",
       "--replay-alpha", "1", "--replay-beta", "1", "--replay-fraction", "0.5")  # fmt: skip


def test_per_leaves_are_the_buffer_and_its_keyed_draws(
    tmp_path: Path, toy_model_dir: Path, arith: Path
) -> None:
    """Step 1 draws 4 rollouts from the 8 of step 0: the priorities leaf is their
    (|A| + eps) ** 1, the draws leaf the keyed uniforms."""
    from twinrun.core.rng import stream
    from twinrun.diag.checksum import sumsq
    from twinrun.rl.prioritized import DEFAULT_PRIORITY_EPS

    run(grpo_args(toy_model_dir, arith, tmp_path / "a", 1, *PER))
    diag = [json.loads(x) for x in (tmp_path / "a" / "diag.jsonl").read_text().splitlines()]
    assert diag[0]["checksums"]["replay.priorities"] == 0.0  # empty before step 0
    # step 0's advantages, as recorded, are what the buffer holds at step 1
    import torch

    uniforms = torch.tensor([stream(1, "replay", 1, i).uniform() for i in range(4)],
                            dtype=torch.float64)  # fmt: skip
    assert diag[1]["checksums"]["replay.draws"] == sumsq(uniforms)
    adv0 = diag[0]["checksums"]["rollout.advantages"]
    # sum of (|A| + eps)^2 = sum A^2 + 2 eps sum |A| + 8 eps^2: equal to sumsq(A) to ~1e-6
    assert diag[1]["checksums"]["replay.priorities"] == pytest.approx(adv0, abs=1e-4)
    assert DEFAULT_PRIORITY_EPS == 1e-6


@pytest.mark.parametrize("fault", ["replay@1", "replay@2"])
def test_a_fault_inside_per_is_localised_to_its_draws(
    tmp_path: Path, toy_model_dir: Path, arith: Path, capsys: pytest.CaptureFixture[str],
    fault: str,
) -> None:  # fmt: skip
    run(grpo_args(toy_model_dir, arith, tmp_path / "a", 1, *PER))
    run(grpo_args(toy_model_dir, arith, tmp_path / "b", 1, *PER, "--inject", fault))
    capsys.readouterr()
    assert run_cli(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    step = int(fault.split("@")[1])
    assert (report["first"]["step"], report["first"]["leaf"]) == (step, "replay.draws")
    assert report["table"][0]["leaves"][0] == "replay.draws"
    assert "replay.priorities" not in report["table"][0]["leaves"]  # the buffer was the same
    assert report["advice"]["leaf"] == "replay.draws"


def test_a_replay_fault_needs_per(
    tmp_path: Path, toy_model_dir: Path, arith: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = grpo_args(toy_model_dir, arith, tmp_path / "a", 1, "--env", "arithmetic",
                     "--inject", "replay@1")  # fmt: skip
    capsys.readouterr()
    assert run_cli(args) == 2
    assert "--inject replay@STEP needs --replay per" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_observation_fault_localised(
    tmp_path: Path, toy_model_dir: Path, arith: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(grpo_args(toy_model_dir, arith, tmp_path / "a", 1, "--env", "arithmetic"))
    run(
        grpo_args(
            toy_model_dir,
            arith,
            tmp_path / "b",
            1,
            "--env",
            "arithmetic",
            "--inject",
            "observation@1",
        )
    )
    capsys.readouterr()
    assert run_cli(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--bitwise"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [
        "RECORDED_DIFFERENCES: 1",
        '  train.inject: run_A=[] run_B=["observation@1"] (setting)',
    ]  # the sidecars record the planted fault
    assert lines[2].startswith("FIRST_DIVERGENCE: step=1 leaf=observation.prompt_0.turn_0 ")


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (("--env", "no_such_module_xyz:make"), "no_such_module_xyz"),
        (("--env", "arithmetic", "--group-size", "1"), "--group-size must be >= 2"),
        (
            ("--env", "arithmetic", "--epochs", "2"),
            "No such option '--epochs': a flag of twinrun tune sft, dpo, ipo, simpo, reward, "
            "not of tune",
        ),
        (("--env", "arithmetic", "--replay", "per"), "--replay per needs"),
        (("--env", "arithmetic", "--rollout-block", "0"), "--rollout-block must be >= 1, got 0"),
        (
            ("--env", "arithmetic", "--rollout-block", "x"),
            "Invalid value for '--rollout-block': needs an integer",
        ),
    ],
)
def test_grpo_config_errors(
    tmp_path: Path,
    toy_model_dir: Path,
    arith: Path,
    capsys: pytest.CaptureFixture[str],
    extra: tuple[str, ...],
    match: str,
) -> None:
    args = grpo_args(toy_model_dir, arith, tmp_path / "o", 1, *extra)
    if "--group-size" in extra:  # the later flag wins in click; drop the default one
        i = args.index("--group-size")
        del args[i : i + 2]
    assert run_cli(args) != 0
    assert match in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def sampling_session(model: Path, rollout_block: int) -> types.SimpleNamespace:
    from twinrun.config.resolved import validate
    from twinrun.config.run import RunConfig
    from twinrun.model.build import load_causal_lm
    from twinrun.model.tokens import load_tokenizer
    from twinrun.train.step.faults import Faults

    run = validate(RunConfig(
        objective="grpo", seed=3, group_size=3, max_new_tokens=5, temperature=1.0,
        chat_template="on", rollout_block=rollout_block, model=str(model), examples="e",
        output="o", batch_size=3, learning_rate=0.1, warmup_steps=0, lr_schedule="constant",
        lora_rank=2, lora_alpha=4.0, precision="f32", steps=1, prompts_per_step=4,
        clip_eps=0.2, advantage_clip=5.0, token_cap=5, env="arithmetic", threads=1,
    ))  # fmt: skip
    return types.SimpleNamespace(
        run=run, model=load_causal_lm(model), tok=load_tokenizer(model),
        faults=Faults(frozenset()), max_length=2048,
    )  # fmt: skip


def by_example(rollouts: list) -> dict[int, list[tuple[list[int], list[float]]]]:
    out: dict[int, list[tuple[list[int], list[float]]]] = {}
    for r in rollouts:
        out.setdefault(r.example, []).append((r.completion, r.old_logprobs))
    return out


def test_completion_depends_on_its_block_only(toy_model_dir: Path, arith: Path) -> None:
    """With blocks of 2 prompt groups, the completions of the first block are the same bit for
    bit whichever prompts fill the second block; with blocks of 1, a prompt sampled alone equals
    it sampled among 4."""
    from twinrun.data.examples import load_rows
    from twinrun.rl.environments import open_environment
    from twinrun.train.recipes.grpo import GrpoState, sampled_rollouts

    state = GrpoState(rows=load_rows(arith), env=open_environment("arithmetic"),
                      env_name="arithmetic", replay=None)  # fmt: skip
    two = sampling_session(toy_model_dir, 2)
    a = by_example(sampled_rollouts(two, state, 2, [1, 5, 0, 7]))  # type: ignore[arg-type]
    b = by_example(sampled_rollouts(two, state, 2, [1, 5, 2, 3]))  # type: ignore[arg-type]
    assert a[1] == b[1] and a[5] == b[5]
    assert len({tuple(c) for c, _ in a[5]}) > 1  # the group really samples
    one = sampling_session(toy_model_dir, 1)
    alone = by_example(sampled_rollouts(one, state, 2, [5]))  # type: ignore[arg-type]
    among = by_example(sampled_rollouts(one, state, 2, [1, 5, 0, 7]))  # type: ignore[arg-type]
    assert alone[5] == among[5]


@pytest.mark.parametrize("env", ["os:system", "subprocess:getoutput"])
def test_a_shell_command_as_environment_never_runs(
    tmp_path: Path,
    toy_model_dir: Path,
    arith: Path,
    capsys: pytest.CaptureFixture[str],
    env: str,
) -> None:
    """`--env os:system --env-arg 'command=touch F'`: refused (standard library) by tune and by
    explain (which never imports a plugin) — F is never made, nothing is written."""
    from testkit.captures import grpo_source, write_toml

    marker = tmp_path / "F"
    command = f"command=touch {marker}"
    args = grpo_args(toy_model_dir, arith, tmp_path / "o", 1, "--env", env, "--env-arg", command)
    assert run_cli(args) == 2
    err = capsys.readouterr().err
    assert "standard library" in err and len(err.strip().splitlines()) == 1
    assert str(marker) not in err
    doc = grpo_source(toy_model_dir, arith, env, None, tmp_path / "toml-out")
    doc["environment"]["args"] = {"command": f"touch {marker}"}
    cfg = write_toml(tmp_path / "grpo.toml", doc)
    assert run_cli(["explain", str(cfg)]) == 1
    assert "standard library" in capsys.readouterr().out
    assert run_cli(["run", str(cfg)]) == 2
    assert not marker.exists()
    assert not (tmp_path / "o").exists() and not (tmp_path / "toml-out").exists()


def test_explain_locates_a_plugin_without_importing_it(
    tmp_path: Path, toy_model_dir: Path, arith: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from testkit.captures import grpo_source, write_toml

    marker = tmp_path / "imported"
    (tmp_path / "twinrun_test_loud_env.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n" + PLUGIN
    )
    sys.path.insert(0, str(tmp_path))
    try:
        doc = grpo_source(toy_model_dir, arith, "twinrun_test_loud_env:make", None, tmp_path / "o")
        cfg = write_toml(tmp_path / "grpo.toml", doc)
        run_cli(["explain", str(cfg), "--json"])
        report = json.loads(capsys.readouterr().out)
        inputs = next(c for c in report["checks"] if c["name"] == "inputs")
        assert inputs["status"] == "pass", inputs
        assert not marker.exists()
    finally:
        sys.path.remove(str(tmp_path))


def test_diag_changes_no_adapter_byte(
    tmp_path: Path, toy_model_dir: Path, arith: Path, plugin_module: str
) -> None:
    """Without --diag the update forward frees its logits once the kept rows are picked; with it
    they are kept for the `forward.logits` leaf. The update is the same bits either way."""
    for name in ("diag", "plain"):
        args = grpo_args(toy_model_dir, arith, tmp_path / name, 1, "--env", plugin_module)
        run(args if name == "diag" else [a for a in args if a != "--diag"])
    assert not (tmp_path / "plain" / "diag.jsonl").exists()
    rewards = [json.loads(x)["reward_std"] for x in (tmp_path / "diag" / "metrics.jsonl").open()]
    assert any(r > 0 for r in rewards)  # advantages not all zero: the update moved the adapter
    assert same_files(tmp_path / "diag", tmp_path / "plain", "adapter_model.safetensors")
