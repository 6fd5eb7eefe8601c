"""Benchmark: peak memory of GRPO on SmolLM2-135M-Instruct — single-turn against multi-turn tool
GRPO at the same settings — and where the multi-turn peak goes.

Four configurations, each a fresh `twinrun tune grpo` process, at the same settings: the shipped
arithmetic rows (`src/twinrun/examples/arith.jsonl`), 2 prompts x group 4 = 8 episodes a step, the
8 rows of a step in one update forward, at most 32 new tokens per model turn, token cap 256,
temperature 1, LoRA rank 8 / alpha 16 on q/k/v/o, f32, eager attention, chat template on,
`--diag`, one thread, native CPU kernels, 2 steps:

1. single-turn: `--env arithmetic` (one completion per episode);
2. multi-turn: `--env calculator --max-turns 3` (the built-in calculator tool environment:
   SmolLM2's template does not render tools, so every row starts with the system message that
   lists them, then up to 3 model turns and the environment's replies);
3. multi-turn with `--gradient-checkpointing` (each decoder layer recomputed in the backward:
   the same bytes, tests/integration/test_tool_grpo.py);
4. the same with glibc's mmap threshold fixed at 1 MiB (`MALLOC_MMAP_THRESHOLD_` in the
   process's environment; no byte changes): by default glibc raises the threshold to the size of
   each large block freed, so later blocks up to 32 MiB come from the heap, and what is freed
   there stays resident; with the threshold fixed every block of 1 MiB or more goes back to the
   system when freed, so the peak is close to what the tensors need — at the cost of a page
   fault per page of every such block (the rollout's growing KV caches above all).

Every process runs this file's child (`--child`): `twinrun.cli.main.run_cli(args)` in the process
under a `torch.autograd.graph.saved_tensors_hooks` pair that only counts what autograd keeps for
the backward (the tensors are passed through unchanged), by kind — eager attention's
probabilities (rows x heads x W x W), vocabulary-wide float64 and float32 tensors (log-softmax
rows, logits), and the other activations; model parameters are not counted — and writes: the
peak RSS (`VmHWM`), the peak RSS before the first update forward (the model load and step 0's
rollout: every turn sampled and every environment reply), the largest amount kept for the
backward at once with its split by kind, and the largest update forward's rows x width (read off
its hidden states). Per-step `rollout_s` / `update_s` / `wall_s` come from metrics.jsonl, the turns
per episode from the diag's observation leaves, the process CPU seconds from `os.wait4`. The
configurations alternate order over `--repeats` rounds; figures are median (min–max) over them.

    python -m bench grpo_memory [--repeats 2] [--steps 2] [--src-from REV]

Writes bench/results/grpo_memory.json, .md, the `grpo_memory` section of docs/benchmarks.md and
the figures in docs/tool-environments.md. `--src-from REV` measures the twinrun of git revision
REV instead of the working tree (its src/, exported) and only prints (a before/after check).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchkit
from benchkit import cpu_name, git, package_versions, smollm2_dir, spread, update_docs_section

ROOT = Path(__file__).resolve().parent.parent
RESULTS = benchkit.RESULTS
THIS = str(Path(__file__).resolve())
EXAMPLES = ROOT / "src" / "twinrun" / "examples" / "arith.jsonl"
TOOL_DOCS = ROOT / "docs" / "tool-environments.md"
MIB = 2**20

SETTINGS = {
    "seed": 1, "prompts_per_step": 2, "group_size": 4, "batch_size": 8, "max_new_tokens": 32,
    "token_cap": 256, "max_turns": 3, "lora_rank": 8, "lora_alpha": 16, "threads": 1,
}  # fmt: skip
TOOLS = ["--env", "calculator", "--max-turns", "3", "--tool-timeout", "30"]
GC = "--gradient-checkpointing"
FIXED_THRESHOLD = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}  # glibc: mmap every block >= 1 MiB
# name -> extra flags, extra environment
SINGLE, MULTI = "single-turn", "multi-turn"
MULTI_GC, MULTI_GC_FIXED = f"{MULTI}, {GC}", f"{MULTI}, {GC}, 1 MiB mmap threshold"
CONFIGS: dict[str, tuple[list[str], dict[str, str]]] = {
    SINGLE: (["--env", "arithmetic"], {}),
    MULTI: (TOOLS, {}),
    MULTI_GC: ([*TOOLS, GC], {}),
    MULTI_GC_FIXED: ([*TOOLS, GC], FIXED_THRESHOLD),
}
KINDS = ("attention T x T", "vocabulary-wide float64", "vocabulary-wide float32", "other")


# ----------------------------------------------------------------------------- the child


def status_kib(field: str) -> int:
    """A `/proc/self/status` field in KiB (VmRSS, VmHWM)."""
    with open("/proc/self/status", encoding="ascii") as f:
        return int(next(ln for ln in f if ln.startswith(field + ":")).split()[1])


class SavedTally:
    """What autograd keeps for the backward, live, by kind: a storage counts once, from its first
    saved tensor until the last of them is released (the graph freed); parameters never."""

    def __init__(self, vocab: int, hidden: int) -> None:
        self.vocab, self.hidden = vocab, hidden
        self.refs: dict[int, int] = {}  # storage -> saved tensors holding it
        self.kind_of: dict[int, tuple[str, int]] = {}  # storage -> (kind, bytes)
        self.live = dict.fromkeys(KINDS, 0)
        self.peak: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.forward = (0, 0)  # the largest update forward: rows, width (its hidden states)
        self.rss_before_update_kib: int | None = None

    def kind(self, t: Any) -> str:
        if len(t.shape) == 4 and t.shape[-1] == t.shape[-2] > 1:
            return KINDS[0]
        if len(t.shape) and t.shape[-1] == self.vocab:
            return KINDS[1] if t.dtype.itemsize == 8 else KINDS[2]
        return KINDS[3]

    def pack(self, t: Any) -> Any:
        import weakref

        import torch

        if isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter):
            return t
        if self.rss_before_update_kib is None:
            self.rss_before_update_kib = status_kib("VmHWM")
        key = t.untyped_storage().data_ptr()
        if self.refs.get(key, 0) == 0:
            self.kind_of[key] = (self.kind(t), t.untyped_storage().nbytes())
            kind, size = self.kind_of[key]
            self.live[kind] += size
            if sum(self.live.values()) > sum(self.peak.values()):
                self.peak = dict(self.live)
        if len(t.shape) == 3 and t.shape[-1] == self.hidden:
            self.forward = max(self.forward, (t.shape[0], t.shape[1]), key=lambda f: f[0] * f[1])
        self.refs[key] = self.refs.get(key, 0) + 1
        held = Held(t)
        weakref.finalize(held, self.release, key)
        return held

    def release(self, key: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            kind, size = self.kind_of.pop(key)
            self.live[kind] -= size

    @staticmethod
    def unpack(held: Any) -> Any:
        return held.tensor if isinstance(held, Held) else held


class Held:
    """A saved tensor as autograd holds it: released when the graph lets it go."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor


