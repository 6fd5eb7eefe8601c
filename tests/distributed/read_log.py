"""torchrun's target for the instrumented-reader test: every byte range twinrun reads of a
checkpoint's tensor data (`core.safetensors_io.read_span`, as `model/shards.py` calls it) is
recorded, and transformers' loader is made to fail if anything calls it; then the twinrun
commands of a JSON list run as `run_many.py` runs them. Writes `READ_LOG_DIR/rank<R>.json`: a
list of [path, offset, length]."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def main(spec: str) -> int:
    import transformers

    import twinrun.model.shards as shards
    from tests.distributed.run_many import main as run_many

    reads: list[list[Any]] = []
    real = shards.read_span

    def logged(path: Any, offset: int, out: memoryview) -> None:
        reads.append([str(path), offset, out.nbytes])
        real(path, offset, out)

    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("a sharded run called transformers' from_pretrained")

    shards.read_span = logged  # type: ignore[assignment]
    transformers.AutoModelForCausalLM.from_pretrained = refused  # type: ignore[method-assign]
    try:
        return run_many(spec)
    finally:
        folder = Path(os.environ["READ_LOG_DIR"])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rank{os.environ['RANK']}.json").write_text(json.dumps(reads))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
