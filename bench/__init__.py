"""twinrun's benchmarks: `python -m bench --list` names them, `python -m bench NAME` runs one."""
