"""`twinrun evidence SOURCE REPLAY...`: what a capture and its replays prove (docs/capture.md).

- **Gate A — exact-input systems claim** (the admission gate for runtime and memory
  comparisons): every run reports the same logical and effective-rows digests and the same
  initial adapter; every replay declared exactly the config differences it has, its
  gradient-checkpointing runtime flag is the one its config asks for, and it skipped dataset,
  environment, rollout and sampling; each replay's loss is the source's, bit for bit; every final
  adapter differs from the initial one; and every condition was replayed at least twice, each
  replay a fresh run in its own directory (`MIN_REPLAYS`), so a timing is a spread, never one
  run. A replay is fresh when its run identity (`twinrun.run-id.json`: a random run id written
  when it started, `replay/identity.py`) differs from every other replay's: a directory copied
  under a new name has its original's id and is refused by name, as is one without an id.
  Timings are reported as min/median/max per condition with their spread (max - min, and
  relative to the median), and the source's captured row carries the same timing and memory
  fields, reported beside them.
- **Gate B — bitwise update claim**: the source and every same-condition replay (no declared
  difference) end with the same final adapter SHA256.
- **Approximate equivalence**, judged only against tolerances the replay configs declared
  beforehand (`[evidence] min_update_cosine`, `max_relative_delta_l2`): for each pair of runs,
  the cosine between their updates (final − initial adapter, all tensors as one float64 vector)
  and ||u_a − u_b|| / ||u_a||.

Inputs are run directories (`[logging] dir`). A missing or unreadable input is an
`EvidenceInputError` (exit 2).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinrun.capture import manifest as mf
from twinrun.core.digest import sha256_file
from twinrun.core.errors import DataError
from twinrun.core.safetensors_io import read_safetensors
from twinrun.replay.identity import RUN_IDENTITY, read_identity
from twinrun.train.hooks.capture import SKIPPED

TIMINGS = (
    "local_train_wall_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "peak_memory_bytes",
    "padding_fraction",
)
GC_KEY = "backend.options.gradient_checkpointing"
MIN_REPLAYS = 2  # per condition: one replay has no spread


class EvidenceInputError(DataError):
    """An input run directory is missing or unreadable (exit 2)."""


@dataclass
class RunRecord:
    name: str
    path: Path
    row: dict[str, Any]
    resolved: dict[str, Any]
    final_dir: Path
    identity: dict[str, Any] | None = None

    def get(self, key: str) -> Any:
        return self.row.get(key)

    def config(self, dotted: str) -> Any:
        node: Any = self.resolved
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    @property
    def condition(self) -> str:
        return ", ".join(self.row.get("optimizer_batch/declared_differences") or []) or "same"


SHA_KEYS = ("optimizer_batch/manifest_sha256",)


def _rows(path: Path) -> list[dict[str, Any]]:
    """The metrics rows of a run directory: each a JSON object, within the JSON limits."""
    from twinrun.core.jsonlimits import DIAG, iter_jsonl

    file = path / "metrics.jsonl"
    if not file.is_file():
        raise EvidenceInputError(f"cannot read {file}: no such file", "is it a run directory?")
    try:
        rows = list(iter_jsonl(file, "metrics file", DIAG))
    except DataError as exc:
        raise EvidenceInputError(exc.message, "is it a run directory?") from None
    for lineno, row in rows:
        if not isinstance(row, dict):
            raise EvidenceInputError(
                f"{file}:{lineno}: a metrics row must be a JSON object, got {type(row).__name__}",
                "is it a run directory written by twinrun?",
            )
        if not isinstance(row.get("step", 0), int) or any(
            not isinstance(row.get(k), str | None) for k in SHA_KEYS
        ):
            raise EvidenceInputError(
                f"{file}:{lineno}: 'step' must be an integer and digests strings",
                "is it a run directory written by twinrun?",
            )
    return [row for _, row in rows]


def _resolved(path: Path) -> dict[str, Any]:
    from twinrun.core.jsonlimits import SMALL, load_json_file

    file = path / "resolved_config.json"
    if not file.exists():
        return {}
    try:
        resolved = load_json_file(file, "resolved config", SMALL)
    except DataError as exc:
        raise EvidenceInputError(exc.message) from None
    if not isinstance(resolved, dict):
        raise EvidenceInputError(f"{file} is not a JSON object", "is it a twinrun run?")
    return resolved


def load_runs(source: Path, replays: list[Path]) -> tuple[RunRecord, list[RunRecord]]:
    recs = []
    for i, path in enumerate(replays):
        rows = _rows(path)
        if len(rows) != 1 or not rows[0].get("optimizer_batch/dataset_skipped"):
            raise EvidenceInputError(f"{path} is not a replay run (one metrics row expected)")
        recs.append(
            RunRecord(
                f"replay{i + 1}",
                path,
                rows[0],
                _resolved(path),
                path / "final",
                read_identity(path),
            )
        )
    manifests = {r.get("optimizer_batch/manifest_sha256") for r in recs}
    if len(manifests) != 1:
        raise EvidenceInputError(
            f"the replays replay different captures: {sorted(manifests)}",
            "give replays of one capture",
        )
    sha = manifests.pop()
    found = [r for r in _rows(source) if r.get("optimizer_batch/manifest_sha256") == sha]
    if not found:
        raise EvidenceInputError(
            f"{source} has no captured step with manifest sha256 {sha}",
            "give the run that made the capture",
        )
    row = found[0]
    final = source / mf.final_dir_name(int(row["step"]))
    src = RunRecord(
        "source", source, row, _resolved(source), final if final.is_dir() else source / "final"
    )
    return src, recs


def _criterion(name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail}


def _same(runs: list[RunRecord], key: str) -> tuple[bool, str]:
    values = {r.name: r.get(key) for r in runs}
    ok = len(set(values.values())) == 1 and None not in values.values()
    return ok, (
        f"all {next(iter(values.values()))}"
        if ok
        else ", ".join(f"{k} {v}" for k, v in values.items())
    )


def fresh_replays(reps: list[RunRecord]) -> dict[str, Any]:
    """At least `MIN_REPLAYS` replays of every condition, each its own run directory."""
    paths = [r.path.resolve() for r in reps]
    repeated = sorted({str(p) for p in paths if paths.count(p) > 1})
    counts = {c: sum(r.condition == c for r in reps) for c in sorted({r.condition for r in reps})}
    few = {c: n for c, n in counts.items() if n < MIN_REPLAYS}
    spread = []
    for cond in counts:
        walls = [float(r.get("local_train_wall_s")) for r in reps
                 if r.condition == cond and r.get("local_train_wall_s") is not None]  # fmt: skip
        if len(walls) >= 2:
            med = statistics.median(walls)
            rel = f" ({(max(walls) - min(walls)) / med:.1%} of the median)" if med else ""
            spread.append(f"{cond}: wall spread {max(walls) - min(walls):.6g} s{rel}")
    copies = not_fresh(reps) if not repeated else []
    if repeated:
        detail = f"a replay directory is given more than once: {', '.join(repeated)}"
    elif copies:
        detail = "; ".join(copies)
    elif few:
        detail = "; ".join(
            f"{c}: {n} replay (at least {MIN_REPLAYS} fresh replays needed: "
            "twinrun evidence --repeat N CONFIG)"
            for c, n in few.items()
        )
    else:
        detail = "; ".join([", ".join(f"{c}: {n} replays" for c, n in counts.items()), *spread])
    return _criterion("repeated fresh replays", not repeated and not copies and not few, detail)


def not_fresh(reps: list[RunRecord]) -> list[str]:
    """Each replay that is not a fresh run of its own: no run identity, or the run id of a replay
    before it (a copied directory)."""
    problems: list[str] = []
    first: dict[str, RunRecord] = {}
    for r in reps:
        run_id = r.identity["run_id"] if r.identity else None
        if run_id is None:
            problems.append(f"{r.path} has no run identity ({RUN_IDENTITY}): not a fresh replay")
        elif run_id in first:
            problems.append(
                f"{r.path} is a copy of {first[run_id].path} (the same run id {run_id[:12]}), "
                "not a fresh replay"
            )
        else:
            first[run_id] = r
    return problems


def gate_a(src: RunRecord, reps: list[RunRecord]) -> list[dict[str, Any]]:
    """Gate A's criteria, in order (the module docstring says what each one asks)."""
    runs = [src, *reps]
    return [
        fresh_replays(reps),
        *_same_digests(runs),
        _logical_pin(src, reps),
        _declared_differences(reps),
        _checkpointing_flag(reps),
        _skipped_stages(reps),
        _same_loss(src, reps),
        _adapter_changed(runs),
    ]


