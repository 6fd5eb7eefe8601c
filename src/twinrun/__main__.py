"""`python -m twinrun` is the same as `twinrun` (so `torchrun -m twinrun` works). `main` is
the console script too: a Ctrl-C while the CLI's own modules import is one line, exit 130."""

import sys


def main() -> None:
    try:
        from twinrun.cli.main import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("twinrun: interrupted (SIGINT) — the command did not finish; rerun it\n")
        sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()
