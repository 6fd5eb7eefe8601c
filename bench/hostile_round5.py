"""The hostile sweep of round 5: round 4's cases, plus what round 5 tried — files that name
twinrun's own writers as plugins, a forged `.dist-info` in the current directory, a header that
claims 60 GB under a memory limit, the kernels `check`'s children run, unbounded rows and
`--repeat`, sidecars and file lists of the wrong shape, a file-size limit, an MCP schema holding
NaN, and Ctrl-C or SIGTERM during `export` and during a tool call that never returns.

`python -m bench hostile_round5 [--quick] [--only SUBSTRING] [--keep DIR]`

Each case is a real `python -m twinrun ...` process, run and judged as in `bench/hostile_round4.py`
(its wall-clock and address-space caps, one line, nothing lost, no marker). A signal case holds
only with the signal's exit status (130 for SIGINT, 143 for SIGTERM) and its output absent; the
`check` case holds on exit 0 when every child recorded the kernels a direct run records.
`--shard-base` cases (another `--model` on rank 1, overlapping spans) need torchrun: they are
tests (tests/distributed/test_agreement.py, tests/unit/model/test_shards.py), not cases here.

`--quick` is round 4's (a 60 MB JSON array, not 300 MB).

Writes bench/results/hostile_round5.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench import benchkit  # noqa: E402
from bench import hostile_round4 as h4  # noqa: E402
from bench.hostile_round4 import TRAIN_CAP, Case  # noqa: E402
from testkit.toy_runs import sft_args  # noqa: E402

# what any export prints on its way (its own line, the libraries' bars and deprecation notes):
# a failing export is judged by the lines it prints besides these
EXPORT_PROGRESS = ("export: merging ", "Loading weights", "Writing model shards",
                   "twinrun: warning: ")  # fmt: skip
GB = 10**9

PLUGIN = """
import os
import time


class Sleepy:  # OpenEnv-style: step() is called on every turn; it never returns
    def reset(self, **row):
        return {"observation": row["prompt"], "reward": 0.0, "done": False}

    def step(self, action):
        open(os.environ["H5_BLOCKED"], "w").close()
        time.sleep(600)


class NanSchema:  # MCP-style, with a NaN in a tool's inputSchema
    def list_tools(self):
        schema = {"type": "object", "properties": {"k": {"type": "number",
                                                         "maximum": float("nan")}}}
        return [{"name": "look", "inputSchema": schema}]

    def call_tool(self, name, arguments):
        return "ok"


def sleepy():
    return Sleepy()


def nan_schema():
    return NanSchema()
"""


def _find(doc: Any, key: str) -> list[Any]:
    """Every value under `key`, anywhere in a JSON document."""
    found, stack = [], [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found += [v for k, v in item.items() if k == key]
            stack += list(item.values())
        elif isinstance(item, list):
            stack += item
    return found


def _huge_header_model(src: Path, dst: Path, claimed: int) -> Path:
    """The toy model with `model.safetensors` replaced by a sparse file whose header claims one
    tensor of `claimed` bytes: no disk used, and any read of it is a read of `claimed` bytes."""
    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        f.unlink()
    entry = {"dtype": "F32", "shape": [claimed // 4], "data_offsets": [0, claimed]}
    header = json.dumps({"model.embed_tokens.weight": entry}).encode()
    header += b" " * (-len(header) % 8)
    with (dst / "model.safetensors").open("wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + claimed)
    return dst


def _forged_numpy(cwd: Path) -> None:
    """A `.dist-info` in `cwd` that calls itself numpy and declares `numpy:load` an
    environment: found on `sys.path` under `python -m twinrun`, which puts the cwd first."""
    info = cwd / "numpy-99.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: numpy\nVersion: 99.0\n")
    (info / "entry_points.txt").write_text("[twinrun.environments]\nload = numpy:load\n")
    (info / "top_level.txt").write_text("numpy\n")
    (info / "RECORD").write_text("")


def _nested_list(run: Path, depth: int) -> None:
    """The run's list of written files, with one line nested `depth` deep."""
    path = run / "twinrun.files.jsonl"
    path.write_text(path.read_text() + "[" * depth + "]" * depth + "\n")


def _timed(argv: list[str], work: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "twinrun", *argv], cwd=work, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    if res.returncode != 0:
        raise SystemExit(f"fixture failed: twinrun {' '.join(argv)}\n{res.stderr[-2000:]}")
    return time.perf_counter() - t0


