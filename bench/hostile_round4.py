"""The hostile sweep of round 4: `export`, `plot`, `reproduce`, plugins, adapters,
rewards, bounds and one-line errors, each case a real `python -m twinrun ...` process.

`python -m bench hostile_round4 [--quick] [--only SUBSTRING]`

Every case runs in its own process group under a wall-clock cap (60 s; 120 s where it trains) and
an address-space cap (`RLIMIT_AS`, 3 GiB: torch and twinrun import and train the toy model under
it); its peak RSS is the child's `VmHWM`, polled from `/proc/PID/status` (`ru_maxrss` keeps the
forking parent's size across exec). A case *holds* when the command exits non-zero with exactly
one line of output (stdout and stderr together), no traceback and no "internal error"; every
protected file is byte-identical afterwards (nothing lost); and no marker file, nor any output
that must not appear, exists (nothing ran). The plot cases of huge values and a `$` name hold on
exit 0 with the PNG drawn: drawing them is the fix. Otherwise a case *falls short*, with the
reason: exit 0, a traceback, several lines, a hang (the time cap), the memory cap, killed by a
signal, a file lost or changed, a marker or output written, a factory called.

Groups: data lost, code runs, silent wrong, unbounded, one-line.

`--quick` writes the 300 MB JSON array as 60 MB (everything else is the same; the Parquet files
are small on disk whatever their size inside).

Writes bench/results/hostile_round4.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench import benchkit  # noqa: E402
from bench import hostile_reliability as rel  # noqa: E402
from testkit.toy_runs import sft_args  # noqa: E402

AS_CAP = 3 << 30
TIME_CAP, TRAIN_CAP = 60.0, 120.0
RSS_BOUND = 1024.0  # MB, for the readers of big inputs: the toy model's training needs ~400
GROUPS = ("data lost", "code runs", "silent wrong", "unbounded", "one-line")

# --- plugins: user modules on PYTHONPATH --------------------------------------------------------

PLUGINS = {
    # writes the file $H4_MARKER names the moment it is imported (unset while training)
    "h4_marker_env": """
import os
if os.environ.get("H4_MARKER"):
    open(os.environ["H4_MARKER"], "w").close()


class Shaped:
    def prompt(self, row, rng):
        return row["prompt"]

    def reward(self, row, completion):
        return float(len(completion.encode("utf-8")) % 3)


def make(**args):
    return Shaped()
""",
    # single-turn rewards: +-1e308, 10**400, KeyboardInterrupt
    "h4_reward_env": """
class Hostile:
    def __init__(self, kind):
        self.kind = kind

    def prompt(self, row, rng):
        return row["prompt"]

    def reward(self, row, completion):
        if self.kind == "huge":
            return 1e308 if len(completion) % 2 else -1e308
        if self.kind == "bigint":
            return 10**400
        raise KeyboardInterrupt


def make(kind="huge"):
    return Hostile(kind)
""",
    # OpenEnv-style multi-turn: step() is called on every turn, whatever the model says
    "h4_tool_env": """
def _nested(depth):
    value = "deep"
    for _ in range(depth):
        value = [value]
    return value


class Hostile:
    def __init__(self, kind="surrogate"):
        self.kind = kind

    def reset(self, **row):
        return {"observation": row["prompt"], "reward": 0.0, "done": False}

    def step(self, action):
        if self.kind == "surrogate":
            return {"observation": "lone \\ud800 half", "reward": 1.0, "done": False}
        if self.kind == "nested":
            return {"observation": _nested(100_000), "reward": 1.0, "done": False}
        if self.kind == "bigint":
            return {"observation": "ok", "reward": 10**400, "done": True}
        return {"observation": "ok", "reward": 1.0, "done": True}


def make(kind="surrogate"):
    return Hostile(kind)
""",
}


class _Touch:
    """Unpickling this runs `touch MARKER`: the payload of evil.npy and evil.pt."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch '{self.marker}'",)


# --- one case, one capped process ---------------------------------------------------------------


