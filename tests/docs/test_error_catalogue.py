"""docs/errors.md is the line twinrun prints: each bad input below is made, in-process, and the
catalogue's text for it must be both in docs/errors.md and in the one line printed, with exit
status 2 and nothing written."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from twinrun.cli.main import run_cli

from .conftest import REPO

CATALOGUE = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")


@dataclass
class Case:
    name: str
    argv: list[str]
    lines: tuple[str, ...]  # each is in the catalogue and in the printed line
    env: dict[str, str] = field(default_factory=dict)


def sft(
    *extra: str, model: str = "runs/toy", examples: str = "sft.jsonl", output: str = "out"
) -> list[str]:
    return ["tune", "sft", "--model", model, "--examples", examples, "--output", output,
            "--seed", "1", "--epochs", "1", "--batch-size", "4", "--accumulation", "1",
            "--learning-rate", "1e-2", "--warmup-steps", "0", "--lr-schedule", "constant",
            "--lora-rank", "4", "--lora-alpha", "8", "--precision", "f32",
            "--chat-template", "on", "--threads", "1", "--quiet", *extra]  # fmt: skip


CASES = [
    Case("missing flags", ["tune", "sft", "--model", "runs/toy", "--output", "out"],
         ("missing required flags: --examples --seed",
          "every training number must be given (twinrun has no silent defaults)")),
    Case("non-finite", sft("--learning-rate", "nan"),
         ("Invalid value for '--learning-rate': must be a finite number",)),
    Case("out of range", sft("--batch-size", "0"), ("--batch-size must be >= 1, got 0",)),
    Case("threads past the cap", sft("--threads", "100000"),
         ("--threads 100000 is more than this machine's",
          "(twinrun accepts at most max(256, cores))")),
    Case("wsd without decay", sft("--lr-schedule", "wsd"),
         ("--lr-schedule wsd needs --decay-steps",)),
    Case("unknown fault", sft("--inject", "bogus@1"),
         ("unknown fault 'bogus' in --inject — choose from sampler, rng, reduction, observation, "
          "replay",)),
    Case("fault of another objective", sft("--inject", "observation@1"),
         ("fault 'observation' does not apply to sft — sft supports sampler, rng, reduction",)),
    Case("unknown TOML key", ["run", "bad.toml"],
         ("unknown key training.bogus (did you mean training.epochs?)",)),
    Case("no model", sft(model="runs/nope"),
         ("model directory runs/nope does not exist — point --model at a local Hugging Face "
          "checkpoint (or run `twinrun toy-model`)",)),
    Case("a Hub id", sft(model="HuggingFaceTB/SmolLM2-135M-Instruct"),
         ("model directory HuggingFaceTB/SmolLM2-135M-Instruct does not exist — "
          "HuggingFaceTB/SmolLM2-135M-Instruct looks like a Hugging Face Hub id, and --model "
          "takes a local directory: `hf download HuggingFaceTB/SmolLM2-135M-Instruct "
          "--local-dir DIR`, then --model DIR",)),
    Case("no tokenizer", sft(model="untokenized"), ("no tokenizer files in",)),
    Case("plain text examples", sft(examples="corpus.txt"),
         ("corpus.txt is plain text, not JSONL (its first line is not JSON) — to train on raw "
          "text, run `twinrun tune text --corpus corpus.txt`; examples are JSONL, a JSON array "
          "or CSV",)),
    Case("TRL's max_steps", sft("--max_steps", "4"),
         ("No such option '--max_steps'. twinrun's name for TRL's --max_steps: --stop-after "
          "(this run's length is --epochs; --stop-after N runs its first N).",)),
    Case("another objective's flag", sft("--beta", "0.1"),
         ("No such option '--beta': a flag of twinrun tune dpo, ipo, simpo, not of tune sft.",)),
    Case("an objective as a command", ["sft", *sft()[2:]],
         ("no such command; training is `twinrun tune sft`",)),
    Case("another device name", sft("--device", "gpu"), ("--device must be cpu, cuda or cuda:N",)),
    Case("a step larger than the data", sft("--batch-size", "500", "--warmup-steps", "1"),
         ("one step takes 500 examples (--batch-size 500 x --accumulation 1) and the data has "
          "64: the run has 1 step(s), and --warmup-steps 1 leaves no step of the 1-step run to "
          "decay — give more examples or a smaller --batch-size / --accumulation (or use "
          "--warmup-steps below 1)",)),
    Case("no config.json", sft(model="noconfig"), ("no config.json in",)),
    Case("no weights", sft(model="noweights"), ("no safetensors weights in",)),
    Case("pickle only", sft(model="pickled"),
         ("pickle weights only (pytorch_model.bin)", "never loads")),
    Case("not a causal LM", sft(model="vit"), ("'vit'", "not a causal")),
    Case("unknown LoRA target", sft("--lora-targets", "nope_proj"),
         ("LoRA target modules not found in the model: ['nope_proj']",)),
    Case("row without completion", sft(examples="bad.jsonl"),
         ("a row needs 'prompt' and 'completion', or 'messages' — found fields: prompt",)),
    Case("shard outside the model", sft(model="sharded"),
         ("model.safetensors.index.json names a shard outside",)),
    Case("damaged weights", sft(model="damaged"),
         ("model.safetensors is not a readable safetensors file (model weights",
          "re-download or re-save the checkpoint")),
    Case("lock without a pid", sft(output="locked"),
         ("holds '99999999999\\n', not a process id",
          "it was not written by twinrun: remove it if no twinrun process is writing that output")),
    Case("no adapter", sft("--init-adapter", "nope"), ("adapter directory nope does not exist",)),
    Case("cuBLAS setting", sft(),
         ("CUBLAS_WORKSPACE_CONFIG=':1:1' is not a deterministic cuBLAS workspace setting — set "
          "CUBLAS_WORKSPACE_CONFIG to :4096:8 or :16:8, or unset it",),
         env={"CUBLAS_WORKSPACE_CONFIG": ":1:1"}),
    Case("capture of more than one step", ["run", "capture16.toml"],
         ("a v1 capture runs exactly one step: set training.max_steps = 1",
          "see docs/capture.md (capture a source step)")),
    Case("diff of nothing", ["diff", "runs/nope", "runs/nope2"],
         ("runs/nope: no such file or directory — give a diag.jsonl or a run directory",)),
    Case("overwrite of a foreign directory", sft("--overwrite", output="mine"),
         ("--overwrite refused:", ", which twinrun did not write")),
    Case("output is a symlink", sft("--overwrite", output="linked"),
         ("is a symbolic link",)),
    Case("hostile chat template", sft(model="badtemplate"),
         ("built a value of more than 4194304 characters — fix the chat template, or use "
          "--chat-template off",)),
    Case("config is a FIFO", ["run", "fifo.toml"],
         ("config file fifo.toml is a FIFO, not a file — check the path",)),
    Case("examples from a device", sft(examples="/dev/zero"),
         ("examples file /dev/zero is a character device, not a file",)),
    Case("TOML tables too deep", ["run", "deep.toml"],
         ("tables nested deeper than 32 levels — fix the config",)),
    Case("NUL byte in a TOML path", ["run", "nul.toml"], ("model.path contains a NUL byte",)),
    Case("check without placeholders", ["check", "--", "twinrun", "tune", "sft"],
         ("the command has no {seed} or {out} placeholder",)),
]  # fmt: skip


@pytest.fixture()
def bad_inputs(repo_like: Path, toy_model_dir: Path) -> Path:
    shutil.copy(REPO / "src/twinrun/examples/sft.jsonl", "sft.jsonl")
    Path("bad.jsonl").write_text('{"prompt": "What is 1 + 1?"}\n')
    Path("bad.toml").write_text('[training]\ntrainer = "sft"\nbogus = 1\n')
    os.mkfifo("fifo.toml")
    Path("deep.toml").write_text("[" + ".".join(["a"] * 3000) + "]\nx = 1\n")
    Path("nul.toml").write_text('[training]\ntrainer = "sft"\n[model]\npath = "m\\u0000"\n')
    capture = (REPO / "examples/capture-source.toml").read_text()
    Path("capture16.toml").write_text(  # no initial state: its own problem, said in the line
        capture.replace('"examples/capture-sft.jsonl"', '"sft.jsonl"')
        .replace('"runs/examples/source"', '"out"')
        .replace('[resume]\nfrom = "runs/examples/init"\n', "")
    )
    Path("corpus.txt").write_text("Once upon a time\n")
    for name in ("noconfig", "noweights", "pickled", "vit", "sharded", "damaged", "badtemplate",
                 "untokenized"):  # fmt: skip
        shutil.copytree(toy_model_dir, name)
    for tokenizer_file in Path("untokenized").glob("tokenizer*"):
        tokenizer_file.unlink()
    Path("badtemplate/chat_template.jinja").write_text("{{ 'x' * 3000000000 }}")
    Path("noconfig/config.json").unlink()
    Path("noweights/model.safetensors").unlink()
    Path("pickled/model.safetensors").unlink()
    Path("pickled/pytorch_model.bin").write_bytes(b"not unpickled\n")
    config = json.loads(Path("vit/config.json").read_text())
    Path("vit/config.json").write_text(json.dumps(config | {"model_type": "vit"}))
    Path("sharded/model.safetensors").rename("outside.safetensors")
    index = {"weight_map": {"model.embed_tokens.weight": "../outside.safetensors"}}
    Path("sharded/model.safetensors.index.json").write_text(json.dumps(index))
    weights = Path("damaged/model.safetensors")
    weights.write_bytes(weights.read_bytes()[:100])
    Path(".locked.twinrun-lock").write_text("99999999999\n")
    Path("mine").mkdir()  # someone's directory with a name twinrun writes in it
    Path("mine/metrics.jsonl").write_text('{"step": 0}\n')
    Path("mine/notes.txt").write_text("mine\n")
    Path("linked").symlink_to("mine")
    return repo_like


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_catalogued_line_is_printed(
    case: Case,
    bad_inputs: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for text in case.lines:
        assert text in CATALOGUE, f"docs/errors.md does not list {text!r}"
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    before = sorted(p.name for p in bad_inputs.iterdir())
    capsys.readouterr()
    assert run_cli(case.argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("twinrun: error: ") and "\n" not in err, err
    assert "DES" + "IGN" not in err, "a message cites a document users cannot see"
    for text in case.lines:
        assert text in err, err
    assert sorted(p.name for p in bad_inputs.iterdir()) == before
    assert not (bad_inputs / "out").exists()
