"""The bottom layer every capability shares: errors, keyed random streams (`rng`), strict
deterministic mode (`determinism`), SHA256 helpers (`digest`), secret redaction (`redact`), atomic
file writes (`fileio`) and progress lines (`progress`). Nothing here imports another twinrun
package."""
