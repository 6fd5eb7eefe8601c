"""Recorded differences between two sidecars (`twinrun.diag.recorded`): which facts differ, of
which kind, what is never compared, the reader, and which differences bear on an advice."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from twinrun.core.errors import DataError
from twinrun.diag.advice import GENERIC, advice_for
from twinrun.diag.recorded import (
    RecordedDifference,
    bearing_on,
    classify,
    flatten,
    format_difference,
    format_value,
    read_sidecar,
    recorded_between,
    recorded_differences,
    sidecars_differ_in,
)

MODEL = "a63e8b0c14378b8f711b98c28580df384b2c6199d4fe33fff568f053dfe24f8c"
DATA = "56659b0a9c09e9daca4cecc41989f3187a5842578d873a8d58e775974a7d5918"


def sidecar() -> dict[str, Any]:
    """The shape `twinrun tune` writes (a few keys of each section)."""
    return {
        "format": "twinrun.run.v1",
        "train": {
            "objective": "sft",
            "seed": 1,
            "threads": 1,
            "precision": "f32",
            "batch_size": 2,
            "lora_alpha": 8.0,
            "lora_targets": ["k_proj", "q_proj"],
            "init_adapter": None,
            "inject": [],
            "prefetch": 0,
        },
        "model": {"sha256": MODEL},
        "data": {"sha256": DATA},
        "adapter": {"sha256": "824c0003cb2ea513be682faf748c890009add3fae699471dbca5929547f8a5e5"},
        "determinism": {
            "strict": True,
            "threads": 1,
            "interop_threads": 2,
            "device": "cpu",
            "torch": "2.13.0+cpu",
            "device_name": "AMD EPYC",
            "torch_seed": 1477430091848272184,
            "cpu_kernels": {
                "mode": "portable",
                "aten_capability": "AVX2",
                "mkl_cbwr": "COMPATIBLE",
                "onednn": False,
                "native_capability": "AVX2",
            },
        },
        "runtime": {"python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.24.0"},
        "metrics": {"final_loss": 5.381949615478516, "steps": 2, "wall_s": 0.11},
        "inputs": {"model": "runs/toy", "examples": "ex.jsonl"},
    }


def edited(**paths: Any) -> dict[str, Any]:
    """sidecar() with dotted keys set (`edited(**{"train.threads": 2})`)."""
    out = copy.deepcopy(sidecar())
    for dotted, value in paths.items():
        *parents, last = dotted.split(".")
        node = out
        for p in parents:
            node = node[p]
        node[last] = value
    return out


def keys(diffs: list[RecordedDifference]) -> list[str]:
    return [d.key for d in diffs]


def test_identical_sidecars_have_no_differences() -> None:
    assert recorded_differences(sidecar(), sidecar()) == []


def test_threads_differ_as_a_setting_and_an_environment_fact() -> None:
    b = edited(**{"train.threads": 2, "determinism.threads": 2})
    assert recorded_differences(sidecar(), b) == [
        RecordedDifference("train.threads", "setting", 1, 2),
        RecordedDifference("determinism.threads", "environment", 1, 2),
    ]


def test_nested_cpu_kernels_are_flattened_to_dotted_keys() -> None:
    b = edited(**{"determinism.cpu_kernels.aten_capability": "AVX512"})
    (d,) = recorded_differences(sidecar(), b)
    assert (d.key, d.kind, d.a, d.b) == (
        "determinism.cpu_kernels.aten_capability", "environment", "AVX2", "AVX512",
    )  # fmt: skip
    assert d.section == "determinism"
    # a sidecar written before cpu_kernels was recorded: every key it lacks is null there
    old = edited()
    del old["determinism"]["cpu_kernels"]
    diffs = recorded_differences(old, sidecar())
    kernels = sidecar()["determinism"]["cpu_kernels"]
    assert keys(diffs) == [f"determinism.cpu_kernels.{k}" for k in kernels]
    assert all(d.a is None for d in diffs) and diffs[3].b is False


def test_torch_version_is_an_environment_fact_in_both_sections() -> None:
    b = edited(**{"determinism.torch": "2.14.0+cpu", "runtime.torch": "2.14.0+cpu"})
    diffs = recorded_differences(sidecar(), b)
    assert keys(diffs) == ["determinism.torch", "runtime.torch"]
    assert {d.kind for d in diffs} == {"environment"}


def test_model_and_data_sha256_are_inputs() -> None:
    b = edited(**{"model.sha256": "0" * 64, "data.sha256": "1" * 64})
    diffs = recorded_differences(sidecar(), b)
    assert [(d.key, d.kind) for d in diffs] == [("model.sha256", "input"), ("data.sha256", "input")]
    assert diffs[0].a == MODEL and diffs[0].b == "0" * 64  # whole digests in the record


def test_results_paths_and_the_adapter_are_never_compared() -> None:
    b = edited(
        **{"metrics.final_loss": 1.0, "metrics.wall_s": 9.0, "adapter.sha256": "f" * 64,
           "inputs.examples": "/elsewhere/ex.jsonl", "inputs.model": "/other/toy"}
    )  # fmt: skip
    assert recorded_differences(sidecar(), b) == []
    assert classify("metrics.final_loss") is None and classify("inputs.model") is None
    assert classify("adapter.sha256") is None


def test_classification_of_every_section() -> None:
    assert classify("train.seed") == "setting"
    assert classify("reward_head.key") == "setting"  # a section this module does not know
    for key in ("model.sha256", "data.sha256", "eval.sha256", "tokenizer.sha256",
                "init_adapter.sha256", "replay.manifest_sha256"):  # fmt: skip
        assert classify(key) == "input", key
    for key in ("determinism.cpu_kernels.mode", "runtime.peft", "format"):
        assert classify(key) == "environment", key


def test_torch_seed_is_derived_from_the_seed() -> None:
    other_seed = edited(**{"train.seed": 2, "determinism.torch_seed": 99})
    assert keys(recorded_differences(sidecar(), other_seed)) == ["train.seed"]
    # the same seed giving another torch seed: the derivation itself changed
    same_seed = edited(**{"determinism.torch_seed": 99})
    assert keys(recorded_differences(sidecar(), same_seed)) == ["determinism.torch_seed"]


def test_an_initial_adapter_path_counts_only_when_one_run_has_one() -> None:
    a, b = edited(**{"train.init_adapter": "runs/a/init"}), edited(**{"train.init_adapter": "x"})
    assert recorded_differences(a, b) == []  # both given: their SHA256 says if they are the same
    assert keys(recorded_differences(sidecar(), b)) == ["train.init_adapter"]
    a["init_adapter"], b["init_adapter"] = {"sha256": "a" * 64}, {"sha256": "b" * 64}
    assert [(d.key, d.kind) for d in recorded_differences(a, b)] == [
        ("init_adapter.sha256", "input")
    ]


def test_json_equality_of_values() -> None:
    assert recorded_differences(sidecar(), edited(**{"train.lora_alpha": 8})) == []
    assert keys(recorded_differences(sidecar(), edited(**{"determinism.strict": 1}))) == [
        "determinism.strict"
    ]  # true is not 1
    lists = edited(**{"train.lora_targets": ["q_proj", "k_proj"]})
    assert keys(recorded_differences(sidecar(), lists)) == ["train.lora_targets"]  # whole, ordered
    absent_is_null = edited()
    absent_is_null["train"]["new_flag"] = None
    assert recorded_differences(sidecar(), absent_is_null) == []
    assert keys(recorded_differences(sidecar(), edited(**{"train.inject": None}))) == [
        "train.inject"
    ]  # [] is not null
    assert keys(recorded_differences(edited(**{"format": "twinrun.run.v2"}), sidecar())) == [
        "format"
    ]
    nan = edited(**{"train.extra": float("nan")})
    assert recorded_differences(nan, copy.deepcopy(nan)) == []


def test_keys_only_one_sidecar_has_come_after_the_first_ones_order() -> None:
    b = edited(**{"train.threads": 2})
    b["runtime"]["accelerate"] = "1.0"
    b["train"]["new_flag"] = True
    assert keys(recorded_differences(sidecar(), b)) == [
        "train.threads", "train.new_flag", "runtime.accelerate",
    ]  # fmt: skip


def test_flatten() -> None:
    assert flatten({"a": {"b": {"c": 1}, "d": []}, "e": {}}) == {"a.b.c": 1, "a.d": [], "e": {}}


# -- the reader ------------------------------------------------------------------------------


def test_read_sidecar(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "diag.jsonl").write_text("")
    assert read_sidecar(run) is None and read_sidecar(run / "diag.jsonl") is None  # no facts
    (run / "twinrun.json").write_text(json.dumps(sidecar()))
    assert read_sidecar(run) == sidecar() == read_sidecar(run / "diag.jsonl")
    inputs = {"format": "twinrun.inputs.v1", "model_sha256": MODEL, "tokenizer_sha256": "c" * 64,
              "data_sha256": DATA, "eval_sha256": None, "init_adapter_sha256": None}  # fmt: skip
    (run / "twinrun.inputs.json").write_text(json.dumps(inputs))
    read = read_sidecar(run)
    assert read is not None and read["tokenizer"] == {"sha256": "c" * 64}
    assert "init_adapter" not in read  # none was given
    assert read_sidecar(tmp_path / "missing") is None


def test_recorded_between_needs_both_sidecars(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "twinrun.json").write_text(json.dumps(sidecar()))
    assert recorded_between(a, b) is None
    (b / "twinrun.json").write_text(json.dumps(edited(**{"determinism.threads": 2})))
    assert keys(recorded_between(a, b) or []) == ["determinism.threads"]


def test_a_sidecar_that_is_not_an_object_is_a_data_error(tmp_path: Path) -> None:
    (tmp_path / "twinrun.json").write_text("[1, 2]")
    with pytest.raises(DataError, match="must be a JSON object"):
        read_sidecar(tmp_path)
    (tmp_path / "twinrun.json").write_text("{not json")
    with pytest.raises(DataError):
        read_sidecar(tmp_path)


# -- bearing on the advice, and the text -----------------------------------------------------


def diffs_of(**paths: Any) -> list[RecordedDifference]:
    return recorded_differences(sidecar(), edited(**paths))


def test_threads_bear_on_the_gradient_advice_and_not_on_the_tokens() -> None:
    diffs = diffs_of(**{"train.threads": 2, "determinism.threads": 2, "train.prefetch": 2})
    grads = advice_for("grads.lora").one_line()
    assert keys(bearing_on(diffs, grads)) == ["train.threads", "determinism.threads"]
    assert bearing_on(diffs, advice_for("batch.sample_indices").one_line()) == []
    assert sidecars_differ_in(diffs, grads) == (
        "the runs' sidecars differ in train.threads (1 vs 2) and determinism.threads (1 vs 2): "
    )
    assert sidecars_differ_in(diffs, advice_for("batch.sample_indices").one_line()) == ""


def test_kernels_torch_and_the_cpu_bear_on_kernel_advice() -> None:
    diffs = diffs_of(
        **{"determinism.cpu_kernels.aten_capability": "AVX512", "runtime.torch": "2.14.0",
           "determinism.device_name": "Intel Xeon"}
    )  # fmt: skip
    logits = advice_for("forward.logits").one_line()  # "... nondeterministic or different kernels"
    assert len(bearing_on(diffs, logits)) == 3
    assert bearing_on(diffs, advice_for("batch.sample_indices").one_line()) == []


def test_device_precision_and_inputs() -> None:
    logits = advice_for("forward.logits").one_line()
    assert keys(bearing_on(diffs_of(**{"determinism.device": "cuda"}), logits)) == [
        "determinism.device"
    ]
    assert keys(bearing_on(diffs_of(**{"train.precision": "bf16"}), logits)) == ["train.precision"]
    # another model, data or seed, or a planted fault, bears on any advice
    for key in ("model.sha256", "data.sha256", "train.seed", "train.inject"):
        value = ["sampler@2"] if key == "train.inject" else "e" * 64
        diffs = diffs_of(**{key: value})
        assert keys(bearing_on(diffs, advice_for("rng.state").one_line())) == [key], key


def test_generic_advice_points_at_every_difference() -> None:
    diffs = diffs_of(**{"train.prefetch": 2, "runtime.transformers": "5.25.0"})
    assert bearing_on(diffs, "{}. Fix: {}".format(*GENERIC)) == diffs
    lr = advice_for("lr").one_line()  # "diff the `train` section": settings only
    assert keys(bearing_on(diffs, lr)) == ["train.prefetch"]


def test_more_than_three_bearing_are_counted() -> None:
    diffs = diffs_of(**{f"runtime.{k}": "x" for k in ("python", "torch", "transformers")}
                     | {"train.seed": 5, "model.sha256": "0" * 64})  # fmt: skip
    text = sidecars_differ_in(diffs, "{}. Fix: {}".format(*GENERIC))
    assert text == (
        "the runs' sidecars differ in train.seed (1 vs 5), model.sha256 (a63e8b0c1437... vs "
        '000000000000...), runtime.python ("3.11.7" vs "x") and 2 more: '
    )


def test_text_of_a_difference() -> None:
    d = RecordedDifference("determinism.threads", "environment", 1, 2)
    assert format_difference(d) == "determinism.threads: run_A=1 run_B=2 (environment)"
    assert format_difference(d, ("run_a", "run_b")) == (
        "determinism.threads: run_a=1 run_b=2 (environment)"
    )
    assert format_value(None) == "null" and format_value("AMD EPYC") == '"AMD EPYC"'
    assert format_value(MODEL) == "a63e8b0c1437..." and format_value(["q"]) == '["q"]'
    assert RecordedDifference("model.sha256", "input", MODEL, None).to_dict() == {
        "key": "model.sha256", "section": "model", "kind": "input", "a": MODEL, "b": None,
    }  # fmt: skip
