"""`--defaults trl`: each number TRL 1.16 documents as a trainer's default (and PEFT 0.21's
`LoraConfig`'s) is the one a run takes; nothing given is replaced; without it nothing changes;
`--warmup-ratio` makes transformers' warm-up steps."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from twinrun.config.resolved import validate
from twinrun.config.run import RunConfig
from twinrun.config.schedule import warmup_of
from twinrun.config.trl_defaults import defaults_record, defaults_table, fill_defaults
from twinrun.core.errors import ConfigError
from twinrun.rl.advantages import batch_normalise, group_advantages

# TRL 1.16.0's defaults as its configs document them (SFTConfig, DPOConfig, RewardConfig,
# GRPOConfig over transformers' TrainingArguments as TRL overrides them) and PEFT 0.21.2's
# LoraConfig, in twinrun's names. None: the setting stays off (LoRA dropout 0.0, GRPO's beta 0.0).
SHARED = {
    "seed": 42,  # TrainingArguments.seed
    "batch_size": 8,  # per_device_train_batch_size
    "learning_rate": None,  # per trainer, below
    "warmup_steps": 0,  # warmup_steps
    "lr_schedule": "linear",  # lr_scheduler_type
    "max_grad_norm": 1.0,  # max_grad_norm
    "precision": "bf16",  # bf16 = True (TRL sets it when fp16 is not)
    "chat_template": "on",
    "lora_rank": 8,  # LoraConfig.r
    "lora_alpha": 8.0,  # LoraConfig.lora_alpha
    "lora_dropout": None,  # LoraConfig.lora_dropout = 0.0
    "lora_targets": ["q_proj", "v_proj"],  # PEFT's default for llama
}
EPOCHS = {"epochs": 3, "accumulation": 1, "max_length": 1024}  # num_train_epochs, grad accum.
EXPECTED: dict[str, dict[str, Any]] = {
    "sft": SHARED | EPOCHS | {"learning_rate": 2e-5, "messages_loss": "all"},
    "dpo": SHARED | EPOCHS | {"learning_rate": 1e-6, "beta": 0.1},
    "ipo": SHARED | EPOCHS | {"learning_rate": 1e-6, "beta": 0.1},
    "reward": SHARED | EPOCHS | {"learning_rate": 1e-4},
    "grpo": SHARED
    | {
        "learning_rate": 1e-6,
        "group_size": 8,  # num_generations
        "prompts_per_step": 1,  # generation_batch_size 8 / num_generations 8
        "max_new_tokens": 512,  # max_completion_length
        "token_cap": 512,
        "temperature": 1.0,
        "clip_eps": 0.2,  # epsilon
        "kl_beta": None,  # beta = 0.0
        "advantage_clip": 3.0,  # no clip in TRL: ceil(sqrt(8 - 1)), which no advantage reaches
    },
}


@pytest.fixture
def llama(tmp_path: Path) -> Path:
    """A model directory whose config.json says what PEFT's default targets are read from."""
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "max_position_embeddings": 2048})
    )
    return tmp_path


def given(objective: str, model: Path, **more: Any) -> RunConfig:
    paths: dict[str, Any] = {"examples": "x.jsonl"}
    if objective == "grpo":
        paths |= {"env": "arithmetic", "steps": 4}
    return RunConfig(objective=objective, model=str(model), output="o", **paths, **more)


@pytest.mark.parametrize("objective", sorted(EXPECTED))
def test_each_number_is_trls_documented_default(objective: str, llama: Path) -> None:
    run = validate(given(objective, llama, defaults="trl", threads=1)).as_config()
    for name, value in EXPECTED[objective].items():
        assert getattr(run, name) == value, name
    assert run.weight_decay == 0.0 and run.adam_betas == (0.9, 0.999) and run.adam_eps == 1e-8
    record = defaults_record(run)
    assert record is not None and record["versions"] == {"trl": "1.16.0", "peft": "0.21.2"}
    assert set(record["taken"]) == set(EXPECTED[objective]) - {"threads"}  # threads was given
    assert all(entry["source"] for entry in record["taken"].values())


def test_text_takes_sft_config_and_keeps_its_step_count(llama: Path) -> None:
    cfg = RunConfig(objective="text", model=str(llama), output="o", corpus=["c.txt"],
                    defaults="trl", cpu_kernels="portable")  # fmt: skip
    with pytest.raises(ConfigError, match=r"^missing required flag: --steps$") as info:
        validate(cfg)
    assert info.value.hint == "TRL has no default twinrun can take for it"
    run = validate(RunConfig(**{**vars(cfg), "steps": 3})).as_config()
    assert (run.window, run.windows_per_step, run.learning_rate) == (1024, 8, 2e-5)


def test_a_given_number_is_never_replaced(llama: Path) -> None:
    run = validate(
        given("sft", llama, defaults="trl", learning_rate=5e-3, seed=7, lora_targets=["o_proj"],
              messages_loss="assistant", threads=1)
    ).as_config()  # fmt: skip
    assert (run.learning_rate, run.seed, run.lora_targets) == (5e-3, 7, ["o_proj"])
    assert run.messages_loss == "assistant"
    assert {"learning_rate", "seed", "lora_targets", "messages_loss"}.isdisjoint(run.taken)
    assert fill_defaults(run) == run  # taking again takes nothing


def test_without_defaults_nothing_is_taken(llama: Path) -> None:
    with pytest.raises(ConfigError, match="missing required flags: --seed --epochs") as info:
        validate(given("sft", llama))
    assert info.value.hint.endswith(
        "(twinrun has no silent defaults), or --defaults trl takes TRL's"
    )
    assert fill_defaults(given("sft", llama)) == given("sft", llama)


