"""TOML run configs: keys map onto RunConfig, unknown keys name the nearest valid one, every
problem is reported at once, the resolved config is redacted; the optimizer contract and its
allowlist rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testkit.captures import grpo_source, write_toml
from twinrun.config.contract import (
    V1_ALLOWED_DIFFERENCES,
    allowlist_problems,
    contract_diff,
    optimizer_contract,
)
from twinrun.config.toml import load_toml, resolved_tree, schema
from twinrun.core.errors import ConfigError

PIN = "a" * 64


def source(tmp_path: Path) -> dict[str, Any]:
    return grpo_source(tmp_path / "m", tmp_path / "e.jsonl", "arithmetic", tmp_path / "i",
                       tmp_path / "out")  # fmt: skip


def load(tmp_path: Path, doc: dict[str, Any]) -> Any:
    return load_toml(write_toml(tmp_path / "c.toml", doc))


def error(tmp_path: Path, doc: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, doc)
    return str(err.value)


def test_keys_map_onto_the_run_config(tmp_path: Path) -> None:
    run = load(tmp_path, source(tmp_path))
    cfg = run.cfg
    assert run.trainer == cfg.objective == "grpo" and cfg.steps == run.max_steps == 1
    assert cfg.rollout_block == 4  # the stated default
    doc = source(tmp_path)
    doc["grpo"]["rollout_block"] = 2
    assert load(tmp_path, doc).cfg.rollout_block == 2
    assert cfg.learning_rate == 0.05 and cfg.lora_alpha == 8 and cfg.threads == 1
    assert cfg.capture and cfg.checkpoint_every == 0 and cfg.init_adapter == str(tmp_path / "i")
    assert cfg.env == "arithmetic" and cfg.output == str(tmp_path / "out")
    assert load_toml(tmp_path / "c.toml", output="elsewhere").cfg.output == "elsewhere"


def test_every_design_key_is_known() -> None:
    keys = set(schema())
    for key in ("training.trainer", "training.seed", "training.max_steps", "training.save_every",
                "training.epochs", "model.path", "model.chat_template", "data.examples",
                "grpo.token_cap", "dpo.beta", "environment.name", "environment.args",
                "backend.devices", "backend.options.strict_deterministic",
                "backend.options.gradient_checkpointing", "backend.options.threads",
                "inference.engine", "resume.from", "logging.dir", "optimizer_batch.capture",
                "optimizer_batch.capture_steps", "optimizer_batch.replay_path",
                "optimizer_batch.expected_logical_sha256",
                "optimizer_batch.expected_manifest_sha256",
                "optimizer_batch.allow_config_differences", "evidence.min_update_cosine",
                "evidence.max_relative_delta_l2"):  # fmt: skip
        assert key in keys, key


def test_unknown_keys_suggest_the_nearest(tmp_path: Path) -> None:
    doc = source(tmp_path)
    doc["training"]["learnig_rate"] = 0.1
    doc["backend"]["options"]["gradient_checkpoint"] = True
    doc["trainng"] = {"warmup_steps": 0}
    msg = error(tmp_path, doc)
    assert "3 problems" in msg
    assert "unknown key training.learnig_rate (did you mean training.learning_rate?)" in msg
    assert "(did you mean backend.options.gradient_checkpointing?)" in msg
    assert "unknown key trainng.warmup_steps (did you mean training.warmup_steps?)" in msg


def test_all_problems_at_once(tmp_path: Path) -> None:
    doc = source(tmp_path)
    del doc["training"]["seed"], doc["grpo"]["clip_eps"]
    doc["training"]["batch_size"] = "four"
    doc["model"]["lora_rank"] = 4.5
    doc["color"] = "blue"
    msg = error(tmp_path, doc)
    for part in ("5 problems", "missing training.seed", "missing grpo.clip_eps",
                 "training.batch_size must be an integer (got a string)",
                 "model.lora_rank must be an integer", "unknown key color"):  # fmt: skip
        assert part in msg, part


def test_value_problems_named_by_toml_key(tmp_path: Path) -> None:
    doc = source(tmp_path)
    doc["training"]["learning_rate"] = 0
    doc["grpo"]["group_size"] = 1
    doc["grpo"]["rollout_block"] = 0
    doc["backend"]["devices"] = "cuda:0,cuda:1"
    doc["inference"]["engine"] = "vllm"
    msg = error(tmp_path, doc)
    assert "training.learning_rate must be > 0" in msg
    assert "grpo.group_size must be >= 2" in msg
    assert "grpo.rollout_block must be >= 1, got 0" in msg
    assert "backend.devices must name exactly one device" in msg
    assert "inference.engine must be pytorch" in msg
    assert "--" not in msg.split(" — ")[0]  # flags rewritten as TOML keys


def test_objective_keys_that_do_not_apply(tmp_path: Path) -> None:
    doc = source(tmp_path)
    doc["training"]["epochs"] = 2
    assert "training.epochs does not apply to grpo" in error(tmp_path, doc)
    doc = source(tmp_path)
    doc["optimizer_batch"]["expected_logical_sha256"] = PIN
    assert "only applies to trainer" in error(tmp_path, doc)


def replay_doc(tmp_path: Path) -> dict[str, Any]:
    doc = source(tmp_path)
    doc["training"]["trainer"] = "optimizer_replay"
    doc["optimizer_batch"] = {"replay_path": "m.json", "expected_logical_sha256": PIN,
                              "expected_manifest_sha256": PIN}  # fmt: skip
    return doc


def test_replay_config_needs_pins_and_seed(tmp_path: Path) -> None:
    assert load(tmp_path, replay_doc(tmp_path)).trainer == "optimizer_replay"
    doc = replay_doc(tmp_path)
    del doc["optimizer_batch"]["expected_manifest_sha256"], doc["training"]["seed"]
    doc["optimizer_batch"]["expected_logical_sha256"] = "ABC"
    msg = error(tmp_path, doc)
    assert "missing optimizer_batch.expected_manifest_sha256" in msg
    assert "missing training.seed" in msg
    doc = replay_doc(tmp_path)
    doc["optimizer_batch"]["expected_logical_sha256"] = "ABC"
    doc["training"]["max_steps"] = 3
    doc["training"]["save_every"] = 2
    msg = error(tmp_path, doc)
    assert "expected_logical_sha256 must be 64 lowercase hex digits" in msg
    assert "training.max_steps must be 1" in msg and "training.save_every must be 0" in msg


def test_capture_steps(tmp_path: Path) -> None:
    doc = source(tmp_path)
    doc["optimizer_batch"] = {"capture_steps": [2, 2]}
    msg = error(tmp_path, doc)
    assert "capture_steps needs optimizer_batch.capture = true" in msg
    assert "distinct steps" in msg


def test_resolved_tree_is_redacted(tmp_path: Path) -> None:
    doc = source(tmp_path)
    doc["environment"]["args"] = {"api_key": "sk-1", "level": 3, "url": "https://u:p@h/x"}
    doc["resume"]["from"] = "https://bob:pw@host/init?token=t0k"
    tree = resolved_tree(load(tmp_path, doc))
    assert tree["environment"]["args"] == {"api_key": "<redacted>", "level": "<redacted>",
                                           "url": "<redacted>"}  # fmt: skip
    assert "pw" not in tree["resume"]["from"] and "t0k" not in tree["resume"]["from"]
    assert tree["training"]["max_steps"] == 1 and tree["inference"]["engine"] == "pytorch"
    assert tree["backend"]["options"]["batch_invariant"] is False  # defaults are resolved too


def test_resolved_tree_holds_the_numbers_taken_from_defaults(tmp_path: Path) -> None:
    doc = {
        "training": {"trainer": "sft", "defaults": "trl"},
        "model": {"path": str(tmp_path / "model")},
        "data": {"examples": str(tmp_path / "e.jsonl")},
        "logging": {"dir": str(tmp_path / "out")},
        "backend": {"options": {"cpu_kernels": "portable"}},
    }
    tree = resolved_tree(load(tmp_path, doc))
    assert tree["training"]["learning_rate"] == 2e-5 and tree["training"]["seed"] == 42
    assert tree["training"]["defaults"] == "trl" and tree["data"]["messages_loss"] == "all"


def contract(tmp_path: Path, **over: Any) -> dict[str, Any]:
    import dataclasses

    cfg = dataclasses.replace(load(tmp_path, source(tmp_path)).cfg, **over)
    return optimizer_contract(cfg, "grpo", "f" * 64, ["v_proj", "q_proj"])


def test_contract_and_diff(tmp_path: Path) -> None:
    a = contract(tmp_path)
    assert a["grpo.clip_eps"] == 0.2 and a["model.sha256"] == "f" * 64
    assert "data.examples" not in a and "grpo.max_new_tokens" not in a  # rows are pinned
    assert contract_diff(a, contract(tmp_path, lora_alpha=8.0)) == []  # 8 == 8.0
    b = contract(tmp_path, gradient_checkpointing=True, learning_rate=0.1)
    assert contract_diff(a, b) == ["backend.options.gradient_checkpointing",
                                   "training.learning_rate"]  # fmt: skip
    assert contract_diff(a, {k: v for k, v in a.items() if k != "grpo.token_cap"}) == [
        "grpo.token_cap"
    ]


def test_allowlist_rule(tmp_path: Path) -> None:
    a = contract(tmp_path)
    assert a["model.lora_targets"] == ["q_proj", "v_proj"]  # the resolved targets, sorted
    assert a["model.attention"] == "eager"
    gc = contract(tmp_path, gradient_checkpointing=True)
    key = V1_ALLOWED_DIFFERENCES[0]
    assert allowlist_problems(a, gc, [key]) == []
    assert allowlist_problems(a, a, []) == []
    (undeclared,) = allowlist_problems(a, gc, [])
    assert undeclared == f"undeclared difference {key}: source false, replay true"
    (absent,) = allowlist_problems(a, a, [key])
    assert absent == f"declared difference {key} is not present (both false)"
    lr = contract(tmp_path, learning_rate=0.1)
    assert allowlist_problems(a, lr, ["training.learning_rate"]) == [
        f"training.learning_rate may not differ in v1 (allowed: {key})"
    ]
