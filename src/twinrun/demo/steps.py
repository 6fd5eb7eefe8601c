"""The work behind each step of `twinrun demo`, as plain functions that return what they found.

Every step runs the same library code the commands run (`tune sft`, `generate`, `diff`,
`init-adapter`, `run`, `evidence`, `check`); the tour (`demo.tour`) prints what each proved.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinrun.config.run import RunConfig
from twinrun.core.owned import Layout
from twinrun.data.examples import shipped_examples

QUESTIONS = 64  # the shipped sft.jsonl


@dataclass(frozen=True)
class Budget:
    """The SFT numbers of the tour. On the toy: enough steps for the adapter to learn the 64
    shipped answers (20 epochs of 8 steps, every linear layer adapted); on a real checkpoint a
    short run, so the tour stays minutes, not hours."""

    epochs: int
    learning_rate: float
    lora_targets: list[str] | None
    warmup_steps: int = 4
    batch_size: int = 8
    lora_rank: int = 8


TOY_BUDGET = Budget(epochs=20, learning_rate=1e-2, lora_targets=["all-linear"])
REAL_BUDGET = Budget(epochs=1, learning_rate=2e-4, lora_targets=None, warmup_steps=1)


@dataclass
class Tour:
    root: Path
    model: Path
    budget: Budget
    threads: int
    shas: dict[str, str] = field(default_factory=dict)

    def sft_config(self, name: str, seed: int, **over: Any) -> RunConfig:
        b = self.budget
        values: dict[str, Any] = {
            "objective": "sft", "model": str(self.model), "examples": str(shipped_examples()),
            "output": str(self.root / name), "seed": seed, "epochs": b.epochs,
            "batch_size": b.batch_size, "accumulation": 1, "learning_rate": b.learning_rate,
            "warmup_steps": b.warmup_steps, "lr_schedule": "cosine", "lora_rank": b.lora_rank,
            "lora_alpha": 2.0 * b.lora_rank, "lora_targets": b.lora_targets, "precision": "f32",
            "chat_template": "on", "diag": True, "threads": self.threads, "overwrite": True,
            "quiet": True, "cpu_kernels": "portable",
        }  # fmt: skip
        values.update(over)
        return RunConfig(**values)

    def train(self, name: str, seed: int, **over: Any) -> dict[str, Any]:
        from twinrun.train.recipes import train

        record = train(self.sft_config(name, seed, **over))
        self.shas[name] = record["adapter"]["sha256"]
        return record


def tour_dirs(tour: Tour) -> dict[Path, Layout]:
    """Every subdirectory the tour writes, with what it writes there (what a rerun replaces)."""
    from twinrun.harness import kept_layout
    from twinrun.model.toy import TOY_LAYOUT
    from twinrun.train.outputs.init_adapter import INIT_LAYOUT
    from twinrun.train.outputs.run_dir import run_layout

    runs = ("run-a", "run-b", "run-c", "clean", "faulty", "capture-source", "replay-1", "replay-2")
    dirs = {tour.root / name: run_layout() for name in runs}
    dirs |= {
        tour.root / "capture-init": INIT_LAYOUT,
        tour.root / "check": kept_layout(run_layout()),
    }
    if tour.model == tour.root / "toy-model":
        dirs[tour.model] = TOY_LAYOUT
    return dirs


def written_by_tour(folder: Path, layout: Layout) -> list[Path]:
    """What an earlier tour left in `folder` (deepest first); OutputError naming anything else."""
    from twinrun.core.errors import OutputError
    from twinrun.core.owned import survey

    if folder.is_symlink() or folder.exists() and not folder.is_dir():
        raise OutputError(
            f"{folder} is not a directory the tour wrote", "give `twinrun demo` another --dir"
        )
    if not folder.exists():
        return []
    found = survey(folder, layout)
    if found.foreign is not None:
        raise OutputError(
            f"{folder} holds {found.foreign.relative_to(folder)}, which the tour did not write"
            + (f" ({found.why})" if found.why else ""),
            "move it out, or give `twinrun demo` another --dir; a rerun replaces only what the "
            "tour wrote",
        )
    return found.entries


def clear_for_rerun(folder: Path, layout: Layout) -> None:
    """Empty `folder` as an earlier tour left it: only the names `layout` declares go, and a
    folder holding anything else stops the tour with nothing removed."""
    from twinrun.core.owned import remove

    remove(written_by_tour(folder, layout))


# -- learn: greedy answers before and after -------------------------------------------------


# Questions the shipped examples do not hold, scored beside the trained ones: a model this small
# memorises its examples; these say whether it learned anything beyond them.
HELD_OUT: tuple[tuple[str, str], ...] = (
    ("What is 2 + 2?", "4"),
    ("What is 3 + 6?", "9"),
    ("What is 5 + 5?", "10"),
    ("Spell the number 10.", "ten"),
)


@dataclass
class Answers:
    rows: list[tuple[str, str, str, str]]  # question, base answer, trained answer, expected
    base_right: int  # of the distinct training questions
    trained_right: int
    distinct: int  # distinct training questions (the 64 examples repeat them)
    held_out_base: int  # of HELD_OUT
    held_out_trained: int


def questions() -> list[tuple[str, str]]:
    """(question, expected answer) of every shipped SFT example."""
    from twinrun.data.examples import load_rows, sft_parts

    out = []
    for row in load_rows(shipped_examples()):
        messages, completion = sft_parts(row)
        out.append((messages[-1]["content"], completion))
    return out


def greedy_answers(model_dir: Path, adapter: Path | None, asked: list[str]) -> list[str]:
    """Greedy completions (at most 12 tokens, stopping at the checkpoint's end ids)."""
    import torch

    from twinrun.model.build import build_model
    from twinrun.model.decoding import generate
    from twinrun.model.tokens import load_tokenizer

    tok = load_tokenizer(model_dir)
    model = build_model(model_dir, precision="f32", device="cpu", adapter=adapter)
    out = []
    with torch.no_grad():
        for q in asked:
            ids = tok.prompt_ids([{"role": "user", "content": q}], True)
            result = generate(model, ids, 12, 0.0, end_ids=tok.end_ids)
            ends = [t for t in result.tokens if t not in tok.end_ids]
            out.append(tok.decode(ends).strip())
    return out


def compare_answers(tour: Tour, adapter: Path, shown: int = 4) -> Answers:
    """Greedy answers before and after training, on each distinct training question (in file
    order) and on the held-out ones."""
    asked = list(dict.fromkeys(questions())) + list(HELD_OUT)
    prompts = [q for q, _ in asked]
    base = greedy_answers(tour.model, None, prompts)
    trained = greedy_answers(tour.model, adapter, prompts)
    rows = [(q, b, t, want) for (q, want), b, t in zip(asked, base, trained, strict=True)]
    seen, held = rows[: -len(HELD_OUT)], rows[-len(HELD_OUT) :]
    return Answers(
        rows=seen[:shown],
        base_right=sum(b == want for _, b, _, want in seen),
        trained_right=sum(t == want for _, _, t, want in seen),
        distinct=len(seen),
        held_out_base=sum(b == want for _, b, _, want in held),
        held_out_trained=sum(t == want for _, _, t, want in held),
    )


# -- diverge and diagnose ---------------------------------------------------------------------


@dataclass
class Diagnosis:
    step: int
    leaf: str
    rows_diverged: int
    rows_compared: int
    advice: str
    picture: Path


def plant_and_find(tour: Tour, fault: str = "reduction@3") -> Diagnosis:
    """Two one-epoch runs at one seed, one with a planted fault; `diff --bitwise` finds it."""
    from twinrun.diag.advice import advice_for
    from twinrun.diag.compare import compare
    from twinrun.diag.report import write_report

    tour.train("clean", 1, epochs=1)
    tour.train("faulty", 1, epochs=1, inject=[fault])
    result = compare(tour.root / "clean", tour.root / "faulty", bitwise=True, keep_matrix=True)
    picture = tour.root / "faulty" / "diff.png"
    write_report(result, str(picture))
    first = result.first
    if first is None or first.leaf is None:
        from twinrun.core.errors import ContractError

        raise ContractError(f"diff did not find the planted {fault}", "report this")
    return Diagnosis(
        step=first.step,
        leaf=first.leaf,
        rows_diverged=result.rows_diverged,
        rows_compared=result.rows_compared,
        advice=advice_for(first.leaf).one_line(),
        picture=picture,
    )


# -- capture one step, replay it twice, judge the evidence ------------------------------------


def capture_source(tour: Tour) -> dict[str, Any]:
    """A one-step SFT source that captures its optimizer batch (from `init-adapter`'s state)."""
    from twinrun.train.outputs.init_adapter import INIT_LAYOUT, init_adapter

    init = tour.root / "capture-init"
    clear_for_rerun(init, INIT_LAYOUT)
    init_adapter(init, str(tour.model), seed=5, rank=4, alpha=8.0)
    return {
        "training": {"trainer": "sft", "seed": 5, "max_steps": 1, "save_every": 0,
                     "learning_rate": 0.01, "warmup_steps": 0, "lr_schedule": "cosine",
                     "batch_size": 2, "accumulation": 2, "epochs": 1, "precision": "f32"},
        "model": {"path": str(tour.model), "chat_template": "on", "lora_rank": 4,
                  "lora_alpha": 8},
        "data": {"examples": str(four_examples(tour.root))},
        "backend": {"devices": "cpu",
                    "options": {"threads": tour.threads, "cpu_kernels": "portable"}},
        "resume": {"from": str(init)},
        "logging": {"dir": str(tour.root / "capture-source")},
        "optimizer_batch": {"capture": True},
    }  # fmt: skip


def four_examples(root: Path) -> Path:
    path = root / "capture-examples.jsonl"
    lines = shipped_examples().read_text().splitlines()[:4]
    path.write_text("\n".join(lines) + "\n")
    return path


def replay_config(source: dict[str, Any], out: Path) -> dict[str, Any]:
    """The source config turned into an optimizer replay pinned to the capture."""
    import copy

    src_dir = Path(source["logging"]["dir"])
    manifest = src_dir / "optimizer_batch_step_000000.manifest.json"
    row = json.loads((src_dir / "metrics.jsonl").read_text().splitlines()[0])
    doc = copy.deepcopy(source)
    doc["training"]["trainer"] = "optimizer_replay"
    doc["training"].pop("save_every", None)
    doc["logging"]["dir"] = str(out)
    doc["optimizer_batch"] = {
        "replay_path": str(manifest),
        "expected_logical_sha256": row["optimizer/logical_batch_sha256"],
        "expected_manifest_sha256": hashlib.sha256(manifest.read_bytes()).hexdigest(),
    }
    return doc


def run_toml_doc(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    import tomli_w

    from twinrun.dispatch.toml_runs import run_toml
    from twinrun.train.outputs.run_dir import run_layout

    clear_for_rerun(Path(doc["logging"]["dir"]), run_layout())
    path.write_text(tomli_w.dumps(doc))
    return run_toml(path, None, True)


def capture_and_replay(tour: Tour) -> dict[str, Any]:
    """Capture step 0, delete the examples, replay twice, and judge gates A and B."""
    from twinrun.replay.evidence import evaluate

    source = capture_source(tour)
    run_toml_doc(source, tour.root / "capture-source.toml")
    Path(source["data"]["examples"]).unlink()  # a replay needs no data
    replays = []
    for name in ("replay-1", "replay-2"):
        doc = replay_config(source, tour.root / name)
        run_toml_doc(doc, tour.root / f"{name}.toml")
        replays.append(tour.root / name)
    return evaluate(Path(source["logging"]["dir"]), replays, ["A", "B"])


# -- the determinism harness --------------------------------------------------------------------


def check_command(tour: Tour) -> list[str]:
    """`twinrun tune sft` on the tour's model with `{seed}` and `{out}` left for the harness."""
    b = tour.budget
    return [
        sys.executable, "-m", "twinrun", "tune", "sft", "--model", str(tour.model),
        "--examples", str(shipped_examples()), "--output", "{out}", "--seed", "{seed}",
        "--epochs", "1", "--batch-size", str(b.batch_size), "--accumulation", "1",
        "--learning-rate", str(b.learning_rate), "--warmup-steps", "1",
        "--lr-schedule", "cosine", "--lora-rank", str(b.lora_rank),
        "--lora-alpha", str(2 * b.lora_rank), "--precision", "f32", "--chat-template", "on",
        "--diag", "--threads", str(tour.threads), "--quiet", "--cpu-kernels", "portable",
    ]  # fmt: skip


def quick_check(tour: Tour) -> Any:
    from twinrun.harness import kept_layout, run_check
    from twinrun.harness.quick import quick_command
    from twinrun.train.outputs.run_dir import run_layout

    keep = tour.root / "check"
    clear_for_rerun(keep, kept_layout(run_layout()))
    return run_check(quick_command(check_command(tour)), keep=keep)