def child(report: str, args: list[str]) -> int:
    """One configuration: `run_cli(args)` in this process, what it keeps for the backward
    counted; writes the report."""
    import torch

    from twinrun.cli.main import run_cli

    model = Path(args[args.index("--model") + 1])
    config = json.loads((model / "config.json").read_text())
    tally = SavedTally(int(config["vocab_size"]), int(config["hidden_size"]))
    with torch.autograd.graph.saved_tensors_hooks(tally.pack, tally.unpack):
        code = run_cli(args)
    rows, width = tally.forward
    Path(report).write_text(json.dumps({
        "code": code, "peak_rss_kib": status_kib("VmHWM"),
        "peak_rss_before_update_kib": tally.rss_before_update_kib,
        "saved_peak_bytes": tally.peak, "update_rows": rows, "update_width": width,
    }))  # fmt: skip
    return code


# ----------------------------------------------------------------------------- the parent


def grpo_args(model: Path, out: Path, steps: int, extra: list[str]) -> list[str]:
    s = SETTINGS
    return [
        "tune", "grpo", "--model", str(model), "--examples", str(EXAMPLES), "--output", str(out),
        "--seed", str(s["seed"]), "--steps", str(steps),
        "--prompts-per-step", str(s["prompts_per_step"]), "--group-size", str(s["group_size"]),
        "--batch-size", str(s["batch_size"]), "--max-new-tokens", str(s["max_new_tokens"]),
        "--token-cap", str(s["token_cap"]), "--temperature", "1.0", "--clip-eps", "0.2",
        "--advantage-clip", "5", "--learning-rate", "1e-3", "--warmup-steps", "0",
        "--lr-schedule", "constant", "--lora-rank", str(s["lora_rank"]),
        "--lora-alpha", str(s["lora_alpha"]), "--precision", "f32", "--chat-template", "on",
        "--threads", str(s["threads"]), "--cpu-kernels", "native", "--diag", "--quiet", *extra,
    ]  # fmt: skip