def round5(work: Path, env: dict[str, str], quick: bool) -> list[Case]:
    """The round-5 cases, on the fixtures round 4's `build` made in `work`."""
    plugins = work / "plugins"
    (plugins / "h5_env.py").write_text(PLUGIN)
    model, arith, ex = work / "model", work / "arith.jsonl", work / "ex.jsonl"
    run_a, grpo_builtin, marks = work / "runA", work / "grpoBuiltin", work / "markers"
    outs = work / "outs5"
    outs.mkdir()
    cases: list[Case] = []
    add = cases.append

    def copy(src: Path, name: str) -> Path:
        dst = work / "r5" / name
        shutil.copytree(src, dst, symlinks=True)
        return dst

    # --- code runs: twinrun's own writers named as the environment ---
    victim = work / "r5" / "victim.txt"
    victim.parent.mkdir(exist_ok=True)
    victim.write_text("the user's file\n")
    writers = {
        "atomic_write_text": ("twinrun.core.fileio:atomic_write_text",
                              {"path": str(marks / "r5-evil.pth"), "text": "import os\n"},
                              marks / "r5-evil.pth"),
        "atomic_write_json": ("twinrun.core.fileio:atomic_write_json",
                              {"path": str(marks / "r5-evil.json"), "obj": [1]},
                              marks / "r5-evil.json"),
        "owned-remove": ("twinrun.core.owned:remove", {"entries": [str(victim)]}, None),
    }  # fmt: skip
    for name, (target, args, mark) in writers.items():
        absent = [mark] if mark is not None else []
        run = copy(grpo_builtin, f"sidecar-{name}")
        h4._edit_json(run / "twinrun.json",
                      lambda d, t=target, a=args: d["train"].update(env=t, env_args=a))  # fmt: skip
        add(Case(f"reproduce-sidecar-{name}", "code runs",
                 ["reproduce", str(run), "--output", str(outs / f"rs-{name}")], [run, victim],
                 [*absent, outs / f"rs-{name}"], cap=TRAIN_CAP))  # fmt: skip
        argv = h4.grpo_args(model, arith, outs / f"cli-{name}", target)
        for key, value in args.items():
            argv += ["--env-arg", f"{key}={json.dumps(value)}"]
        add(Case(f"cli-env-{name}", "code runs", argv, [victim],
                 [*absent, outs / f"cli-{name}" / "adapter_model.safetensors"],
                 cap=TRAIN_CAP))  # fmt: skip
    toml = work / "r5" / "writer.toml"
    toml.write_text(
        (ROOT / "examples" / "grpo.toml").read_text()
        .replace('path = "runs/toy"', f"path = {json.dumps(str(model))}")
        .replace('examples = "src/twinrun/examples/arith.jsonl"',
                 f"examples = {json.dumps(str(arith))}")
        .replace('dir = "runs/examples/grpo"', f"dir = {json.dumps(str(outs / 'toml'))}")
        .replace('name = "arithmetic"', 'name = "twinrun.core.fileio:atomic_write_text"\n'
                 "[environment.args]\n"
                 f"path = {json.dumps(str(marks / 'r5-toml.pth'))}\ntext = \"import os\"")
    )  # fmt: skip
    add(Case("toml-env-atomic_write_text", "code runs", ["run", str(toml)], [],
             [marks / "r5-toml.pth", outs / "toml" / "adapter_model.safetensors"],
             cap=TRAIN_CAP))  # fmt: skip
    forged = work / "r5" / "forgedCwd"
    _forged_numpy(forged)
    evil = work / "evil.npy"  # round 4's pickle payload: it touches markers/numpy_load
    argv = h4.grpo_args(
        model,
        arith,
        outs / "forged",
        "numpy:load",
        "--env-arg",
        f"file={json.dumps(str(evil))}",
        "--env-arg",
        "allow_pickle=true",
    )
    add(Case("forged-numpy-dist-info-in-cwd", "code runs", argv, [],
             [marks / "numpy_load", outs / "forged" / "adapter_model.safetensors"],
             cap=TRAIN_CAP, cwd=forged))  # fmt: skip

    # --- silent wrong: check's children run the user's kernels ---
    keep = outs / "checkKeep"
    child = sft_args(model, ex, Path("{out}"), "{seed}", "--cpu-kernels", "native")  # type: ignore[arg-type]
    direct = outs / "direct-native"
    h4._fixture(sft_args(model, ex, direct, 0, "--cpu-kernels", "native"), work, env)

    def same_kernels() -> list[str]:
        want = _find(json.loads((direct / "twinrun.json").read_text()), "aten_capability")
        sidecars = sorted(keep.glob("seed-*/twinrun.json"))
        if len(sidecars) != 3:
            return [f"{len(sidecars)} kept runs, not 3"]
        got = {str(s.parent.name): _find(json.loads(s.read_text()), "aten_capability")
               for s in sidecars}  # fmt: skip
        return [f"{k} ran {v}, a direct run {want}" for k, v in got.items() if v != want]

    add(Case("check-children-native-kernels", "silent wrong",
             ["check", "--quick", "--keep", str(keep), "--", sys.executable, "-m", "twinrun",
              *child], [], cap=3 * TRAIN_CAP, zero_ok=True, verify=same_kernels,
             note="exit 0 holds if each child ran a direct run's kernels"))  # fmt: skip

    # --- unbounded ---
    turns = work / "r5" / "turns.jsonl"
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"}
            for i in range(10_000)]  # fmt: skip
    turns.write_text("".join(json.dumps({"messages": msgs}) + "\n" for _ in range(4)))
    argv = sft_args(model, turns, outs / "turns", 1, "--warmup-steps", "0", "--lr-schedule",
                    "constant")  # fmt: skip
    add(Case("sft-4-rows-of-10000-messages", "unbounded", argv, [],
             [outs / "turns" / "adapter_model.safetensors"], cap=TRAIN_CAP))  # fmt: skip
    add(Case("evidence-repeat-10e30", "unbounded",
             ["evidence", str(run_a), "--repeat", str(10**30), str(toml)], [run_a],
             [outs / "evidence"]))  # fmt: skip
    huge = _huge_header_model(model, work / "r5" / "model60g", 60 * GB)
    add(Case("memory-refusal-60gb-header-rlimit-data", "unbounded",
             sft_args(huge, ex, outs / "huge", 1), [],
             [outs / "huge" / "adapter_model.safetensors"],
             limits={resource.RLIMIT_DATA: 2 << 30}, require=("GB",),
             note="a sparse file: the header claims 60 GB"))  # fmt: skip

    # --- one-line ---
    listed = copy(run_a, "listSidecar")
    h4._edit_json(listed / "twinrun.json", lambda d: d.update(train=[1, 2]))
    add(Case("reproduce-list-shaped-train", "one-line",
             ["reproduce", str(listed), "--output", str(outs / "rlist")], [listed],
             [outs / "rlist"]))  # fmt: skip
    deep = copy(run_a, "deepList")
    _nested_list(deep, 100_000)
    add(Case("overwrite-files-list-100000-deep", "one-line",
             sft_args(model, ex, deep, 1, "--overwrite"), [deep], cap=TRAIN_CAP))  # fmt: skip
    fsize = {resource.RLIMIT_FSIZE: 64 << 10}
    add(Case("toy-model-rlimit-fsize", "one-line",
             ["toy-model", str(outs / "toyFsize"), "--seed", "0"], [], [outs / "toyFsize"],
             limits=fsize))  # fmt: skip
    add(Case("export-rlimit-fsize", "one-line",
             ["export", str(run_a), "--output", str(outs / "exportFsize")], [run_a],
             [outs / "exportFsize"], limits=fsize, progress=EXPORT_PROGRESS))  # fmt: skip
    add(Case("mcp-input-schema-nan", "one-line",
             h4.tool_args(model, arith, outs / "mcpNan", "h5_env:nan_schema"), [],
             [outs / "mcpNan" / "adapter_model.safetensors"], cap=TRAIN_CAP,
             require=("h5_env",)))  # fmt: skip

    # --- signals: Ctrl-C during export, SIGTERM during a tool call that never returns ---
    took = _timed(["export", str(run_a), "--output", str(outs / "exportTimed")], work, env)
    for i, fraction in enumerate((0.3, 0.5, 0.7, 0.85)):
        out = outs / f"exportInt{i}"
        add(Case(f"export-ctrl-c-at-{fraction:.0%}", "data lost",
                 ["export", str(run_a), "--output", str(out)], [run_a], [out],
                 signals=(signal.SIGINT,), signal_after=round(took * fraction, 2),
                 exit_code=130, progress=EXPORT_PROGRESS,
                 note=f"SIGINT {fraction:.0%} into an export of {took:.1f} s"))  # fmt: skip
    for name, sigs, code in (("sigterm", (signal.SIGTERM,), 143),
                             ("sigterm-then-2-ctrl-c",
                              (signal.SIGTERM, signal.SIGINT, signal.SIGINT), 143),
                             ("ctrl-c", (signal.SIGINT,), 130)):  # fmt: skip
        out = outs / f"tool-{name}"
        blocked = work / "r5" / f"blocked-{name}"
        add(Case(f"tool-call-blocked-{name}", "unbounded",
                 h4.tool_args(model, arith, out, "h5_env:sleepy", "--tool-timeout", "900"), [],
                 [out / "adapter_model.safetensors", out / "twinrun.json"], cap=TRAIN_CAP,
                 env={"H5_BLOCKED": str(blocked)}, signals=sigs, signal_after=blocked,
                 exit_code=code, require=("interrupted",),
                 note="the tool sleeps 600 s; --tool-timeout 900"))  # fmt: skip
    return cases


