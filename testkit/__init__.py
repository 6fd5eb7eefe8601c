"""What the tests and the benchmarks both use: argument lists for short runs on the toy model
(`toy_runs`), capture fixtures (`captures`), the hostile-input parsers and mutations (`hostile`),
a stand-in trainer for `twinrun check` (`fake_trainer`) and the cached SmolLM2-135M-Instruct
checkpoint (`smollm2`). Neither `tests/` nor `bench/` imports the other; both import this."""
