"""Training recipes: each builds its batches and its forward/backward for the step loop —
`sft`, `pairs` (dpo and reward) and `grpo`."""
