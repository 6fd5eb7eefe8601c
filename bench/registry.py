"""Every benchmark in bench/, one record each: its name, what it measures, its goal, the result
files it writes, the script that runs it and what `--quick` means for it.

A record's script is `bench/<script>.py`, run as a fresh process with the arguments given; its
`quick` arguments are that script's own small settings (toy model, one repeat, tiny sizes), so
that `python -m bench NAME --quick` takes seconds. A benchmark that cannot be made that small
(TRL in its own environment, SmolLM2 and minutes, torchrun and several processes) says why in
`quick_skip`, and its `--quick` prints `NAME: skipped: needs ...` instead of running.

Kinds: `benchmark` (timings and memory, with or without a goal), `check` (compares bytes or ids
and exits 1 on a difference), `sweep` (hostile inputs: counts the cases that hold; the seeded,
bounded versions that fail CI are tests, named in `tests`), `example` (a worked example, run end
to end). `HELPERS` names every other script in bench/ and what it is for, so that a new script
is registered or named here (tests/integration/test_bench_smoke.py checks it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent

TRL = "TRL in bench/.venv-trl (made by the benchmark itself, minutes) and minutes per side"
SMOLLM2 = "SmolLM2-135M-Instruct (a 520 MiB checkpoint, built once) and minutes per process"
TORCHRUN = "torchrun with 2-3 processes per point and minutes"


@dataclass(frozen=True, kw_only=True)
class Benchmark:
    name: str
    """What `python -m bench NAME` calls it (and its results are called)."""
    measures: str
    """One line: what it measures."""
    goal: str | None
    """The goal its results judge, or None where the figures only inform."""
    results: tuple[str, ...]
    """The files it writes under bench/results/ (its docs section is written beside them)."""
    script: str
    """bench/<script>.py runs it."""
    quick: tuple[str, ...] = ()
    """The script's own arguments that make a seconds-long run (`--quick`)."""
    quick_skip: str | None = None
    """Why `--quick` cannot run it in seconds: what it needs. None: `quick` runs it."""
    kind: str = "benchmark"
    tests: tuple[str, ...] = field(default=())
    """For a sweep or check: the tests that run its seeded, bounded version in CI."""

    @property
    def path(self) -> Path:
        return BENCH / f"{self.script}.py"


