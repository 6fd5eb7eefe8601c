"""GRPO's pure, testable parts (the trainer loop and rollout sampling live elsewhere).

- `advantages`: group normalisation -> batch normalisation -> clipping, and the token cap.
- `environments`: the one `Environment` protocol (episodes; a single-turn environment is
  episodes of one turn), `environment_kind` (the one reading of an environment name), built-ins
  `arithmetic` and `clock`, plugins `module.path:factory`, checked rewards, and the
  `observation` fault hook.
- `prioritized`: a deterministic prioritized replay buffer over a fixed-order sum tree.
- `reward_sources`: single-turn `reasoning_gym:TASK` and `math-verify` (optional packages).
- `tool_calls`: `<tool_call>` parsing, tool schemas, the tools system text, template checks.
- `tool_envs`: multi-turn tool environments (built-ins `calculator`, `lookup`), over
  `tool_base` (episode records, the time limit) and `tool_plugins` (TRL, OpenEnv, MCP, HTTP).

The PPO-clip surrogate itself is `twinrun.objectives.grpo`. Nothing is imported here, so
`twinrun.rl.environments` stays importable without torch.
"""
