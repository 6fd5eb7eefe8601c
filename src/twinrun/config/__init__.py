"""Run configuration: one dataclass tree for flags, TOML and the sidecar."""
