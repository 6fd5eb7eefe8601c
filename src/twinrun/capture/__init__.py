"""The optimizer-batch capture format ( `twinrun.optimizer-batch.v1`).

- `payload`: the optimizer batch and RNG state <-> safetensors bytes (no pickle anywhere);
- `digests`: the logical-batch and effective-rows digests (framed SHA256, big-endian values);
- `manifest`: file names, the JSON manifest that pins everything, safe member paths;
- `store`: never-overwriting atomic writes, the manifest committed last;
- `checks`: the ordered replay checks, shared by replay and explain;
- `state`: the adapter, optimizer and reward-head bytes a capture pins.

Capturing inside a run is the step hook `twinrun.train.hooks.capture`; replaying a capture is
`twinrun.replay`.
"""

from twinrun.capture.manifest import FORMAT

__all__ = ["FORMAT"]
