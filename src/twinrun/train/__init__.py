"""Training: `recipes/` (one class per objective and `train(run)`), `setup/` (input checks and
the session), `step/` (the step loop and its policies), `hooks/` (what observes the loop),
`outputs/` (run directories, checkpoints, resume), `parallel/` (several processes); `driver`
builds the loop and drives it, `interrupt` stops it after a step on Ctrl-C."""
