"""The hostile-input sweep, shared by the test suite (a seeded, bounded run under hypothesis) and
`bench/hostile_sweep.py` (the full run): every parser of a file a user hands twinrun, fed bytes
that are random, mutated from valid files, or built to break limits. Each input must give a
result or a TwinrunError (one line), never any other exception."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twinrun.core.errors import TwinrunError

HOSTILE = [
    b"9" * 5000,
    b"[" * 100_000,
    b'"\\ud800"',
    b'{"a": "\\udfff"}',
    b"NaN",
    b"1e309",
    b"-Infinity",
    b"\xff\xfe",
    b"",
    b"{}",
    b"[]",
    b"null",
    b'{"format": "twinrun.diag.v1", "step": ' + b"1" * 5000 + b"}",
    b'{"format": "twinrun.diag.v1", "step": "x"}',
    b'{"format": "twinrun.diag.v1", "step": 1, "checksums": [], "digests": {}}',
    b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"prompt": "a", "completion": "b", "chosen": 1}',
    b'\xef\xbb\xbf[training]\ntrainer = "sft"\n',  # a BOM, which TOML allows
    b"[" + b".".join([b"a"] * 3000) + b"]\nx = 1\n",  # tables nested 3000 deep
    b'[model]\npath = "a\\u0000b"\n',  # a NUL byte in a path
    b"[training]\n" + b"k" * 100_000 + b" = 1\n",  # a long unknown key
    b"[x]\n" + b"".join(b"k%d = 1\n" % i for i in range(20_000)),  # many unknown keys
]


def _with_file(name: str, fn: Callable[[Path], Any]) -> Callable[[bytes], Any]:
    def run(data: bytes) -> Any:
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / name
            p.write_bytes(data)
            return fn(p)

    return run


def _examples(p: Path) -> Any:
    from twinrun.data.examples import load_rows

    return load_rows(p)


def _toml(p: Path) -> Any:
    from twinrun.config.toml import load_toml

    return load_toml(p)


def _manifest(data: bytes) -> Any:
    from twinrun.capture import manifest as mf

    return mf.parse(data, "manifest")


def _payload(data: bytes) -> Any:
    from twinrun.capture.payload import decode

    return decode(data, "payload")


def _diag_row(data: bytes) -> Any:
    from twinrun.diag.rows import parse_row

    row = parse_row(data.strip() or b"{}", Path("diag.jsonl"), 1)
    if row is not None:
        for leaf in row.checks:
            row.number(leaf, Path("diag.jsonl"))
    return row


def _diff(p: Path) -> Any:
    from twinrun.diag.compare import compare

    return compare(p, p)


def _inputs_record(p: Path) -> Any:
    from twinrun.train.outputs.resume_check import read_inputs

    return read_inputs(p.parent)


def _evidence_rows(p: Path) -> Any:
    from twinrun.replay.evidence import _rows

    return _rows(p.parent)


def _harness_rows(p: Path) -> Any:
    from twinrun.diag.metrics_file import read_metrics

    return read_metrics(p.parent)


def _model_config(p: Path) -> Any:
    from twinrun.model.loading import read_model_config

    return read_model_config(p.parent)


def _trainer_state(p: Path) -> Any:
    from twinrun.capture.state import read_trainer_state

    return read_trainer_state(p.parent)


PARSERS: dict[str, Callable[[bytes], Any]] = {
    "examples": _with_file("ex.jsonl", _examples),
    "toml": _with_file("run.toml", _toml),
    "manifest": _manifest,
    "payload": _payload,
    "diag_row": _diag_row,
    "diag_file": _with_file("diag.jsonl", _diff),
    "inputs_record": _with_file("twinrun.inputs.json", _inputs_record),
    "evidence_rows": _with_file("metrics.jsonl", _evidence_rows),
    "harness_rows": _with_file("metrics.jsonl", _harness_rows),
    "model_config": _with_file("config.json", _model_config),
    "trainer_state": _with_file("trainer_state.json", _trainer_state),
}


def seeds() -> dict[str, list[bytes]]:
    """Valid (or nearly valid) inputs per parser, for mutation."""
    diag = {"format": "twinrun.diag.v1", "step": 0, "phase": "train",
            "checksums": {"loss": 1.5}, "digests": {"loss": "0" * 64}}  # fmt: skip
    h = "a" * 64
    manifest = {
        "format": "twinrun.optimizer-batch.v1", "objective": "grpo", "step": 0,
        "schedule": {"total_steps": 1, "lr": 0.1}, "payload": {"file": "p", "sha256": h},
        "logical_batch_sha256": h, "effective_rows_sha256": h, "config": {"sha256": h},
        "optimizer_contract": {"sha256": h, "values": {}},
        "initial_state": {"resume_step": -1, "adapter": {"sha256": h},
                          "adapter_config": {"sha256": h}, "trainer_state": {"sha256": h}},
    }  # fmt: skip
    line = json.dumps(diag).encode()
    return {
        "examples": [b'{"prompt": "2+2=", "completion": "4"}\n{"messages": []}\n'],
        "toml": [b'[training]\ntrainer = "sft"\nseed = 1\n[model]\npath = "m"\n'],
        "manifest": [json.dumps(manifest).encode()],
        "payload": [b"\x10\x00\x00\x00\x00\x00\x00\x00{}" + b" " * 14],
        "diag_row": [line],
        "diag_file": [line + b"\n" + line + b"\n"],
        "inputs_record": [b'{"format": "twinrun.inputs.v1", "train": {}}'],
        "evidence_rows": [b'{"step": 0, "loss": 1.0}\n'],
        "harness_rows": [b'{"step": 0, "loss": 1.0}\n'],
        "model_config": [b'{"model_type": "llama", "hidden_size": 64}'],
        "trainer_state": [b'{"format": "twinrun.trainer-state.v1", "step": -1}'],
    }


def outcome(parser: str, data: bytes) -> str:
    """ "ok", "refused" (a one-line TwinrunError), or "internal: <Type>: <message>"."""
    try:
        PARSERS[parser](data)
    except TwinrunError as exc:
        line = exc.one_line()
        if "\n" in line:
            return f"internal: multi-line error: {line[:200]!r}"
        return "refused"
    except Exception as exc:  # what the sweep hunts
        return f"internal: {type(exc).__name__}: {str(exc)[:200]}"
    return "ok"


def mutate(data: bytes, ops: list[tuple[int, int, int]]) -> bytes:
    """Apply (kind, position, value) edits: 0 flip a bit, 1 delete a byte, 2 insert a byte,
    3 insert a hostile snippet."""
    buf = bytearray(data)
    for kind, pos, value in ops:
        i = pos % (len(buf) + 1)
        if kind == 0 and buf:
            buf[i % len(buf)] ^= 1 << (value % 8)
        elif kind == 1 and buf:
            del buf[i % len(buf)]
        elif kind == 2:
            buf.insert(i, value % 256)
        elif kind == 3:
            snippet = HOSTILE[value % len(HOSTILE)][:2000]
            buf[i:i] = snippet
    return bytes(buf)