@dataclass
class Case:
    name: str
    group: str
    argv: list[str]
    protect: list[Path] = field(default_factory=list)  # byte-identical afterwards
    absent: list[Path] = field(default_factory=list)  # must not exist afterwards (markers)
    cap: float = TIME_CAP
    env: dict[str, str] = field(default_factory=dict)
    forbid: tuple[str, ...] = ()  # words that say the refused thing was done anyway
    require: tuple[str, ...] = ()  # words the line must hold: the right blame
    rss_mb: float | None = None  # a bound on peak RSS: a reader that is bounded stays under it
    zero_ok: bool = False  # exit 0 is the right outcome (and no traceback, nothing lost)
    setup: Callable[[], None] | None = None
    note: str = ""
    cwd: Path | None = None  # where it runs (default: the sweep's work directory)
    limits: dict[int, int] = field(default_factory=dict)  # more rlimits (RLIMIT_FSIZE, ...)
    # signals sent once `signal_after` exists (a file) or that many seconds after the start
    signals: tuple[signal.Signals, ...] = ()
    signal_after: Path | float | None = None
    exit_code: int | None = None  # the one exit status that holds (130 for Ctrl-C, ...)
    verify: Callable[[], list[str]] | None = None  # more reasons it falls short, after it ran
    progress: tuple[str, ...] = ()  # starts of the lines a normal run prints too: not counted


def _state(paths: list[Path]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in paths:
        if p.is_symlink():
            out[str(p)] = f"-> {os.readlink(p)}"
        elif p.is_dir():
            out[str(p)] = rel.snapshot(p)
        elif p.is_file():
            out[str(p)] = p.read_bytes()
        else:
            out[str(p)] = None
    return out


def _limits(more: dict[int, int] | None = None) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_CAP, AS_CAP))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for which, value in (more or {}).items():
        resource.setrlimit(which, (value, value))
    for sig in (signal.SIGINT, signal.SIGTERM):  # a background sweep may inherit them ignored
        signal.signal(sig, signal.SIG_DFL)


MEMORY_WORDS = ("MemoryError", "bad_alloc", "Cannot allocate memory", "out of memory",
                "OSError: [Errno 12]", "malloc of size", "failed to allocate",
                "Unable to allocate")  # fmt: skip


