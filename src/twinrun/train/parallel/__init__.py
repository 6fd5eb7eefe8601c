"""Runs over several processes: the process group, ordered gathers, agreement before training,
the sharded base, and `twinrun launch`."""
