"""The guided tour behind `twinrun demo`, as a library function."""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.table import Table

DEMO_SEEDS = (1, 1, 2)


def shipped_examples(name: str = "sft.jsonl") -> Path:
    return Path(str(resources.files("twinrun") / "examples" / name))


def run_demo(root: Path, threads: int | None = None) -> dict[str, str]:
    from twinrun.config.run import RunConfig
    from twinrun.infer.evaluate import EvalConfig, run_evaluate
    from twinrun.infer.generate import GenerateConfig, run_generate
    from twinrun.model.toy import write_toy_checkpoint
    from twinrun.train.recipes.sft import train_sft

    console = Console(stderr=False, highlight=False)
    t0 = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    model = root / "toy-model"
    examples = shipped_examples()
    console.print(f"[bold]1.[/] writing the toy Llama checkpoint to {model} (seed 0)")
    write_toy_checkpoint(model, seed=0, overwrite=True)

    shas: dict[str, str] = {}
    losses: dict[str, float] = {}
    for name, seed in zip(("run-a", "run-b", "run-c"), DEMO_SEEDS, strict=True):
        console.print(f"[bold]2.[/] SFT {name} at seed {seed} on {examples.name} (64 examples)")
        cfg = RunConfig(
            objective="sft",
            model=str(model),
            examples=str(examples),
            output=str(root / name),
            seed=seed,
            epochs=2,
            batch_size=4,
            accumulation=2,
            learning_rate=5e-3,
            warmup_steps=2,
            lr_schedule="cosine",
            lora_rank=8,
            lora_alpha=16.0,
            precision="f32",
            chat_template="on",
            diag=True,
            threads=threads,
            overwrite=True,
            quiet=True,
        )
        record = train_sft(cfg)
        shas[name] = record["adapter"]["sha256"]
        losses[name] = record["metrics"]["final_loss"]

    table = Table(title="adapter_model.safetensors SHA256")
    table.add_column("run")
    table.add_column("seed")
    table.add_column("final loss")
    table.add_column("sha256 (first 24 hex digits)")
    for (name, sha), seed in zip(shas.items(), DEMO_SEEDS, strict=True):
        table.add_row(name, str(seed), f"{losses[name]:.6f}", sha[:24])
    console.print(table)
    from twinrun.diag.compare import compare

    same_diff = compare(root / "run-a", root / "run-b", bitwise=True)
    other_diff = compare(root / "run-a", root / "run-c", bitwise=True)
    console.print(
        f"   twinrun diff run-a run-b --bitwise: "
        f"{'DETERMINISTIC' if same_diff.deterministic else 'DIVERGED'} "
        f"({same_diff.rows_compared} steps, every leaf bit-identical)"
    )
    if other_diff.first is not None:
        console.print(
            f"   twinrun diff run-a run-c --bitwise: first divergence at step "
            f"{other_diff.first.step}, leaf {other_diff.first.leaf} (the seed changes the "
            "shuffle and the LoRA init)"
        )

    report_path = root / "run-a" / "evaluate.json"
    report = run_evaluate(
        EvalConfig(
            model=str(model),
            adapter=str(root / "run-a"),
            examples=str(examples),
            chat_template="on",
            precision="f32",
            batch_size=8,
            output=str(report_path),
            threads=threads,
            overwrite=True,
        )
    )
    base = run_evaluate(
        EvalConfig(
            model=str(model),
            examples=str(examples),
            chat_template="on",
            precision="f32",
            batch_size=8,
            output=str(root / "base-evaluate.json"),
            threads=threads,
            overwrite=True,
        )
    )
    prompt = "What is 2 + 3?"
    gen = run_generate(
        GenerateConfig(
            model=str(model),
            adapter=str(root / "run-a"),
            prompt=prompt,
            max_new_tokens=8,
            temperature=0.0,
            chat_template="on",
            seed=0,
            precision="f32",
            threads=threads,
        )
    )
    same = shas["run-a"] == shas["run-b"]
    differ = shas["run-a"] != shas["run-c"]
    console.print(
        f"[bold]3.[/] evaluate: mean loss {base['loss']:.4f} (base) -> "
        f"{report['loss']:.4f} (run-a adapter) -> {report_path}"
    )
    console.print(
        f"[bold]4.[/] generate (greedy) {prompt!r} -> {gen['text']!r} "
        f"({len(gen['tokens'])} tokens; the toy model is random and tiny: it learns the shape "
        "of the data, such as where an answer ends, not arithmetic)"
    )
    console.print()
    console.print("[bold]Summary[/]")
    console.print(f"  same seed, same bytes:      {'yes' if same else 'NO'} (run-a vs run-b)")
    console.print(f"  other seed, other bytes:    {'yes' if differ else 'NO'} (run-a vs run-c)")
    console.print(
        f"  compare two runs step by step: twinrun diff {root / 'run-a'} {root / 'run-b'}"
    )
    console.print(f"  every number of a run is in {root / 'run-a' / 'twinrun.json'}")
    console.print(
        "  ask whether any command reproduces: twinrun check -- <command with {seed} {out}>"
    )
    console.print(f"  demo took {time.perf_counter() - t0:.1f} s")
    if not (same and differ):
        from twinrun.core.errors import ContractError

        raise ContractError(
            "the demo's reproducibility check failed",
            "report this with the demo directory's twinrun.json files",
        )
    return shas
