"""Fill a replay config's two pins from a capture source's metrics.jsonl.

    python examples/pin_replay.py SOURCE_DIR TEMPLATE.toml OUT.toml

Reads the captured step's `optimizer/logical_batch_sha256` and `optimizer_batch/manifest_sha256`
from SOURCE_DIR/metrics.jsonl and writes TEMPLATE with `expected_logical_sha256` and
`expected_manifest_sha256` set to them. The manifest's digest includes the platform it was
written on, so the pins are copied from the run, never typed into a committed file.
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import tomli_w


def pin(source: Path, template: Path, out: Path) -> dict[str, str]:
    rows = [json.loads(x) for x in (source / "metrics.jsonl").read_text().splitlines() if x]
    captured = [r for r in rows if "optimizer_batch/manifest_sha256" in r]
    if len(captured) != 1:
        found = len(captured)
        raise SystemExit(f"{source}: expected one captured step in metrics.jsonl, found {found}")
    doc = tomllib.loads(template.read_text())
    pins = {
        "expected_logical_sha256": captured[0]["optimizer/logical_batch_sha256"],
        "expected_manifest_sha256": captured[0]["optimizer_batch/manifest_sha256"],
    }
    doc["optimizer_batch"].update(pins)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(tomli_w.dumps(doc))
    return pins


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    for key, value in pin(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])).items():
        print(f"{key} = {value}")
