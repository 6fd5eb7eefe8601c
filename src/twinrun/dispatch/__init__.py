"""`twinrun run CONFIG.toml`: a TOML config to its trainer, or to an optimizer-batch replay."""
