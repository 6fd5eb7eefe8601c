"""GRPO's pure, testable parts (the trainer loop and rollout sampling live elsewhere).

- `advantages`: group normalisation -> batch normalisation -> clipping, and the token cap.
- `environments`: `environment_kind` (the one reading of an environment name) and
  `open_environment`, the one factory of environments of every kind, over
  - `env_protocol`: the one `Environment` protocol (episodes, and the `TurnPlan` that says how
    they are sampled: the one place a single-turn environment differs from a tool one);
  - `single_turn`: a single-turn environment (`prompt`, `reward`) as episodes of one turn;
  - `builtin_envs`: built-ins `arithmetic` and `clock`, and the `observation` fault hook;
  - `env_checks`: checked prompts and rewards, one-line errors with argument values hidden;
  - `plugin_trust`: which `module.path:factory` may run as a plugin, and loading it;
  - `reward_sources`: single-turn `reasoning_gym:TASK` and `math-verify` (optional packages);
  - `tool_envs`: built-in tool environments `calculator`, `lookup`, over `tool_base` (the time
    limit, running the model's tool calls) and `tool_plugins` (TRL, OpenEnv, MCP, HTTP);
  - `tool_settings`: the turn and time limits a tool environment needs, checked once.
- `prioritized`: a deterministic prioritized replay buffer over a fixed-order sum tree.
- `tool_calls`: `<tool_call>` parsing, tool schemas, the tools system text, template checks.

The PPO-clip surrogate itself is `twinrun.objectives.grpo`. Nothing is imported here, so
`twinrun.rl.environments` stays importable without torch.
"""
