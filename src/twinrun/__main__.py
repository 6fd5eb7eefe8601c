"""`python -m twinrun` is the same as `twinrun` (so `torchrun -m twinrun` works)."""

from twinrun.cli.main import main

if __name__ == "__main__":
    main()