def run_signalled(case: Case, work: Path, env: dict[str, str]) -> dict[str, Any]:
    """`h4.run_case`; a case timed by a delay whose command finished (exit 0) before the signal
    was sent — the machine was faster than when the delay was measured — is tried again with
    the signal at 70 % of the time it took, at most twice: it is judged on a signal that came."""
    r = h4.run_case(case, work, env)
    for _ in range(2):
        unsent = "ended before its signal was sent" in r["reasons"]
        if not (isinstance(case.signal_after, float) and r["exit"] == 0 and unsent):
            break  # a signal that came and was swallowed (exit 0) falls short as it is
        for path in case.absent:
            shutil.rmtree(path, ignore_errors=True)
        case.signal_after = round(0.7 * min(case.signal_after, r["seconds"]), 2)
        r = h4.run_case(case, work, env)
        r["note"] += f"; tried again, the signal at {case.signal_after} s"
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 60 MB JSON array, not 300 MB")
    ap.add_argument("--only", default="", help="run only cases whose name holds this")
    ap.add_argument("--keep", type=Path, help="build the cases here and keep them")
    ap.add_argument("--new-only", action="store_true", help="only round 5's cases")
    a = ap.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hostile5-") as d:
        work = Path(a.keep or d).resolve()
        work.mkdir(parents=True, exist_ok=True)
        old, env = h4.build(work, a.quick)
        new = round5(work, env, a.quick)
        for case in new:
            case.note = ("round 5; " + case.note).rstrip("; ")
        cases = new if a.new_only else [*old, *new]
        fresh = {id(c) for c in new}
        built = time.perf_counter() - t0

        def run(case: h4.Case, work: Path, env: dict[str, str]) -> dict[str, Any]:
            return run_signalled(case, work, env) | {"round": 5 if id(case) in fresh else 4}

        results = h4.run_all(cases, work, env, a.only, run)
    wall = time.perf_counter() - t0
    doc = summarise(results, a.quick, built, wall)
    if a.only:
        print(json.dumps(doc["summary"], indent=2))
        return
    benchkit.write_results("hostile_round5", doc, markdown(doc))
    if not a.new_only:
        benchkit.update_docs_section("hostile_round5", "", "", docs_summary(doc))
    print(markdown(doc))


