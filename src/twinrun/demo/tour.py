"""The guided tour behind `twinrun demo`: reproduce, learn, diverge and diagnose, capture and
replay, check — each step says in one line what it proved.

On the embedded default (no `--model`) it writes the toy checkpoint at weight scale 0.2 (a toy
LoRA can teach; see `model.toy`) and trains on the 64 shipped examples. With `--model DIR` the
same tour runs on a checkpoint the user has, with a short training budget.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from twinrun.core.errors import ContractError
from twinrun.demo.steps import (
    HELD_OUT,
    QUESTIONS,
    REAL_BUDGET,
    TOY_BUDGET,
    Tour,
    capture_and_replay,
    compare_answers,
    plant_and_find,
    quick_check,
    tour_dirs,
    written_by_tour,
)

__all__ = ["run_demo"]
SEEDS = {"run-a": 1, "run-b": 1, "run-c": 2}
TOY_INIT_STD = 0.2


def run_demo(root: Path, threads: int = 1, model: Path | None = None) -> dict[str, str]:
    """Run the tour into `root`; returns the adapter SHA256 of every training run."""
    console = Console(highlight=False)
    t0 = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    tour = Tour(
        root=root,
        model=model if model is not None else root / "toy-model",
        budget=TOY_BUDGET if model is None else REAL_BUDGET,
        threads=threads,
    )
    for folder, layout in tour_dirs(tour).items():  # a rerun stops here, before any step,
        written_by_tour(folder, layout)  # when a directory holds what the tour did not write
    if model is None:
        from twinrun.model.toy import write_toy_checkpoint

        write_toy_checkpoint(tour.model, seed=0, overwrite=True, init_std=TOY_INIT_STD)
        console.print(f"[bold]0.[/] wrote the toy Llama checkpoint to {tour.model}")
    else:
        console.print(f"[bold]0.[/] using the checkpoint in {tour.model}")
    proved = [
        reproduce(tour, console),
        learn(tour, console),
        diagnose(tour, console),
        capture(tour, console),
        check(tour, console),
    ]
    console.print("\n[bold]What the tour proved[/]")
    for i, line in enumerate(proved, start=1):
        console.print(f"  {i}. {line}")
    console.print(f"  (everything it wrote is in {root}; the tour took "
                  f"{time.perf_counter() - t0:.0f} s)")  # fmt: skip
    return tour.shas


def reproduce(tour: Tour, console: Console) -> str:
    b = tour.budget
    console.print(
        f"\n[bold]1. Reproduce[/] — SFT three times on {QUESTIONS} shipped examples "
        f"({b.epochs} epochs, batch {b.batch_size}, LoRA rank {b.lora_rank} on "
        f"{', '.join(b.lora_targets or ['the attention projections'])}): seeds 1, 1, 2"
    )
    for name, seed in SEEDS.items():
        record = tour.train(name, seed)
        console.print(f"   {name} (seed {seed}): final loss {record['metrics']['final_loss']:.4f}")
    table = Table(title="adapter_model.safetensors SHA256")
    table.add_column("run")
    table.add_column("seed")
    table.add_column("sha256 (first 24 hex digits)")
    for name, seed in SEEDS.items():
        table.add_row(name, str(seed), tour.shas[name][:24])
    console.print(table)
    same = tour.shas["run-a"] == tour.shas["run-b"]
    other = tour.shas["run-a"] != tour.shas["run-c"]
    if not (same and other):
        raise ContractError(
            "the demo's reproducibility check failed", "report this with the runs' twinrun.json"
        )
    return "same seed, same adapter bytes (run-a = run-b); another seed, other bytes (run-c)"


def learn(tour: Tour, console: Console) -> str:
    console.print("\n[bold]2. Learn[/] — greedy answers of the base model and of run-a's adapter")
    answers = compare_answers(tour, tour.root / "run-a")
    table = Table()
    for column in ("question", "base model", "with the adapter", "expected"):
        table.add_column(column)
    for question, base, trained, expected in answers.rows:
        table.add_row(question, repr(clip(base)), repr(clip(trained)), repr(expected))
    console.print(table)
    n, held = answers.distinct, len(HELD_OUT)
    console.print(
        f"   exact answers on the {n} distinct questions of the {QUESTIONS} training examples: "
        f"base {answers.base_right}, with the adapter {answers.trained_right}; on {held} "
        f"held-out questions: base {answers.held_out_base}, with the adapter "
        f"{answers.held_out_trained} (a model this small memorises; it does not generalise)"
    )
    from twinrun.diag.curves import write_curves
    from twinrun.train.outputs.run_dir import CURVES_PICTURE

    curves = tour.root / "run-a" / CURVES_PICTURE
    write_curves([tour.root / "run-a", tour.root / "run-b"], curves)
    console.print(f"   training curves of run-a and run-b: {curves} (`twinrun plot`)")
    held_out = f"; held out: {answers.held_out_trained}/{held}"
    if answers.trained_right > answers.base_right:
        return (
            f"the adapter learned its examples: {answers.trained_right}/{n} trained questions "
            f"exact where the base model gave {answers.base_right}/{n}{held_out}"
        )
    return (
        f"this short run did not change the exact answers ({answers.base_right}/{n} before, "
        f"{answers.trained_right}/{n} after{held_out}); on the toy the tour trains long "
        "enough to learn them all"
    )


def clip(text: str, width: int = 16) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def diagnose(tour: Tour, console: Console) -> str:
    console.print(
        "\n[bold]3. Diverge and diagnose[/] — two one-epoch runs at seed 1, the second with a "
        "planted fault (--inject reduction@3: step 3's gradient summed row by row, last row "
        "first)"
    )
    d = plant_and_find(tour)
    console.print(
        f"   twinrun diff clean faulty --bitwise: FIRST_DIVERGENCE step={d.step} leaf={d.leaf} "
        f"({d.rows_diverged} of {d.rows_compared} steps diverged)"
    )
    console.print(f"   advice: {d.advice}")
    console.print(f"   heatmap of every step and leaf: {d.picture}")
    return f"diff localised the planted fault to its step and leaf (step {d.step}, {d.leaf})"


def capture(tour: Tour, console: Console) -> str:
    console.print(
        "\n[bold]4. Capture and replay[/] — step 0 of a run captured (init-adapter, then run "
        "with \\[optimizer_batch] capture = true), its examples deleted, replayed twice"
    )
    report = capture_and_replay(tour)
    gates: dict[str, Any] = report["gates"]
    for gate in ("A", "B"):
        failed = [c["name"] for c in gates[gate]["criteria"] if not c["ok"]]
        verdict = "passes" if gates[gate]["ok"] else f"fails ({', '.join(failed)})"
        console.print(f"   gate {gate}: {verdict}")
    if not (gates["A"]["ok"] and gates["B"]["ok"]):
        raise ContractError("the demo's replays did not pass gates A and B", "report this")
    return (
        "a captured step replays without its data: same inputs (gate A) and the same adapter "
        "bytes (gate B)"
    )


def check(tour: Tour, console: Console) -> str:
    console.print(
        "\n[bold]5. Check[/] — twinrun check --quick -- twinrun tune sft ... --seed {seed} "
        "--output {out}  (three processes: seeds 0, 0, 1; the first 3 steps)"
    )
    from twinrun.harness.metrics import format_verdict

    verdict = quick_check(tour)
    for line in format_verdict(verdict):
        console.print(f"   {line}")
    if not verdict.passed:
        raise ContractError("the demo's determinism check failed", "report this")
    return "separate processes at one seed agree bit for bit; another seed differs"
