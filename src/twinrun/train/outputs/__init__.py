"""What a run leaves on disk and reads back: its run directory, checkpoints that verify
themselves, `--resume` and the initialization state of `twinrun init-adapter`."""