def _hwm_kb(pid: int) -> int:
    """The process's peak RSS so far (VmHWM, reset at exec; ru_maxrss is not: it keeps the
    forking parent's), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            return next((int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")), 0)
    except (OSError, ValueError):
        return 0


def run_case(case: Case, work: Path, base_env: dict[str, str]) -> dict[str, Any]:
    import subprocess

    if case.setup is not None:
        case.setup()
    before = _state(case.protect)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    out_f, err_f = logs / f"{case.name}.out", logs / f"{case.name}.err"
    argv = [sys.executable, "-m", "twinrun", *case.argv]
    t0 = time.perf_counter()
    with out_f.open("wb") as so, err_f.open("wb") as se:
        proc = subprocess.Popen(argv, stdout=so, stderr=se, stdin=subprocess.DEVNULL,
                                cwd=case.cwd or work, env=base_env | case.env,
                                preexec_fn=lambda: _limits(case.limits),
                                start_new_session=True)  # fmt: skip
        timed_out, peak_kb, to_send, sent_at = False, 0, list(case.signals), 0.0
        while True:
            peak_kb = max(peak_kb, _hwm_kb(proc.pid))
            pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            at = case.signal_after
            ready = at.exists() if isinstance(at, Path) else time.perf_counter() - t0 >= (at or 0)
            if to_send and ready and time.perf_counter() - sent_at >= 1.0:  # a second apart
                os.kill(proc.pid, to_send.pop(0))
                sent_at = time.perf_counter()
            if time.perf_counter() - t0 > case.cap:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                pid, status, _ = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    with __import__("contextlib").suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything it left behind in its group
    stdout = out_f.read_bytes().decode("utf-8", "replace")
    stderr = err_f.read_bytes().decode("utf-8", "replace")
    text = stdout + stderr
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]  # reproduce reports on stdout
    lines = [ln for ln in lines if not ln.startswith(case.progress or "\0")]
    after = _state(case.protect)
    reasons = []
    if timed_out:
        reasons.append(f"hang: still running after {case.cap:.0f} s")
    elif any(w in text for w in MEMORY_WORDS):
        reasons.append(f"memory cap ({AS_CAP >> 30} GiB address space) reached")
    elif rc < 0 and not (case.exit_code is not None and 128 - rc == case.exit_code):
        # (a process that prints its line, then ends by the signal itself, is what a shell
        # reports as 128 + the signal's number too)
        reasons.append(f"killed by signal {signal.Signals(-rc).name}")
    elif rc == 0 and not case.zero_ok:
        reasons.append("exit 0")
    elif case.exit_code is not None and rc not in (case.exit_code, 128 - case.exit_code):
        reasons.append(f"exit {rc}, not {case.exit_code}")
    if case.signals and len(to_send) == len(case.signals):  # (a first one may end it)
        reasons.append("ended before its signal was sent")
    if "Traceback (most recent call last)" in text:
        reasons.append("traceback")
    if not timed_out and rc != 0 and len(lines) != 1:
        reasons.append(f"{len(lines)} lines")
    if any("internal error" in ln.lower() for ln in lines):
        reasons.append("internal error")
    lost = [p for p in before if before[p] != after[p]]
    if lost:
        reasons.append("lost or changed: " + ", ".join(Path(p).name for p in lost))
    made = [p for p in case.absent if p.exists() or p.is_symlink()]
    if made:
        reasons.append("written: " + ", ".join(p.name for p in made))
    if case.rss_mb is not None and peak_kb / 1024 > case.rss_mb:
        reasons.append(f"peak RSS {peak_kb / 1024:.0f} MB, over the {case.rss_mb:.0f} MB bound")
    said = [w for w in case.forbid if any(w in ln for ln in lines)]
    if said:
        reasons.append("the line says it was done anyway: " + ", ".join(said))
    missing = [w for w in case.require if not any(w in ln for ln in lines)]
    if rc != 0 and missing:
        reasons.append("the line does not name " + ", ".join(missing))
    if case.verify is not None:
        reasons += case.verify()
    return {
        "name": case.name,
        "group": case.group,
        "command": "twinrun " + " ".join(case.argv),
        "outcome": "falls short" if reasons else "holds",
        "reasons": reasons,
        "exit": rc,
        "seconds": round(seconds, 2),
        "peak_rss_mb": round(peak_kb / 1024, 1),
        "lines": len(lines),
        "line": (lines[-1] if lines else stdout.strip()[-200:])[:300],
        "note": case.note,
    }


# --- fixtures ------------------------------------------------------------------------------------


def grpo_args(model: Path, examples: Path, out: Path, env: str, *extra: str) -> list[str]:
    return [
        "tune", "grpo", "--model", str(model), "--examples", str(examples), "--output", str(out),
        "--seed", "1", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
        "--batch-size", "4", "--max-new-tokens", "4", "--temperature", "1.0",
        "--clip-eps", "0.2", "--advantage-clip", "5", "--token-cap", "12",
        "--learning-rate", "5e-2", "--warmup-steps", "0", "--lr-schedule", "constant",
        "--lora-rank", "4", "--lora-alpha", "8", "--precision", "f32", "--chat-template", "on",
        "--quiet", "--threads", "1", "--env", env, *extra,
    ]  # fmt: skip


def tool_args(model: Path, examples: Path, out: Path, env: str, *extra: str) -> list[str]:
    base = grpo_args(model, examples, out, env, *extra)
    timeout = [] if "--tool-timeout" in extra else ["--tool-timeout", "10"]
    return [*base, "--max-turns", "2", *timeout]


def _fixture(argv: list[str], work: Path, env: dict[str, str], **extra_env: str) -> None:
    import subprocess

    res = subprocess.run([sys.executable, "-m", "twinrun", *argv], cwd=work, capture_output=True,
                         text=True, env=env | extra_env, timeout=300)  # fmt: skip
    crash = bool(extra_env.get("TWINRUN_CRASH_AT"))
    if (res.returncode != 0) != crash:
        raise SystemExit(f"fixture failed: twinrun {' '.join(argv)}\n{res.stderr[-2000:]}")


def _edit_json(path: Path, edit: Callable[[Any], Any]) -> None:
    doc = json.loads(path.read_text())
    doc = edit(doc) or doc
    path.write_text(json.dumps(doc, indent=2))


def _adapter_tensors(path: Path) -> tuple[dict[str, Any], dict[str, str] | None]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def _save_adapter(path: Path, tensors: dict[str, Any], meta: dict[str, str] | None) -> None:
    from safetensors.numpy import save_file

    save_file(tensors, str(path), metadata=meta)


def _json_array(path: Path, megabytes: int) -> None:
    """One good row, then `{}` until `megabytes`: parsed whole, a Python dict each 3 bytes (a
    300 MB file is some 6 GB of objects); streamed or capped, refused at once."""
    chunk = b",{}" * (1 << 18)
    with path.open("wb") as f:
        f.write(b'[{"prompt": "What is 2 + 2?", "completion": " 4"}')
        for _ in range((megabytes << 20) // len(chunk)):
            f.write(chunk)
        f.write(b"]")


def _parquet_rows(path: Path, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    block = min(rows, 1 << 20)
    table = pa.table({"prompt": pa.array(["What is 2 + 2?"] * block),
                      "completion": pa.array([" 4"] * block)})  # fmt: skip
    with pq.ParquetWriter(str(path), table.schema, compression="zstd") as w:
        left = rows
        while left > 0:
            w.write_table(table.slice(0, min(left, block)))
            left -= block


def _parquet_value(path: Path, megabytes: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"prompt": ["What is 2 + 2?"], "completion": ["4" * (megabytes << 20)]})
    pq.write_table(table, str(path), compression="zstd", compression_level=19)


def _in_child(make: Callable[..., None], *args: Any) -> None:
    """Build a large fixture in a forked process, so this one stays small."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            make(*args)
        except BaseException:  # noqa: BLE001 - reported by the exit status
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"fixture {make.__name__}{args} failed")


