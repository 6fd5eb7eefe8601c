"""What observes the step loop at its named points (train/step/loop.py: before the step, at the
optimizer boundary, after the step), through a read-only view of the step: one hook per module."""