def _same_digests(runs: list[RunRecord]) -> list[dict[str, Any]]:
    """Every run reports the same logical batch, effective rows and initial adapter digests."""
    out = []
    for name, key in (
        ("logical batch", "optimizer/logical_batch_sha256"),
        ("effective rows", "optimizer/effective_rows_sha256"),
        ("initial adapter", "optimizer_batch/initial_adapter_sha256"),
    ):
        out.append(_criterion(name, *_same(runs, key)))
    return out


def _logical_pin(src: RunRecord, reps: list[RunRecord]) -> dict[str, Any]:
    """Every replay pinned the source's logical batch digest."""
    pins = {r.get("optimizer_batch/expected_logical_sha256") for r in reps}
    return _criterion(
        "logical pin",
        pins == {src.get("optimizer/logical_batch_sha256")},
        f"replays pinned {sorted(map(str, pins))}",
    )


def _declared_differences(reps: list[RunRecord]) -> dict[str, Any]:
    """Every replay declared exactly the config differences it has."""
    bad = [
        r.name
        for r in reps
        if sorted(r.get("optimizer_batch/declared_differences") or [])
        != sorted(r.get("optimizer_batch/observed_differences") or [])
    ]
    return _criterion(
        "declared = observed differences",
        not bad,
        "; ".join(f"{r.name}: {r.condition}" for r in reps),
    )