def _torch_pickles(paths: list[tuple[Path, Path]]) -> None:
    import torch

    for path, mark in paths:
        torch.save(_Touch(mark), path)


def build(work: Path, quick: bool) -> tuple[list[Case], dict[str, Any]]:
    plugins = work / "plugins"
    plugins.mkdir()
    for name, source in PLUGINS.items():
        (plugins / f"{name}.py").write_text(source)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(plugins), env.get("PYTHONPATH", "")]).rstrip(":")
    env.pop("H4_MARKER", None)
    marks = work / "markers"
    marks.mkdir()

    model = benchkit.write_toy(work / "model")
    ex = rel.shipped_rows(work / "ex.jsonl", 16)
    arith = work / "arith.jsonl"
    rows = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in
            ((1, 2), (3, 4), (2, 2), (4, 1))]  # fmt: skip
    arith.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_a, run_b, killed = work / "runA", work / "runB", work / "killed"
    ckpt = ("--diag", "--checkpoint-every", "1")
    _fixture(sft_args(model, ex, run_a, 1, *ckpt), work, env)
    _fixture(sft_args(model, ex, run_b, 2, "--diag"), work, env)
    _fixture(sft_args(model, ex, killed, 1, *ckpt), work, env,
             TWINRUN_CRASH_AT="checkpoint-mid-write:3")  # fmt: skip
    export_a = work / "exportA"
    _fixture(["export", str(run_a), "--output", str(export_a)], work, env)
    grpo_plugin = work / "grpoPlugin"
    _fixture(grpo_args(model, arith, grpo_plugin, "h4_marker_env:make"), work, env)
    grpo_builtin = work / "grpoBuiltin"
    _fixture(grpo_args(model, arith, grpo_builtin, "arithmetic"), work, env)

    evil_npy, evil_npy2 = work / "evil.npy", work / "evil2.npy"
    evil_pt, evil_pt2 = work / "evil.pt", work / "evil2.pt"
    import numpy as np

    for path, mark in ((evil_npy, marks / "numpy_load"), (evil_npy2, marks / "reproduce_npy")):
        arr = np.empty(1, dtype=object)
        arr[0] = _Touch(mark)
        np.save(path, arr, allow_pickle=True)
    _in_child(_torch_pickles, [(evil_pt, marks / "torch_serialization_load"),
                               (evil_pt2, marks / "torch_load")])  # fmt: skip

    def copy(src: Path, name: str) -> Path:
        dst = work / name
        shutil.copytree(src, dst, symlinks=True)
        return dst

    def new(name: str) -> Path:
        return work / "outs" / name

    (work / "outs").mkdir()
    cases: list[Case] = []
    add = cases.append

    # --- data lost ---
    foreign = work / "project"
    (foreign / "src").mkdir(parents=True)
    (foreign / "src" / "main.py").write_text("print('mine')\n")
    (foreign / "notes.md").write_text("keep\n")
    (foreign / "twinrun.export.json").write_text("")
    add(
        Case(
            "export-overwrite-foreign",
            "data lost",
            ["export", str(run_a), "--output", str(foreign), "--overwrite"],
            [foreign],
        )
    )
    readme = copy(export_a, "exportReadme")
    (readme / "README.md").write_text("my model card\n")
    (readme / "eval_results").mkdir()
    (readme / "eval_results" / "scores.json").write_text("[1]")
    add(
        Case(
            "export-overwrite-user-readme",
            "data lost",
            ["export", str(run_a), "--output", str(readme), "--overwrite"],
            [readme],
        )
    )
    for target in ("twinrun.json", "adapter_model.safetensors", "metrics.jsonl"):
        run = copy(run_a, f"plot-{target}")
        add(
            Case(
                f"plot-output-{target}",
                "data lost",
                ["plot", str(run), "--output", str(run / target)],
                [run],
            )
        )
    same = copy(run_a, "reproSelf")
    add(Case("reproduce-output-is-run", "data lost",
             ["reproduce", str(same), "--output", str(same), "--overwrite"], [same], cap=TRAIN_CAP,
             forbid=("REPRODUCED",)))  # fmt: skip
    tracked = copy(run_a, "tracked")
    offline = tracked / "wandb" / "offline-run-20261202_000000-abc"
    offline.mkdir(parents=True)
    (offline / "run-abc.wandb").write_bytes(b"not yet synced")
    (tracked / "tensorboard").mkdir()
    (tracked / "tensorboard" / "events.out.tfevents.1").write_bytes(b"events")
    add(
        Case(
            "train-overwrite-wandb",
            "data lost",
            sft_args(model, ex, tracked, 1, "--overwrite"),
            [tracked],
            cap=TRAIN_CAP,
        )
    )
    handmade = work / "outs" / "handmade"  # a user's copy of a run's files, made by hand
    handmade.mkdir()
    for name in ("twinrun.json", "twinrun.inputs.json", "metrics.jsonl"):
        (handmade / name).write_bytes((run_a / name).read_bytes())
    argv = sft_args(model, ex, handmade, 1, "--overwrite")
    add(Case("train-overwrite-handmade-copy", "data lost", argv, [handmade], cap=TRAIN_CAP))
    listed = copy(run_a, "userMetrics")  # a real run, plus a user's file bearing a twinrun name
    (listed / "completions.jsonl").write_text('{"mine": true}\n')
    add(Case("train-overwrite-user-file-twinrun-name", "data lost",
             sft_args(model, ex, listed, 1, "--overwrite"), [listed], cap=TRAIN_CAP))  # fmt: skip

    # --- code runs ---
    def code(name: str, target: str, *args: str, mark: Path | None = None) -> None:
        mark = mark or marks / name
        argv = grpo_args(model, arith, new(name), target)
        for a in args:
            argv += ["--env-arg", a.replace("MARK", str(mark))]
        add(Case(f"env-{name}", "code runs", argv, [], [mark, new(name)], cap=TRAIN_CAP,
                 env={"H4_MARKER": str(mark)}, forbid=("raised",)))  # fmt: skip

    code("numpy_load", "numpy:load", f"file={evil_npy}", "allow_pickle=true",
         mark=marks / "numpy_load")  # fmt: skip
    payload = pickle.dumps(_Touch(marks / "pickle_loads"), protocol=0).decode("latin-1")
    code("pickle_loads", "pickle:loads", f"data={json.dumps(payload)}", mark=marks / "pickle_loads")
    code("marshal_loads", "marshal:loads", 'bytes="c"')
    code("subprocess_run", "subprocess:run", "args=touch 'MARK'", "shell=true")
    code("importlib_import_module", "importlib:import_module", "name=h4_marker_env")
    code("builtins_exec", "builtins:exec", "source=open('MARK', 'w').close()")
    code("torch_serialization_load", "torch.serialization:load", f"f={evil_pt}",
         "weights_only=false")  # fmt: skip
    code("torch_load", "torch:load", f"f={evil_pt2}", "weights_only=false")
    sidecar_npy = copy(grpo_builtin, "sidecarNumpy")
    _edit_json(sidecar_npy / "twinrun.json", lambda d: d["train"].update(
        env="numpy:load", env_args={"file": str(evil_npy2), "allow_pickle": True}))  # fmt: skip
    add(Case("reproduce-sidecar-numpy-load", "code runs",
             ["reproduce", str(sidecar_npy), "--output", str(new("rnpy"))], [sidecar_npy],
             [marks / "reproduce_npy", new("rnpy")], cap=TRAIN_CAP))  # fmt: skip
    add(Case("reproduce-sidecar-user-plugin", "code runs",
             ["reproduce", str(grpo_plugin), "--output", str(new("rplug"))], [grpo_plugin],
             [marks / "reproduce_plugin", new("rplug")], cap=TRAIN_CAP,
             env={"H4_MARKER": str(marks / "reproduce_plugin")}))  # fmt: skip

    # --- silent wrong ---
    adapter = "adapter_model.safetensors"
    swapped = copy(run_a, "swapped")
    shutil.copy(run_b / adapter, swapped / adapter)
    add(Case("reproduce-swapped-adapter", "silent wrong",
             ["reproduce", str(swapped), "--output", str(new("rswap"))], [swapped], cap=TRAIN_CAP,
             forbid=("REPRODUCED",)))  # fmt: skip
    trunc = copy(run_a, "truncRepro")
    (trunc / adapter).write_bytes((run_a / adapter).read_bytes()[:100])
    add(Case("reproduce-truncated-adapter", "silent wrong",
             ["reproduce", str(trunc), "--output", str(new("rtrunc"))], [trunc], cap=TRAIN_CAP,
             forbid=("REPRODUCED",)))  # fmt: skip

    def export_case(group: str, name: str, edit: Callable[[Path], None]) -> None:
        run = copy(run_a, f"exp-{name}")
        edit(run)
        add(Case(f"export-{name}", group, ["export", str(run), "--output", str(new(name))],
                 [run], [new(name)]))  # fmt: skip

    export_case("silent wrong", "other-runs-adapter",
                lambda r: shutil.copy(run_b / adapter, r / adapter))  # fmt: skip
    export_case("silent wrong", "lora-alpha-800", lambda r: _edit_json(
        r / "adapter_config.json", lambda d: d.update(lora_alpha=800)))  # fmt: skip

    def nan(r: Path) -> None:
        t, meta = _adapter_tensors(r / adapter)
        k = sorted(t)[0]
        t[k] = t[k].copy()
        t[k].flat[0] = np.nan
        _save_adapter(r / adapter, t, meta)

    def f16(r: Path) -> None:
        t, meta = _adapter_tensors(r / adapter)
        t = {k: v.astype(np.float16) if "lora_A" in k else v for k, v in t.items()}
        _save_adapter(r / adapter, t, meta)

    export_case("silent wrong", "nan-adapter", nan)
    export_case("silent wrong", "lora-a-f16", f16)
    add(Case("grpo-reward-1e308", "silent wrong",
             grpo_args(model, arith, new("r1e308"), "h4_reward_env:make", "--env-arg",
                       "kind=\"huge\""), [],
             # the step stops: the run directory stays (as after any failed step), but no
             # adapter or sidecar claims a finished run
             [new("r1e308") / "adapter_model.safetensors", new("r1e308") / "twinrun.json"],
             cap=TRAIN_CAP, require=("h4_reward_env",)))  # fmt: skip

    # --- unbounded ---
    threads = copy(run_a, "threadsSidecar")
    _edit_json(threads / "twinrun.json", lambda d: d["train"].update(threads=100000))
    add(Case("reproduce-sidecar-threads-100000", "unbounded",
             ["reproduce", str(threads), "--output", str(new("rthreads"))], [threads],
             [new("rthreads")], cap=TRAIN_CAP))  # fmt: skip
    add(Case("train-threads-100000", "unbounded",
             sft_args(model, ex, new("threads"), 1, "--threads", "100000"), [],
             [new("threads")], cap=TRAIN_CAP))  # fmt: skip
    for kind in ("fifo", "dev-zero"):
        run = copy(killed, f"resume-{kind}")
        state = run / "checkpoints" / "step-000002" / "state.safetensors"
        state.unlink()
        if kind == "fifo":
            os.mkfifo(state)
        else:
            state.symlink_to("/dev/zero")
        add(
            Case(
                f"resume-state-{kind}",
                "unbounded",
                sft_args(model, ex, run, 1, *ckpt, "--resume"),
                [run],
                cap=TIME_CAP,
            )
        )
    try:
        import pyarrow  # noqa: F401

        rows = work / "rows30m.parquet"
        _in_child(_parquet_rows, rows, 30_000_000)
        big = work / "value512m.parquet"
        _in_child(_parquet_value, big, 512)
        for name, path in (("parquet-30m-rows", rows), ("parquet-512mb-value", big)):
            add(Case(name, "unbounded", sft_args(model, path, new(name), 1), [],
                     [new(name) / adapter], cap=TRAIN_CAP, rss_mb=RSS_BOUND,
                     note=f"{path.stat().st_size // 1024} KB on disk"))  # fmt: skip
    except ImportError:
        pass
    mb = 60 if quick else 300
    array = work / "array.json"
    _json_array(array, mb)
    add(
        Case(
            f"json-array-{mb}mb",
            "unbounded",
            sft_args(model, array, new("array"), 1),
            [],
            [new("array") / "adapter_model.safetensors"],
            cap=TRAIN_CAP,
            rss_mb=RSS_BOUND,
        )
    )

    # --- one-line ---
    for kind in ("surrogate", "nested", "bigint"):
        add(Case(f"tool-{kind}", "one-line",
                 tool_args(model, arith, new(f"tool-{kind}"), "h4_tool_env:make", "--env-arg",
                           f"kind=\"{kind}\""), [], [new(f"tool-{kind}") / adapter],
                 cap=TRAIN_CAP, require=("h4_tool_env",)))  # fmt: skip
    for kind in ("bigint", "interrupt"):
        add(Case(f"reward-{kind}", "one-line",
                 grpo_args(model, arith, new(f"reward-{kind}"), "h4_reward_env:make",
                           "--env-arg", f"kind=\"{kind}\""), [],
                 [new(f"reward-{kind}") / adapter], cap=TRAIN_CAP,
                 require=("h4_reward_env",)))  # fmt: skip
    add(Case("tool-timeout-1e308", "one-line",
             tool_args(model, arith, new("ttimeout"), "h4_tool_env:make", "--env-arg",
                       "kind=\"done\"", "--tool-timeout", "1e308"), [],
             [new("ttimeout") / adapter], cap=TRAIN_CAP, forbid=("factory raised",),
             require=("--tool-timeout",)))  # fmt: skip
    for key, value in (("output", str(work / "elsewhere")), ("model", str(model))):
        run = copy(run_a, f"sidecar-{key}")
        _edit_json(run / "twinrun.json", lambda d, k=key, v=value: d["train"].update({k: v}))
        add(Case(f"reproduce-sidecar-train-{key}", "one-line",
                 ["reproduce", str(run), "--output", str(new(f"rs-{key}"))], [run],
                 [work / "elsewhere"], cap=TRAIN_CAP))  # fmt: skip
    export_case(
        "one-line",
        "truncated-adapter",
        lambda r: (r / adapter).write_bytes((run_a / adapter).read_bytes()[:100]),
    )
    export_case("one-line", "empty-adapter", lambda r: (r / adapter).write_bytes(b""))
    export_case(
        "one-line",
        "huge-header-adapter",
        lambda r: (r / adapter).write_bytes((1 << 40).to_bytes(8, "little") + b"{"),
    )
    export_case(
        "one-line",
        "broken-adapter-config",
        lambda r: (r / "adapter_config.json").write_text('{"lora_alpha": 8,'),
    )

    def huge_values(r: Path) -> None:
        lines = (r / "metrics.jsonl").read_text().splitlines()
        out = []
        for i, ln in enumerate(lines):
            row = json.loads(ln)
            if i % 3 < 2:  # every third row keeps its real values
                row["loss"] = 1e308 if i % 3 else -1e308
            out.append(json.dumps(row))
        (r / "metrics.jsonl").write_text("\n".join(out) + "\n")

    huge = copy(run_a, "plotHuge")
    huge_values(huge)
    dollar = copy(run_a, "$\\frac{$")
    for name, run in (("plot-1e308-values", huge), ("plot-dollar-name", dollar)):
        png = new(f"{name}.png")
        add(Case(name, "one-line", ["plot", str(run), "--output", str(png)], [run],
                 zero_ok=True, note="exit 0 with a PNG drawn holds"))  # fmt: skip
    return cases, env


