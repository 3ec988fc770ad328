"""The rollout records every plane agrees on: a `Group` of `Sample`s for one prompt.

Actors build them, the buffer validates/stores/serves them (its wire format lives in `buffer.wire`),
and the learner turns a list of groups into padded tensors. Arrays are numpy so this module needs
neither torch nor vLLM.

Per-token arrays of a sample all have the response length T:
  tokens      int32  response token ids (for LUFFY prefix rows: demonstration prefix + continuation)
  logprobs    float32 behaviour log-prob log mu of each token (vLLM `processed_logprobs`, i.e. after
              temperature); 0.0 on demonstration (prefix) tokens, which have no behaviour policy
  versions    int32  weight version that produced each token; -1 on demonstration tokens
  prefix_mask bool   True on off-policy demonstration tokens
  env_mask    bool   True on environment tokens of a multi-turn row (`envs/`): tool results and
              observations, tokenized once by the actor and appended between the policy's turns. They
              carry version ENV_VERSION and log mu 0 and get no loss, advantage, KL or entropy term
              (the learner's response_mask is 0 on them); all False on single-turn rows.

A multi-turn row's tokens are [turn 1][observation 1][turn 2]...: each policy turn exactly as sampled,
with the weight versions of that turn's request (a push between turns makes the later turns newer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

DEMO_VERSION = -1  # version stamped on demonstration (off-policy) tokens
ENV_VERSION = -1  # version stamped on environment tokens: no policy produced them, so never a staleness

Key = tuple[int, int]  # (epoch, prompt_index): the key of the driver's prompt ledger (`launch.state.ledger`)


def prompt_key(meta: dict, prompt_index: int) -> Key:
    """The ledger key of a group from its `meta` and prompt index (epoch 0 when meta has none): the one
    rule, used for `Group`s (`Group.key`) and the buffer's stored wire groups (`WireGroup.key`)."""
    return int(meta.get("epoch", 0)), int(prompt_index)


@dataclass
class Sample:
    tokens: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    prefix_mask: np.ndarray
    reward: float  # verifiable outcome reward of this response (usually 0/1)
    finish_reason: str = "stop"  # "stop" | "length" | "demo"
    truncated: bool = False  # True when generation hit max_tokens before an eos
    env_mask: np.ndarray | None = None  # bool [T]; None at construction = all False (single-turn)
    teacher_logprobs: np.ndarray | None = None  # float32 [T]: log π_teacher, set by the driver's teacher engine
    # (teacher.scoring: engine, `launch.processes.teacher_scorer`) after the pull; never on the buffer's wire

    def __post_init__(self) -> None:
        if self.env_mask is None:
            self.env_mask = np.zeros(len(self.tokens), dtype=bool)

    @property
    def policy_mask(self) -> np.ndarray:
        """bool [T]: tokens the current policy sampled (neither demonstration nor environment)."""
        return ~(self.prefix_mask | self.env_mask)

    @property
    def on_policy_versions(self) -> np.ndarray:
        return self.versions[self.policy_mask]


@dataclass
class Group:
    group_id: str  # unique id of this group (actor id + counter)
    prompt_index: int  # index of the prompt in the training dataset (the resume ledger uses it)
    prompt_tokens: np.ndarray  # int32 [P] chat-templated prompt ids
    samples: list[Sample]
    ground_truth: str = ""
    data_source: str = ""
    actor_id: int = -1
    meta: dict = field(default_factory=dict)  # small JSON-able extras (e.g. prefix ratios)

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def key(self) -> Key:
        return prompt_key(self.meta, self.prompt_index)

    def oldest_version(self) -> int | None:
        """Oldest weight version among the group's generated tokens; None if it has none (all demos)."""
        versions = [s.on_policy_versions for s in self.samples if s.on_policy_versions.size]
        if not versions:
            return None
        return int(min(v.min() for v in versions))

    def rewards(self) -> np.ndarray:
        return np.asarray([s.reward for s in self.samples], dtype=np.float32)
