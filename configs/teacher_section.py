"""The `teacher:` section: the frozen model that distillation (`--algo opd`) scores the student's tokens with.

Where it is checked: `launch.prep.preflight` (it loads, and its tokenizer is the student's), `launch.state.storage`
(made absolute; a Hub id becomes its cached snapshot), `launch.planning.memory_estimate` (its weights on every
learner rank). Where it runs: `learner.providers.TeacherLogprobs`, on the learner ranks.
"""

from __future__ import annotations

from pydantic import Field

from configs.base import Section


class TeacherConfig(Section):
    path: str | None = Field(
        None, description="the teacher: a local HF model directory, or a Hub model id (org/name) already in the local "
                          "HF cache, which the run replaces with its snapshot directory. It must share the student's "
                          "tokenizer (vocabulary, special tokens, chat template: checked before start). It runs "
                          "frozen on every learner rank in model.dtype, sharded over the ranks like the reference "
                          "model (model.trust_remote_code applies to it too); null = no teacher")
