"""Golden artifacts: the bytes and numbers of a fixed suite on the toy model, stored per platform
fingerprint, so a change that shifts every run alike (a kernel, a library, the tokenizer, the
init) is caught even though each run still reproduces itself.

- `fingerprint.py`: what a platform is (torch version, CPU ISA or GPU model, precision).
- `suite.py`: the suite and its items, in a fixed order.
- `files.py`: writing and checking `DIR/golden-<fingerprint>.json`.
"""
