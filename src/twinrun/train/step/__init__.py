"""The optimizer step: the loop that owns it and its policies, AdamW written out, planted faults."""