def summarise(results: list[dict[str, Any]], quick: bool, built: float, wall: float) -> dict:
    table = [*h4.tally(results, "group", h4.GROUPS), *h4.tally(results, "round", [4, 5]),
             *h4.tally(results, "all", ["all"])]  # fmt: skip
    return {
        "quick": quick,
        "time_cap_s": h4.TIME_CAP,
        "train_time_cap_s": h4.TRAIN_CAP,
        "address_space_cap_gib": h4.AS_CAP >> 30,
        "fixtures_s": round(built, 1),
        "wall_s": round(wall, 1),
        "git": benchkit.git("rev-parse", "--short", "HEAD"),
        "dirty": bool(benchkit.git("status", "--porcelain", "--", "src")),
        "cpu": benchkit.cpu_name(),
        "cores": os.cpu_count(),
        "packages": benchkit.package_versions("torch", "numpy", "safetensors", "transformers"),
        "summary": table,
        "cases": results,
    }


def docs_summary(doc: dict[str, Any]) -> str:
    """The paragraph docs/benchmarks.md quotes, from this run."""
    by = {t["group"]: t for t in doc["summary"]}
    total, r4, r5 = by["all"], by["round 4"], by["round 5"]
    short = [r["name"] for r in doc["cases"] if r["outcome"] != "holds"]
    return (
        f"The last run{' (`--quick`)' if doc['quick'] else ''}, on {doc['cores']} cores of "
        f"{doc['cpu']} at {doc['git']}{' (src/ modified)' if doc['dirty'] else ''}, took "
        f"**{doc['wall_s']} s**, **{doc['fixtures_s']} s** of it building fixtures. "
        f"**{total['hold']}** of {total['cases']} cases hold: {r4['hold']} of {r4['cases']} of "
        f"round 4's, {r5['hold']} of {r5['cases']} of round 5's"
        + ("." if not short else "; falling short: " + ", ".join(f"`{n}`" for n in short) + ".")
        + " Every case, with its time and peak RSS, is in `bench/results/hostile_round5.md`."
    )


def markdown(doc: dict[str, Any]) -> str:
    text = h4.markdown(doc)
    flag = " --quick" if doc["quick"] else ""
    text = text.replace("# Hostile sweep, round 4", "# Hostile sweep, round 5", 1)
    text = text.replace("`python -m bench hostile_round4", "`python -m bench hostile_round5", 1)
    assert f"hostile_round5.py{flag}`" in text
    return text


if __name__ == "__main__":
    main()