def _files(name: str) -> tuple[str, ...]:
    return (f"{name}.json", f"{name}.md")


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        name="sumsq",
        measures="exact twinrun.diag.sumsq against a naive float64 sum of squares, in one process",
        goal="exact <= 3x naive (float32, median)",
        results=_files("sumsq"),
        script="sumsq",
        quick=("--n", "65536", "--repeats", "1"),
    ),
    Benchmark(
        name="diff_large",
        measures="a fresh `twinrun diff` process on 10,000- and 100,000-row diag files: time, RSS",
        goal="<= 3 s at 100,000 rows, and peak memory flat in the row count",
        results=_files("diff_large"),
        script="diff_large",
        quick=("--rows", "200", "400", "--repeats", "1"),
    ),
    Benchmark(
        name="capture_replay",
        measures="`twinrun explain` against hashlib, and a GRPO replay against its source step",
        goal="explain >= 0.8x hashlib's throughput; replay >= 5x faster than the source step",
        results=_files("capture_replay"),
        script="capture_replay",
        quick=("--repeats", "1", "--sizes", "1:1", "--explain-repeats", "1"),
    ),
    Benchmark(
        name="strict_mode",
        measures="what --strict costs per SFT step against --no-strict, and whether a byte moves",
        goal=None,
        results=_files("strict_mode"),
        script="strict_mode",
        quick=("--pairs", "1", "--no-smollm2"),
    ),
    Benchmark(
        name="grpo",
        measures="GRPO rollout vs update seconds, and the sampler's tokens/s against HF generate",
        goal="sampler >= 1.0x HF generate (tokens/s, medians)",
        results=_files("grpo"),
        script="grpo",
        quick=(
            "--quick",
            "--write",
            "--steps",
            "3",
            "--repeats",
            "1",
            "--prompts",
            "1",
            "--new-tokens",
            "4",
        ),  # fmt: skip
    ),
    Benchmark(
        name="diag_overhead",
        measures="what --diag costs per SFT step (SmolLM2 and toy), at load 0 and load 1",
        goal="<= 5% per SmolLM2 step (the hook inside the run), at load 0 and at load 1",
        results=_files("diag_overhead"),
        script="diag_overhead",
        quick_skip="5 or more fresh training processes per round at two loads (a minute)",
    ),
    Benchmark(
        name="sft_epoch",
        measures="SFT seconds per epoch against a plain PyTorch + PEFT loop, and process time",
        goal="twinrun / plain <= 1.05 per epoch; whole 1-epoch process <= 4 s",
        results=_files("sft_epoch"),
        script="sft_epoch",
        quick_skip="a 1- and a 9-epoch process per loop and batch size (a minute)",
    ),
    Benchmark(
        name="resume_prefetch",
        measures="step time with --prefetch 0 vs 4, checkpoint writes, resume start-up",
        goal=None,
        results=_files("resume_prefetch"),
        script="resume_prefetch",
        quick_skip="six 2-epoch training processes on the 64 shipped examples (a minute)",
    ),
    Benchmark(
        name="batch_invariant",
        measures="what --batch-invariant costs against ordinary batching at batch 8",
        goal="<= 1.3x ordinary batching",
        results=_files("batch_invariant"),
        script="batch_invariant",
        quick_skip="a 1- and a multi-epoch process per mode, row length and width (minutes)",
    ),
    Benchmark(
        name="pairs_epoch",
        measures="per-epoch CPU seconds of tune dpo / tune reward at batch 1, 4, 8",
        goal=None,
        results=_files("pairs_epoch"),
        script="pairs_epoch",
        quick_skip="a 1- and a multi-epoch process per objective and batch size (minutes)",
    ),
    Benchmark(
        name="batching_table",
        measures="how many of 64 per-example losses are bitwise equal at batch 1 and batch 8",
        goal=None,
        results=_files("batching_table"),
        script="batching_table",
        quick_skip="a snapshot of src/ and 4 evaluation processes on two models (a minute)",
    ),
    Benchmark(
        name="portable_cost",
        measures="what --cpu-kernels portable costs per SFT step against native kernels",
        goal=None,
        results=_files("portable_cost"),
        script="portable_cost",
        quick_skip="6 or more fresh training processes, then SmolLM2 (minutes)",
    ),
    Benchmark(
        name="portable_profile",
        measures="where a portable SmolLM2 step's time goes, part by part, against a native step",
        goal=None,
        results=_files("portable_profile"),
        script="portable_profile",
        quick_skip=SMOLLM2,
    ),
    Benchmark(
        name="portable_loss_curve",
        measures="a 100-step portable SmolLM2 SFT loss curve against 3 native seeds",
        goal=None,
        results=_files("portable_loss_curve"),
        script="portable_loss_curve",
        quick_skip=SMOLLM2,
    ),
    Benchmark(
        name="real_model",
        measures="SmolLM2 SFT seconds per step against transformers + PEFT, and peak RSS",
        goal="twinrun / plain <= 1.0 per step",
        results=_files("real_model"),
        script="real_model",
        quick_skip=SMOLLM2,
    ),
    Benchmark(
        name="utilisation",
        measures="how much of the machine's f32 matmul rate a SmolLM2 SFT step achieves",
        goal=None,
        results=_files("utilisation"),
        script="utilisation",
        quick_skip=SMOLLM2,
    ),
    Benchmark(
        name="scaling",
        measures="how a SmolLM2 SFT step grows with sequence, batch and processes vs its FLOPs",
        goal=None,
        results=_files("scaling"),
        script="scaling",
        quick_skip=SMOLLM2,
    ),
    Benchmark(
        name="long_rows_memory",
        measures="peak RSS of one SmolLM2 training step per objective at 2,048 and 8,192 tokens",
        goal="<= 2 GB at 2,048 tokens and <= 4 GB at 8,192, every objective",
        results=_files("long_rows_memory"),
        script="long_rows_memory",
        quick_skip=SMOLLM2,
    ),
    Benchmark(
        name="long_rows_speed",
        measures="a 2,048-token SmolLM2 SFT step: blockwise + checkpointing vs eager, FLOP rate",
        goal="blockwise + checkpointing <= 1.5x eager's step",
        results=_files("long_rows_speed"),
        script="long_rows_speed",
        quick=("--quick",),
    ),
    Benchmark(
        name="grpo_memory",
        measures="peak RSS of single-turn against multi-turn tool GRPO on SmolLM2",
        goal="multi-turn <= 2x single-turn's peak",
        results=_files("grpo_memory"),
        script="grpo_memory",
        quick_skip=SMOLLM2,
    ),
    Benchmark(
        name="distributed",
        measures="SFT on 1 vs 2 processes, bytes per step, ordered gather vs all-reduce",
        goal=None,
        results=_files("distributed"),
        script="distributed",
        quick_skip=TORCHRUN,
    ),
    Benchmark(
        name="shard_base",
        measures="--shard-base (FSDP2) against unsharded runs: memory, step time, bytes sent",
        goal=None,
        results=_files("shard_base"),
        script="shard_base",
        quick_skip=TORCHRUN,
    ),
    Benchmark(
        name="sft_vs_trl",
        measures="the toy SFT process against TRL's SFTTrainer, and where each side's time goes",
        goal="twinrun / TRL <= 0.7 (whole process)",
        results=_files("sft_vs_trl"),
        script="sft_vs_trl",
        quick_skip=TRL,
    ),
    Benchmark(
        name="grpo_vs_trl",
        measures="a GRPO step in twinrun against TRL's GRPOTrainer, same model and config",
        goal="twinrun / TRL <= 1.0 per step",
        results=_files("grpo_vs_trl"),
        script="grpo_vs_trl",
        quick_skip=TRL,
    ),
    Benchmark(
        name="tool_grpo_vs_trl",
        measures="multi-turn tool GRPO against TRL's environment_factory, and what --diag costs",
        goal=None,
        results=_files("tool_grpo_vs_trl"),
        script="tool_grpo_vs_trl",
        quick_skip=TRL,
    ),
    Benchmark(
        name="trl_tokens",
        measures="token ids and loss masks against TRL's own trainers, row by row",
        goal="every id and mask equal (exit 1 on any other difference)",
        results=_files("trl_tokens"),
        script="trl_tokens",
        quick_skip=TRL,
        kind="check",
        tests=("tests/real/test_smollm2_tokens.py",),
    ),
    Benchmark(
        name="tool_calling_smollm2",
        measures="SmolLM2 learns to call a tool: SFT, then multi-turn GRPO, end to end",
        goal=None,
        results=_files("tool_calling_smollm2"),
        script="tool_calling_smollm2",
        quick_skip=SMOLLM2,
        kind="example",
    ),
    Benchmark(
        name="hostile_sweep",
        measures="hostile inputs, byte flips, kills and canaries: internal errors and leaks",
        goal="0 internal errors, every flip refused, every crash bit-exact, 0 canaries leaked",
        results=_files("hostile_sweep"),
        script="hostile_sweep",
        quick_skip="kills and reruns of real training processes in every section (minutes)",
        kind="sweep",
        tests=(
            "tests/unit/test_hostile_parsers.py",
            "tests/integration/test_hostile_inputs.py",
            "tests/integration/test_hostile_reads.py",
        ),
    ),
    Benchmark(
        name="hostile_round4",
        measures="round 4's hostile cases, each a real twinrun process under time and memory caps",
        goal="every case refused in one line with nothing lost and nothing run",
        results=_files("hostile_round4"),
        script="hostile_round4",
        quick_skip="a real twinrun process per case, some of them training (minutes)",
        kind="sweep",
        tests=("tests/integration/test_one_line_refusals.py",),
    ),
    Benchmark(
        name="hostile_round5",
        measures="round 4's cases plus round 5's, each a real twinrun process",
        goal="every case refused in one line with nothing lost and nothing run",
        results=_files("hostile_round5"),
        script="hostile_round5",
        quick_skip="a real twinrun process per case, some of them training (minutes)",
        kind="sweep",
        tests=("tests/integration/test_one_line_round5.py",),
    ),
    Benchmark(
        name="setup_trace",
        measures="the modules one toy SFT run's set-up passes through, from train() to its first "
        "step: transitions and re-entries (structure, not speed)",
        goal=None,
        results=_files("setup_trace"),
        script="setup_trace",
        quick=("--quick",),
    ),
)

#: The other scripts in bench/: run by a benchmark, or the kit itself.
HELPERS: dict[str, str] = {
    "__init__": "makes bench/ a package for `python -m bench`",
    "__main__": "`python -m bench`: lists and runs the benchmarks of this registry",
    "registry": "this registry",
    "benchkit": "what the benchmark scripts share (results, docs sections, spreads, loads)",
    "plain_sft": "the plain PyTorch + PEFT loop sft_epoch and real_model time twinrun against",
    "phase_split": "runs a process with its imports and named phases timed (sft_vs_trl)",
    "batch_invariant_profile": "torch.profiler of batch-invariant mode, run by batch_invariant",
    "hostile_reliability": "the reliability sections of hostile_sweep",
    "trl_sft_child": "TRL's side of sft_vs_trl, in bench/.venv-trl",
    "trl_grpo_child": "TRL's side of grpo_vs_trl, in bench/.venv-trl",
    "trl_tool_child": "TRL's side of tool_grpo_vs_trl, in bench/.venv-trl",
    "trl_tokens_child": "TRL's side of trl_tokens, in bench/.venv-trl",
}

BY_NAME: dict[str, Benchmark] = {b.name: b for b in BENCHMARKS}
