"""What attaches to the step loop at named points (before the step, at the optimizer boundary,
after the step): one hook per module."""