def child_env(src: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")}
    return env | {"PYTHONPATH": f"{src}{os.pathsep}{ROOT / 'bench'}", "OMP_NUM_THREADS": "1"}


def turns_per_episode(diag: Path) -> float:
    """Mean model turns per episode: the diag's `observation.prompt_G[.sample_K].turn_T` leaves
    (a single-turn prompt group's one observation stands for its group's episodes)."""
    per_step = []
    for line in diag.read_text().splitlines():
        keys = [k for k in json.loads(line)["checksums"] if k.startswith("observation.prompt_")]
        if any(".sample_" in k for k in keys):
            per_step.append(len(keys) / len({k.rsplit(".turn_", 1)[0] for k in keys}))
        else:
            per_step.append(1.0)
    return statistics.mean(per_step)


def run_config(model: Path, work: Path, name: str, steps: int, src: Path) -> dict[str, Any]:
    out, report = work / f"run-{time.monotonic_ns()}", work / f"report-{time.monotonic_ns()}"
    flags, extra_env = CONFIGS[name]
    cmd = [sys.executable, THIS, "--child", str(report), *grpo_args(model, out, steps, flags)]
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, env=child_env(src) | extra_env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            sys.exit(f"{name} failed:\n{err.read()[-4000:]}")
    got = json.loads(report.read_text())
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    saved = got["saved_peak_bytes"]
    res = {
        "peak_rss_mib": got["peak_rss_kib"] / 1024,
        "peak_rss_before_update_mib": got["peak_rss_before_update_kib"] / 1024,
        "saved_peak_mib": {k: saved[k] / MIB for k in KINDS},
        "saved_peak_total_mib": sum(saved.values()) / MIB,
        "update_rows": got["update_rows"], "update_width": got["update_width"],
        "wall_s": [m["wall_s"] for m in metrics], "rollout_s": [m["rollout_s"] for m in metrics],
        "update_s": [m["update_s"] for m in metrics],
        "model_tokens_per_episode": statistics.mean(m["active_tokens"] for m in metrics)
        / (SETTINGS["prompts_per_step"] * SETTINGS["group_size"]),
        "turns_per_episode": turns_per_episode(out / "diag.jsonl"),
        "process_cpu_s": usage.ru_utime + usage.ru_stime,
    }  # fmt: skip
    print(f"  {name}: peak {res['peak_rss_mib']:.0f} MiB (before the update "
          f"{res['peak_rss_before_update_mib']:.0f}), kept for the backward "
          f"{res['saved_peak_total_mib']:.0f} MiB, update forward {res['update_rows']} x "
          f"{res['update_width']}, steps {[round(x, 1) for x in res['wall_s']]} s",
          file=sys.stderr, flush=True)  # fmt: skip
    return res


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median (min–max) of each figure over the repeats."""

    def over(key: str, sub: str | None = None) -> dict[str, Any]:
        return spread([r[key][sub] if sub else r[key] for r in runs], 1)

    return {
        "peak_rss_mib": over("peak_rss_mib"),
        "peak_rss_before_update_mib": over("peak_rss_before_update_mib"),
        "saved_peak_total_mib": over("saved_peak_total_mib"),
        "saved_peak_mib": {k: over("saved_peak_mib", k) for k in KINDS},
        "update_rows": runs[0]["update_rows"], "update_width": runs[0]["update_width"],
        "step_s": spread([x for r in runs for x in r["wall_s"]], 2),
        "rollout_s": spread([x for r in runs for x in r["rollout_s"]], 2),
        "update_s": spread([x for r in runs for x in r["update_s"]], 2),
        "process_cpu_s": spread([r["process_cpu_s"] for r in runs], 1),
        "turns_per_episode": statistics.mean(r["turns_per_episode"] for r in runs),
        "model_tokens_per_episode": statistics.mean(r["model_tokens_per_episode"] for r in runs),
    }  # fmt: skip


def measure(repeats: int, steps: int, src: Path) -> dict[str, Any]:
    model = smollm2_dir()
    names = list(CONFIGS)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for name in benchkit.alternating(names, r):
                runs[name].append(run_config(model, Path(tmp), name, steps, src))
    by = {n: summarise(runs[n]) | {"runs": runs[n]} for n in names}
    single = by[SINGLE]["peak_rss_mib"]["median"]
    return {
        "configs": by,
        "ratio_to_single_turn": {n: by[n]["peak_rss_mib"]["median"] / single for n in names},
    }


# ----------------------------------------------------------------------------- the report


def fmt(s: dict[str, Any], digits: int = 0) -> str:
    if s["min"] == s["max"]:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def peak(res: dict[str, Any], name: str) -> str:
    """A configuration's median peak RSS and its ratio to single-turn's."""
    mib = res["configs"][name]["peak_rss_mib"]["median"]
    return f"{mib:.0f} MiB (**{res['ratio_to_single_turn'][name]:.2f}×**)"


def headline(res: dict[str, Any]) -> str:
    """The figures docs/tool-environments.md quotes."""
    single = res["configs"][SINGLE]["peak_rss_mib"]["median"]
    return (
        f"Peak RSS on SmolLM2-135M-Instruct, 8 episodes a step, ≤ 32 new tokens per turn, one "
        f"thread, `--diag` (`python -m bench grpo_memory`, {res['when']}, commit {res['git']}; "
        f"median of {res['repeats']} processes): single-turn {single:.0f} MiB; multi-turn with "
        f"the calculator (≤ 3 turns) {peak(res, MULTI)}; with `{GC}` {peak(res, MULTI_GC)}; and "
        f"with glibc's mmap threshold fixed at 1 MiB too (`MALLOC_MMAP_THRESHOLD_=1048576`) "
        f"{peak(res, MULTI_GC_FIXED)}."
    )


def setup_line(res: dict[str, Any]) -> str:
    s = SETTINGS
    return (
        f"Measured {res['when']} by `{res['command']}` on {res['cpus']} CPUs ({res['cpu']}), "
        f"torch {res['versions']['torch']}, transformers {res['versions']['transformers']}, "
        f"commit {res['git']}{' + uncommitted src/ edits' if res['src_dirty'] else ''}; load "
        f"average {res['load'][0]:.2f} at start, {res['load'][1]:.2f} at end (a shared machine: "
        "the times are indicative; the memory is not disturbed by it, but glibc's heap makes "
        "the default allocator's peaks vary from process to process). SmolLM2-135M-Instruct, "
        f"{s['prompts_per_step']} prompts × group {s['group_size']} = "
        f"{s['prompts_per_step'] * s['group_size']} episodes a step, one update forward of "
        f"{s['batch_size']} rows, ≤ {s['max_new_tokens']} new tokens per model turn, token cap "
        f"{s['token_cap']}, LoRA rank {s['lora_rank']} on q/k/v/o, f32, eager attention, "
        f"`--diag`, one thread, {res['steps']} steps per process, {res['repeats']} process(es) "
        "per configuration (order alternating); median (min–max) over them."
    )


def peak_table(res: dict[str, Any]) -> list[str]:
    by, ratio = res["configs"], res["ratio_to_single_turn"]
    lines = [
        "| configuration | peak RSS MiB | × single-turn | peak before the first update MiB | "
        "update forward rows × width | turns per episode | model tokens per episode | "
        "s/step | update s/step | process CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in by.items():
        lines.append(
            f"| {name} | **{fmt(c['peak_rss_mib'])}** | {ratio[name]:.2f}× | "
            f"{fmt(c['peak_rss_before_update_mib'])} | {c['update_rows']} × {c['update_width']} "
            f"| {c['turns_per_episode']:.2f} | {c['model_tokens_per_episode']:.1f} | "
            f"{fmt(c['step_s'], 1)} | {fmt(c['update_s'], 1)} | {fmt(c['process_cpu_s'])} |"
        )
    return lines


def kept_table(res: dict[str, Any]) -> list[str]:
    lines = [
        "| configuration | total | eager attention T × T | vocabulary-wide float64 | "
        "vocabulary-wide float32 | other activations |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in res["configs"].items():
        kinds = " | ".join(fmt(c["saved_peak_mib"][k]) for k in KINDS)
        lines.append(f"| {name} | {fmt(c['saved_peak_total_mib'])} | {kinds} |")
    return lines


def render(res: dict[str, Any]) -> str:
    by = res["configs"]
    multi, single = by[MULTI], by[SINGLE]
    cpu = by[MULTI_GC_FIXED]["process_cpu_s"]["median"] / by[MULTI_GC]["process_cpu_s"]["median"]
    return "\n".join([
        setup_line(res), "", *peak_table(res), "",
        "What autograd keeps for the backward at its most (MiB; model parameters not counted), "
        "by kind:", "", *kept_table(res), "",
        f"Where it goes. A multi-turn row holds the tools' system message, every model turn and "
        f"every reply: the update forward is {multi['update_rows']} × {multi['update_width']} "
        f"tokens against single-turn's {single['update_rows']} × {single['update_width']}, and "
        "what its backward keeps grows with the tokens — the per-layer activations, and eager "
        "attention's probabilities with their square. The update adds little on top: the kept "
        "positions' float64 log-softmax runs 64 positions at a time, each chunk recomputed in "
        "the backward (`kept_logprobs`), so only the kept positions' float32 logits are kept "
        f"({fmt(multi['saved_peak_mib'][KINDS[2]])} MiB; before, their float64 log-softmax: "
        "twice that). The rest of "
        "the peak is the [rows, T, vocabulary] float32 logits (kept for `--diag`'s "
        "`forward.logits`) and their gradient, and what glibc keeps of the memory freed on its "
        f"heap. `{GC}` keeps one hidden state per decoder layer and recomputes the rest layer by "
        "layer in the backward (one more forward of the update); fixing glibc's mmap threshold "
        "at 1 MiB returns every freed block of 1 MiB or more at once, for "
        f"{100 * (cpu - 1):+.0f}% process CPU time here (a page fault per page of every such "
        "block).",
    ])  # fmt: skip


def write_results(res: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "grpo_memory.json").write_text(json.dumps(res, indent=2) + "\n")
    body = render(res)
    (RESULTS / "grpo_memory.md").write_text("# GRPO peak memory: single-turn vs multi-turn\n\n"
                                            + body + "\n")  # fmt: skip
    update_docs_section(
        "grpo_memory",
        "GRPO peak memory: single-turn vs multi-turn tool environments",
        "Peak RSS of single-turn GRPO against multi-turn tool GRPO on SmolLM2-135M-Instruct at "
        "the same settings, and what the backward keeps. Generated by `python "
        "bench/grpo_memory.py` (also in `bench/results/grpo_memory.md`); do not edit between "
        "the markers.",
        body,
    )
    update_docs_section("grpo_memory_figures", "", "", headline(res), docs=TOOL_DOCS)
    print(body)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        sys.exit(child(sys.argv[2], sys.argv[3:]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="processes per configuration")
    ap.add_argument("--steps", type=int, default=2, help="steps per process")
    ap.add_argument("--src-from", metavar="REV", help="measure REV's src/; print only")
    a = ap.parse_args()
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        src = ROOT / "src"
        if a.src_from:
            archive = subprocess.run(["git", "archive", a.src_from, "src"], cwd=ROOT, check=True,
                                     capture_output=True).stdout  # fmt: skip
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            src = Path(tmp) / "src"
        measured = measure(a.repeats, a.steps, src)
    argv = ["python", "bench/grpo_memory.py"]
    if a.repeats != 2:
        argv += ["--repeats", str(a.repeats)]
    if a.steps != 2:
        argv += ["--steps", str(a.steps)]
    res = {
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join(argv), "cpus": os.cpu_count(), "cpu": cpu_name(),
        "versions": package_versions("torch", "transformers"),
        "git": git("rev-parse", "--short", "HEAD") if not a.src_from else a.src_from,
        "src_dirty": not a.src_from and bool(git("status", "--porcelain", "--", "src")),
        "load": [load0, os.getloadavg()[0]], "script_wall_s": time.perf_counter() - t0,
        "repeats": a.repeats, "steps": a.steps, "settings": SETTINGS, **measured,
    }  # fmt: skip
    if a.src_from:
        print(json.dumps(res, indent=2))
        print(render(res))
        return
    write_results(res)


if __name__ == "__main__":
    main()
