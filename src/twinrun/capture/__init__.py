"""Optimizer-batch capture and replay (DESIGN §5, format `twinrun.optimizer-batch.v1`).

- `payload`: the optimizer batch and RNG state <-> safetensors bytes (no pickle anywhere);
- `digests`: the logical-batch and effective-rows digests (framed SHA256, big-endian values);
- `manifest`: file names, the JSON manifest that pins everything, safe member paths;
- `store`: never-overwriting atomic writes, the manifest committed last;
- `hook`: capture at a running trainer's optimizer boundary;
- `checks`: the ordered replay checks, shared by replay and explain;
- `replay`: one optimizer update on a verified capture, no data/environment/sampling;
- `explain` / `evidence`: the check table, and gates A and B over a capture and its replays.
"""

from twinrun.capture.manifest import FORMAT

__all__ = ["FORMAT"]