def test_grpo_still_needs_its_step_count(llama: Path) -> None:
    cfg = RunConfig(objective="grpo", model=str(llama), examples="x", output="o", env="arithmetic",
                    defaults="trl", threads=1)  # fmt: skip
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert info.value.message == "missing required flag: --steps"
    assert info.value.hint == "TRL has no default twinrun can take for it"


def test_threads_are_taken_only_where_they_shape_bytes(llama: Path) -> None:
    native = validate(given("sft", llama, defaults="trl", cpu_kernels="native")).as_config()
    assert native.threads is not None and native.threads >= 1 and "threads" in native.taken
    portable = validate(given("sft", llama, defaults="trl", cpu_kernels="portable")).as_config()
    assert portable.threads is None and "threads" not in portable.taken


def test_max_length_stays_within_a_small_models_positions(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "max_position_embeddings": 256})
    )
    run = validate(given("sft", tmp_path, defaults="trl", threads=1)).as_config()
    assert run.max_length == 256


@pytest.mark.parametrize("rows", [2, 8, 16, 64])
def test_the_advantage_clip_taken_never_binds(rows: int, llama: Path) -> None:
    """The most extreme normalised advantage of a step (one completion rewarded, the rest not)
    stays inside the clip `--defaults trl` takes for that many rows: TRL clips none."""
    run = validate(
        given("grpo", llama, defaults="trl", threads=1, group_size=rows, prompts_per_step=1)
    )
    clip = run.as_config().advantage_clip
    assert clip == math.ceil(math.sqrt(rows - 1))
    rewards = torch.zeros(1, rows, dtype=torch.float64)
    rewards[0, 0] = 1.0
    advantages = batch_normalise(group_advantages(rewards))
    assert float(advantages.abs().max()) <= clip
    assert float(advantages.abs().max()) > clip - 1  # the bound is tight to within one


def test_the_table_names_every_number_taken(llama: Path) -> None:
    run = validate(given("dpo", llama, defaults="trl", threads=1)).as_config()
    table = defaults_table(run).splitlines()
    assert table[0].startswith(f"{len(run.taken)} numbers taken from TRL 1.16.0's DPOConfig")
    assert any(line.split()[:3] == ["--beta", "0.1", "DPOConfig.beta"] for line in table)
    assert any(line.split()[:2] == ["--lora-dropout", "off"] for line in table)
    toml = defaults_table(run, "toml")
    assert "dpo.beta" in toml and "--beta" not in toml


@pytest.mark.parametrize(
    ("steps", "ratio", "total", "made"),
    [(None, 0.1, 10, 1), (None, 0.15, 10, 2), (None, 0.5, 7, 4), (None, 0.0, 9, 0), (3, None, 9, 3),
     (2, 0.15, 10, 2)],
)  # fmt: skip
def test_warmup_ratio_makes_transformers_steps(
    steps: int | None, ratio: float | None, total: int, made: int
) -> None:
    assert warmup_of(steps, ratio, total) == made


def test_warmup_ratio_and_steps_that_disagree_are_refused(llama: Path) -> None:
    with pytest.raises(ConfigError, match=r"--warmup-steps 1 and --warmup-ratio 0.5 disagree: "
                       r"0.5 of the 4-step run is 2 step\(s\)"):  # fmt: skip
        validate(given("grpo", llama, defaults="trl", threads=1, warmup_steps=1, warmup_ratio=0.5))


def test_warmup_ratio_of_a_step_counted_run_is_resolved_at_once(llama: Path) -> None:
    run = validate(given("grpo", llama, defaults="trl", threads=1, warmup_ratio=0.5))
    assert run.warmup_steps == 2 and run.optimizer.warmup_ratio == 0.5
    assert "warmup_steps" not in run.switches.taken  # the ratio made them, not TRL


def test_the_thread_count_taken_is_torchs_default(
    llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OMP_NUM_THREADS when set (torchrun gives each process 1), else this process's CPUs."""
    import os

    from twinrun.config.trl_defaults import torch_threads

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert torch_threads() == 1
    run = validate(given("sft", llama, defaults="trl", cpu_kernels="native")).as_config()
    assert run.threads == 1
    for value in ("", "0", "two"):
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        assert torch_threads() == len(os.sched_getaffinity(0))
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert torch_threads() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("objective", sorted(EXPECTED))
def test_the_records_read_a_validated_run_as_its_config(objective: str, llama: Path) -> None:
    """The sidecar's defaults record, a capture's optimizer contract and resolved config read the
    validated run's values: each equals the record made from the `RunConfig` it gives back."""
    from twinrun.config.contract import optimizer_contract
    from twinrun.config.toml import RunExtras, settings_tree

    valid = validate(given(objective, llama, defaults="trl", threads=1))
    cfg = valid.as_config()
    record = defaults_record(valid)
    assert record is not None and record["taken"]  # the run took numbers: the record says which
    assert record == defaults_record(cfg)
    assert defaults_table(valid) == defaults_table(cfg) != ""
    targets = ["q_proj", "v_proj"]
    assert optimizer_contract(valid, objective, "m", targets) == optimizer_contract(
        cfg, objective, "m", targets
    )
    steps = valid.value("steps")
    assert steps == cfg.steps
    tree = settings_tree(objective, valid, RunExtras(), steps)
    assert tree == settings_tree(objective, cfg, RunExtras(), cfg.steps)
    assert tree["training"]["learning_rate"] == EXPECTED[objective]["learning_rate"]
