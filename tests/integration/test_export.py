"""`twinrun export`: the run's adapter merged into its base with PEFT, written whole as a plain
transformers checkpoint whose greedy tokens are twinrun's with the adapter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from testkit.toy_runs import sft_args
from twinrun.cli.main import run_cli

PROMPTS = ("What is 2 + 3?", "Name a colour.", "Say hello.")


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path, sft_examples: Path
) -> Path:
    out = tmp_path_factory.mktemp("export") / "run"
    args = sft_args(toy_model_dir, sft_examples, out, 4)
    args[args.index("--learning-rate") + 1] = "5e-2"  # an adapter that changes the answers
    assert run_cli(args) == 0
    return out


def twinrun_tokens(
    model: Path, prompt: str, capsys: pytest.CaptureFixture[str], *extra: str
) -> list[int]:
    assert run_cli([
        "generate", "--model", str(model), "--prompt", prompt, "--max-new-tokens", "8",
        "--chat-template", "on", "--precision", "f32", "--threads", "1", "--json",
        "--temperature", "0", "--seed", "0", *extra,
    ]) == 0  # fmt: skip
    return list(json.loads(capsys.readouterr().out)["tokens"])


def test_export_merges_and_generates_twinruns_tokens(
    trained: Path, toy_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "merged"
    assert run_cli(["export", str(trained), "--output", str(out)]) == 0
    capsys.readouterr()
    record = json.loads((out / "twinrun.export.json").read_text())
    side = json.loads((trained / "twinrun.json").read_text())
    assert record["base_sha256"] == side["model"]["sha256"]
    assert record["format"] == "twinrun.export.v1" and record["versions"]["peft"]
    assert not (out / "adapter_config.json").exists()  # a plain checkpoint, no PEFT needed
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                  attn_implementation="eager")  # fmt: skip
    base = AutoModelForCausalLM.from_pretrained(toy_model_dir, dtype=torch.float32,
                                                attn_implementation="eager")  # fmt: skip
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged.state_dict()[name], base.state_dict()[name])
    tok = AutoTokenizer.from_pretrained(out)
    changed = 0
    for prompt in PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                      add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"]  # fmt: skip
        gen = merged.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :].tolist()
        ours = twinrun_tokens(toy_model_dir, prompt, capsys, "--adapter", str(trained))
        assert gen[: len(ours)] == ours, prompt
        changed += ours != twinrun_tokens(toy_model_dir, prompt, capsys)
    assert changed  # the adapter changed an answer, so the equality says something


def test_export_refuses_a_changed_base_and_an_existing_output(
    trained: Path, toy_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other-base"
    shutil.copytree(toy_model_dir, other)
    (other / "generation_config.json").write_text('{"do_sample": false}\n')
    out = tmp_path / "merged"
    assert run_cli(["export", str(trained), "--output", str(out), "--model", str(other)]) == 2
    err = capsys.readouterr().err
    assert "is not the one" in err and "Expected sha256" in err and not out.exists()
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert run_cli(["export", str(trained), "--output", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert run_cli(["export", str(trained), "--output", str(out), "--overwrite"]) == 2
    assert "is not an export twinrun wrote" in capsys.readouterr().err
    assert (out / "mine.txt").read_text() == "keep" and len(list(out.iterdir())) == 1
    assert run_cli(["export", str(other), "--output", str(tmp_path / "x")]) == 2
    assert "not a finished twinrun run" in capsys.readouterr().err


def test_plot_draws_the_curves_of_runs(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "curves.png"
    assert run_cli(["plot", str(trained), str(trained), "--output", str(out)]) == 0
    assert "loss, lr, grad_norm of 2 run(s)" in capsys.readouterr().out
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
    from twinrun.diag.curves import series

    rows = [{"step": 0, "loss": 1.5}, {"step": 1, "loss": float("nan")}, {"step": 2, "loss": 1.0},
            {"step": 3, "phase": "eval"}]  # fmt: skip
    assert series(rows, "loss") == ([0, 2], [1.5, 1.0])
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text('{"step": 0}\n')
    assert run_cli(["plot", str(empty), "--output", str(tmp_path / "x.png")]) == 2
    assert "no run of" in capsys.readouterr().err and not (tmp_path / "x.png").exists()


def test_a_directory_that_is_not_a_run_is_refused_before_torch_loads(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "notes.txt").write_text("not a run")
    code = (
        "import sys; from twinrun.cli.main import run_cli; "
        f"rc = run_cli(['export', {str(tmp_path)!r}, '--output', {str(tmp_path / 'out')!r}]); "
        "print(rc, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["2", "False"], done.stderr
    assert "is not a finished twinrun run" in done.stderr  # not "--output lies inside the run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
