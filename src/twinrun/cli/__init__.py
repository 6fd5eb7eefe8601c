"""The command line: one module per command; `main` only wires them. The library never
imports this package."""