def _checkpointing_flag(reps: list[RunRecord]) -> dict[str, Any]:
    """Every replay's gradient-checkpointing runtime flag is the one its config asks for."""
    bad = [
        r.name
        for r in reps
        if r.get("backend/gradient_checkpointing") is not bool(r.config(GC_KEY))
    ]
    return _criterion(
        "gradient checkpointing flag",
        not bad,
        f"differs from the config in {bad}" if bad else "as configured",
    )


def _skipped_stages(reps: list[RunRecord]) -> dict[str, Any]:
    """Every replay skipped dataset, environment, rollout and sampling (`SKIPPED`)."""
    bad = [
        r.name
        for r in reps
        if not all(r.get(f"optimizer_batch/{s}_skipped") is True for s in SKIPPED)
    ]
    return _criterion(
        "skipped stages", not bad, f"not skipped in {bad}" if bad else ", ".join(SKIPPED)
    )


def _same_loss(src: RunRecord, reps: list[RunRecord]) -> dict[str, Any]:
    """Every replay's loss is the source's, bit for bit (and the source has one)."""
    loss = src.get("loss")
    bad = [r.name for r in reps if r.get("loss") != loss or loss is None]
    return _criterion(
        "same loss",
        not bad,
        f"source {loss!r}" + "".join(f", {r.name} {r.get('loss')!r}" for r in reps),
    )


def _adapter_changed(runs: list[RunRecord]) -> dict[str, Any]:
    """Every run's final adapter differs from its initial one."""
    bad = [
        r.name
        for r in runs
        if r.get("optimizer_batch/final_adapter_sha256")
        in (None, r.get("optimizer_batch/initial_adapter_sha256"))
    ]
    return _criterion(
        "adapter changed",
        not bad,
        f"final = initial in {bad}" if bad else "every final differs",
    )


def gate_b(src: RunRecord, reps: list[RunRecord]) -> list[dict[str, Any]]:
    same = [r for r in reps if r.condition == "same"]
    if not same:
        return [_criterion("final adapter sha256", False, "no same-condition replay given")]
    return [
        _criterion(
            "final adapter sha256", *_same([src, *same], "optimizer_batch/final_adapter_sha256")
        )
    ]


def timing(reps: list[RunRecord], src: RunRecord | None = None) -> dict[str, Any]:
    """Per condition, each timing's min / median / max and spread (max - min) over the replays;
    under "source", the captured step's own values."""
    out: dict[str, Any] = {}
    for cond in sorted({r.condition for r in reps}):
        group = [r for r in reps if r.condition == cond]
        stats: dict[str, Any] = {"replays": len(group)}
        for key in TIMINGS:
            values = [float(r.get(key)) for r in group if r.get(key) is not None]
            if values:
                stats[key] = {
                    "min": min(values),
                    "median": statistics.median(values),
                    "max": max(values),
                    "spread": max(values) - min(values),
                }
        out[cond] = stats
    if src is not None:
        own = {key: float(src.get(key)) for key in TIMINGS if src.get(key) is not None}
        if own:
            out["source"] = own
    return out


def _update(initial: dict[str, Any], final_dir: Path) -> Any:
    import torch

    path = final_dir / "adapter_model.safetensors"
    final = read_safetensors(
        path, "a run's final adapter", "rerun the replay that wrote it", EvidenceInputError
    ).tensors
    if set(final) != set(initial):
        raise EvidenceInputError(f"{path}: tensors differ from the initial adapter's")
    return torch.cat([(final[k].double() - initial[k].double()).reshape(-1) for k in sorted(final)])


def initial_adapter(runs: list[RunRecord], sha: str) -> dict[str, Any]:
    """The initial adapter's tensors, from a run's `[resume] from` whose file has `sha`."""
    for r in runs:
        folder = r.config("resume.from")
        if not isinstance(folder, str):
            continue
        path = Path(folder) / "adapter_model.safetensors"
        if path.is_file() and sha256_file(path) == sha:
            found = read_safetensors(path, "the initial adapter", "restore it", EvidenceInputError)
            return found.tensors
    raise EvidenceInputError(
        f"no run's [resume] from holds the initial adapter {sha}",
        "keep the initial state where the configs point",
    )


