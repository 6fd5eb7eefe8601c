"""torchrun's target for the same-path test: rank 1 sees other bytes at the model's path (as in
its own mount of it) — every range it reads of the weights (`core.safetensors_io.read_span`, as
`model/shards.py` calls it) has its first byte flipped — then the twinrun commands of a JSON
list run as `run_many.py` runs them."""

from __future__ import annotations

import os
import sys
from typing import Any


def main(spec: str) -> int:
    import twinrun.model.shards as shards
    from tests.distributed.run_many import main as run_many

    if os.environ["RANK"] == "1":
        real = shards.read_span

        def other_bytes(path: Any, offset: int, out: memoryview) -> None:
            real(path, offset, out)
            view = out.cast("B") if out.format != "B" or out.ndim != 1 else out
            view[0] ^= 0x01

        shards.read_span = other_bytes  # type: ignore[assignment]
    return run_many(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