def _check_png(result: dict[str, Any], work: Path) -> None:
    """A plot case that exits 0 holds only when it drew a PNG."""
    if result["exit"] == 0 and result["name"].startswith("plot-") and not result["reasons"]:
        png = work / "outs" / f"{result['name']}.png"
        if not (png.is_file() and png.read_bytes().startswith(b"\x89PNG")):
            result["reasons"].append("exit 0 without a PNG")
            result["outcome"] = "falls short"


def run_all(
    cases: list[Case],
    work: Path,
    env: dict[str, str],
    only: str,
    run: Callable[[Case, Path, dict[str, str]], dict[str, Any]],
) -> list[dict[str, Any]]:
    """`run` each case whose name holds `only`, a line printed for each as it ends."""
    results = []
    for case in cases:
        if only and only not in case.name:
            continue
        r = run(case, work, env)
        _check_png(r, work)
        results.append(r)
        mark = "holds      " if r["outcome"] == "holds" else "falls short"
        print(f"{mark} {r['seconds']:6.1f} s {r['peak_rss_mb']:7.1f} MB  {r['group']:12} "
              f"{r['name']}" + (f"  ({'; '.join(r['reasons'])})" if r["reasons"] else ""),
              flush=True)  # fmt: skip
    return results


def tally(results: list[dict[str, Any]], key: str, values: list[Any]) -> list[dict[str, Any]]:
    """Per value of `results`' `key` ("all": every result): the cases, how many hold and fall
    short; each row's "group" is the value (a round number as "round N")."""
    table = []
    for v in values:
        rs = [r for r in results if key == "all" or r[key] == v]
        held = sum(r["outcome"] == "holds" for r in rs)
        name = f"round {v}" if key == "round" else v
        table.append({"group": name, "cases": len(rs), "hold": held, "fall_short": len(rs) - held})
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 60 MB JSON array, not 300 MB")
    ap.add_argument("--only", default="", help="run only cases whose name holds this")
    ap.add_argument("--keep", type=Path, help="build the cases here and keep them")
    a = ap.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hostile4-") as d:
        work = Path(a.keep or d).resolve()
        work.mkdir(parents=True, exist_ok=True)
        cases, env = build(work, a.quick)
        built = time.perf_counter() - t0
        results = run_all(cases, work, env, a.only, run_case)
    wall = time.perf_counter() - t0
    table = tally(results, "group", GROUPS)
    total = tally(results, "all", ["all"])[0]
    doc = {
        "quick": a.quick,
        "time_cap_s": TIME_CAP,
        "train_time_cap_s": TRAIN_CAP,
        "address_space_cap_gib": AS_CAP >> 30,
        "fixtures_s": round(built, 1),
        "wall_s": round(wall, 1),
        "git": benchkit.git("rev-parse", "--short", "HEAD"),
        "dirty": bool(benchkit.git("status", "--porcelain", "--", "src")),
        "cpu": benchkit.cpu_name(),
        "cores": os.cpu_count(),
        "packages": benchkit.package_versions(
            "torch", "numpy", "pyarrow", "datasets", "matplotlib", "safetensors"
        ),  # fmt: skip
        "summary": [*table, total],
        "cases": results,
    }
    if a.only:
        print(json.dumps(doc["summary"], indent=2))
        return
    benchkit.write_results("hostile_round4", doc, markdown(doc))
    if not doc["quick"]:
        benchkit.update_docs_section("hostile_round4", "", "", docs_summary(doc))
    print(markdown(doc))


