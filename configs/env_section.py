"""The `env:` section: multi-turn, tool-using rollouts (`envs/`). Off by default: with neither `tools` nor
`environment` set, rollouts are single-turn exactly as before. The rules that depend on other sections
(which algorithms train on multi-turn rows) are `env_problems`, called by the run config's cross-field check."""

from __future__ import annotations

from pydantic import Field

from configs.base import Section


class EnvConfig(Section):
    tools: list[str] = Field(
        [], description="tools offered to the model through its chat template and called when it asks: built-in "
                        "names (calculator, python) or FILE.py:FUNCTION / MODULE:FUNCTION (a typed function with a "
                        "Google-style docstring; envs/tools.py). The episode ends at a turn without a tool call; its "
                        "reward is reward.fn on the whole response (policy and tool tokens). [] = no tools")
    environment: str | None = Field(
        None, description="an environment class, FILE.py:CLASS or MODULE:CLASS, with reset(record) -> first "
                          "observation and step(action) -> (observation, reward, done), one instance per trajectory "
                          "(envs/environment.py); the episode's reward is the sum of its steps' rewards. null = none")
    max_turns: int = Field(
        4, ge=1, description="policy turns per trajectory at most (turns: one policy generation each); the episode "
                             "ends after the last one without an observation")
    max_trajectory_tokens: int | None = Field(
        None, ge=1, description="response tokens per trajectory at most: the policy's turns and the observations "
                                "between them, after the prompt. null = rollout.max_response_tokens, which is also "
                                "the most allowed (the engine's context and the learner's memory plan are sized by "
                                "it). Tokens")
    max_turn_tokens: int | None = Field(
        None, ge=1, description="policy tokens of one turn at most; a turn cut there without an eos still goes on: "
                                "the environment gets its text, and the template's end of turn (eos included) is "
                                "appended before the observation, as environment tokens. null = the trajectory's "
                                "tokens left. Tokens")
    max_observation_tokens: int = Field(
        1024, ge=1, description="tokens of one observation (a turn's tool results or environment message) at most; "
                                "a longer one (or one with more than 32 characters per token of this limit, not even "
                                "tokenized) ends the trajectory, counted in env/truncated. Tokens")
    call_timeout_s: float = Field(
        30.0, gt=0, description="wall time of one tool call, or of one reset/step of an environment, at most; past "
                                "it the trajectory ends, counted in env/timeouts. Seconds")

    @property
    def enabled(self) -> bool:
        return bool(self.tools) or self.environment is not None


# Algorithms refused with multi-turn rows, and why (docs/running.md "Tools and environments").
UNSUPPORTED = {
    "luffy": "LUFFY's demonstrations are single-turn teacher responses; teacher files with multi-turn traces and "
             "tool outputs are not read",
    "sft": "SFT trains on demonstrations only and runs no rollouts",
}


def env_problems(cfg):
    """'key: what is wrong — fix' for `env:` against the rest of the run config."""
    env = cfg.env
    if not env.enabled:
        return
    if env.tools and env.environment is not None:
        yield ("env.environment: set together with env.tools — choose one way in: tools (the episode is the model "
               "calling them) or an environment class (which may call tools itself)")
    if cfg.algo in UNSUPPORTED:
        yield f"env: --algo {cfg.algo} does not train on multi-turn rows: {UNSUPPORTED[cfg.algo]} — use grpo, rloo, " \
              "pacs, prime or pure, or leave env.tools and env.environment unset"
    if cfg.algo == "prime" and (cfg.prime.gamma < 1 or cfg.prime.outcome_gamma < 1):
        yield ("prime.gamma: a discount below 1 counts token positions, and a multi-turn row's environment tokens "
               "would count as steps — use prime.gamma=1 and prime.outcome_gamma=1 with env")
    limit = cfg.rollout.max_response_tokens
    if env.max_trajectory_tokens is not None and env.max_trajectory_tokens > limit:
        yield (f"env.max_trajectory_tokens: {env.max_trajectory_tokens} exceeds rollout.max_response_tokens={limit}, "
               "which sizes the engine's context and the learner's memory — raise that key instead (or set null)")
    if cfg.data.prompt_format == "raw":
        yield ("env: data.prompt_format=raw has no chat template to render tool results and observations with — use "
               "data.prompt_format=chat")