def approximate(src: RunRecord, reps: list[RunRecord]) -> dict[str, Any]:
    declared = {
        (r.config("evidence.min_update_cosine"), r.config("evidence.max_relative_delta_l2"))
        for r in reps
    } - {(None, None)}
    if len(declared) > 1:
        raise EvidenceInputError(f"the replays declare different tolerances {sorted(declared)}")
    min_cos, max_rel = declared.pop() if declared else (None, None)
    judged = min_cos is not None or max_rel is not None
    runs = [src, *reps]
    result: dict[str, Any] = {
        "declared": {"min_update_cosine": min_cos, "max_relative_delta_l2": max_rel},
        "pairs": [],
        "ok": None,
    }
    try:
        updates = _updates(runs)
    except EvidenceInputError as exc:
        if judged:  # tolerances were declared: the numbers must exist
            raise
        return result | {"unavailable": exc.one_line()}
    pairs = []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            ua, ub = updates[a.name], updates[b.name]
            na, nb = float(ua.norm()), float(ub.norm())
            cos = float(ua @ ub) / (na * nb) if na and nb else math.nan
            rel = float((ua - ub).norm()) / na if na else math.nan
            ok = (min_cos is None or cos >= min_cos) and (max_rel is None or rel <= max_rel)
            pairs.append(
                {"a": a.name, "b": b.name, "update_cosine": cos, "relative_delta_l2": rel, "ok": ok}
            )
    return result | {"pairs": pairs, "ok": all(p["ok"] for p in pairs) if judged else None}


def _updates(runs: list[RunRecord]) -> dict[str, Any]:
    initial = initial_adapter(runs, str(runs[0].get("optimizer_batch/initial_adapter_sha256")))
    updates = {}
    for r in runs:
        final = r.final_dir / "adapter_model.safetensors"
        if not final.is_file() or sha256_file(final) != r.get(
            "optimizer_batch/final_adapter_sha256"
        ):
            raise EvidenceInputError(
                f"{r.path}: final adapter missing or not the one its metrics report"
            )
        updates[r.name] = _update(initial, r.final_dir)
    return updates


def evaluate(source: Path, replays: list[Path], require: list[str]) -> dict[str, Any]:
    """The evidence report; `exit` is 0 when the required gates pass, else 1."""
    src, reps = load_runs(source, replays)
    gates = {"A": gate_a(src, reps), "B": gate_b(src, reps)}
    report: dict[str, Any] = {
        "source": str(src.path),
        "replays": [{"name": r.name, "path": str(r.path), "condition": r.condition} for r in reps],
        "gates": {g: {"ok": all(c["ok"] for c in cs), "criteria": cs} for g, cs in gates.items()},
        "approximate": approximate(src, reps),
        "timing": timing(reps, src),
        "required": require,
    }
    report["exit"] = 0 if all(report["gates"][g]["ok"] for g in require) else 1
    return report


def render(report: dict[str, Any]) -> str:
    lines = [f"evidence: source {report['source']}, {len(report['replays'])} replay(s)"]
    lines += [f"  {r['name']}: {r['path']} ({r['condition']})" for r in report["replays"]]
    titles = {"A": "gate A (exact-input systems claim)", "B": "gate B (bitwise update claim)"}
    for g, gate in report["gates"].items():
        need = " [required]" if g in report["required"] else ""
        lines.append(f"{titles[g]}: {'PASS' if gate['ok'] else 'FAIL'}{need}")
        lines += [
            f"  {'pass' if c['ok'] else 'FAIL'}  {c['name']}: {c['detail']}"
            for c in gate["criteria"]
        ]
    ap = report["approximate"]
    d = ap["declared"]
    verdict = (
        "not judged (no tolerances declared)"
        if ap["ok"] is None
        else ("PASS" if ap["ok"] else "FAIL")
    )
    lines.append(
        f"approximate (min_update_cosine {d['min_update_cosine']}, "
        f"max_relative_delta_l2 {d['max_relative_delta_l2']}): {verdict}"
    )
    if "unavailable" in ap:
        lines.append(f"  not computed: {ap['unavailable']}")
    lines += [
        f"  {p['a']} vs {p['b']}: update cosine {p['update_cosine']:.9f}, relative delta "
        f"L2 {p['relative_delta_l2']:.3e}"
        for p in ap["pairs"]
    ]
    for cond, stats in report["timing"].items():
        if cond == "source":
            lines.append("timing, source (the captured step):")
            lines += [f"  {key}: {stats[key]:.6g}" for key in TIMINGS if key in stats]
            continue
        lines.append(f"timing, {cond} ({stats['replays']} replay(s)), min / median / max (spread):")
        for key in TIMINGS:
            if key in stats:
                s = stats[key]
                lines.append(
                    f"  {key}: {s['min']:.6g} / {s['median']:.6g} / {s['max']:.6g} "
                    f"({s['spread']:.6g})"
                )
    return "\n".join(lines)