def docs_summary(doc: dict[str, Any]) -> str:
    """The paragraph docs/benchmarks.md quotes, from this run."""
    total = doc["summary"][-1]
    biggest = max(doc["cases"], key=lambda r: r["peak_rss_mb"])
    short = total["fall_short"]
    return (
        f"The last run, on {doc['cores']} cores of {doc['cpu']} at {doc['git']}, took "
        f"**{doc['wall_s']} s**, **{doc['fixtures_s']} s** of it building fixtures. "
        f"**{total['hold']}** of {total['cases']} cases hold"
        + (", with none falling short" if not short else f"; **{short}** fall short")
        + f". The biggest reader, `{biggest['name']}`, peaks at **{biggest['peak_rss_mb']}** MB. "
        "Every case, with its time and peak RSS, is in `bench/results/hostile_round4.md`."
    )


def markdown(doc: dict[str, Any]) -> str:
    rows = "\n".join(f"| {t['group']} | {t['cases']} | {t['hold']} | {t['fall_short']} |"
                     for t in doc["summary"])  # fmt: skip
    short = [r for r in doc["cases"] if r["outcome"] != "holds"]
    lines = "\n".join(
        f"| {r['group']} | `{r['name']}` | {'; '.join(r['reasons'])} | {r['exit']} | "
        f"{r['seconds']} | {r['peak_rss_mb']} | {r['line'][:160].replace('|', '/')} |"
        for r in short
    )
    every = "\n".join(
        f"| {r['group']} | `{r['name']}` | {r['outcome']} | {r['exit']} | {r['seconds']} | "
        f"{r['peak_rss_mb']} |"
        for r in doc["cases"]
    )
    flag = " --quick" if doc["quick"] else ""
    return (
        f"# Hostile sweep, round 4{' — quick' if doc['quick'] else ''}\n\n"
        f"`python -m bench hostile_round4{flag}` at {doc['git']}"
        f"{' (src/ modified)' if doc['dirty'] else ''}: {doc['wall_s']} s "
        f"({doc['fixtures_s']} s building fixtures), {doc['cores']} cores of {doc['cpu']}. "
        f"Each case a `python -m twinrun` process, capped at {doc['time_cap_s']:.0f} s "
        f"({doc['train_time_cap_s']:.0f} s where it trains) and "
        f"{doc['address_space_cap_gib']} GiB of address space.\n\n"
        f"| group | cases | hold | fall short |\n|---|---|---|---|\n{rows}\n\n"
        + (f"## Falling short\n\n| group | case | reason | exit | s | peak RSS MB | last line |\n"
           f"|---|---|---|---|---|---|---|\n{lines}\n\n" if short else "")
        + f"## Every case\n\n| group | case | outcome | exit | s | peak RSS MB |\n"
        f"|---|---|---|---|---|---|\n{every}\n"
    )  # fmt: skip


if __name__ == "__main__":
    main()
