"""A run's set-up: the input checks made before torch loads, and the session that opens the
model, data and outputs around the step loop."""
