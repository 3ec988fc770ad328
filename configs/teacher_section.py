"""The `teacher:` section: the frozen model that distillation (`--algo opd`) scores the student's tokens with, and
that LUFFY (`--algo luffy`) may ask for traces (`teacher.live_traces`).

Where it is checked: `launch.prep.preflight` (it loads, and its tokenizer is the student's), `launch.state.storage`
(made absolute; a Hub id becomes its cached snapshot), `launch.planning.memory_estimate` (its weights on every
learner rank, unless teacher.scoring is engine). Where it runs: `learner.providers.TeacherLogprobs`, on the learner
ranks, or (teacher.scoring: engine) on a vLLM engine of its own in the driver (`launch.processes.teacher_scorer`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from configs.base import Section


class TeacherConfig(Section):
    path: str | None = Field(
        None, description="the teacher: a local HF model directory, or a Hub model id (org/name) already in the local "
                          "HF cache, which the run replaces with its snapshot directory. It must share the student's "
                          "tokenizer (vocabulary, special tokens, chat template: checked before start). It runs "
                          "frozen on every learner rank in model.dtype, sharded over the ranks like the reference "
                          "model, or on its own vLLM engine (teacher.scoring=engine) (model.trust_remote_code "
                          "applies to it too); null = no teacher")
    scoring: Literal["learner", "engine"] = Field(
        "learner", description="where --algo opd's teacher scores the student's tokens (log π_teacher of every "
                               "response token, nats, at rollout.temperature without top-k/top-p, the same numbers "
                               "either way). learner = frozen on the learner ranks, sharded like the reference model "
                               "(its weights on the learner GPUs); engine = on a vLLM engine of its own in the "
                               "driver's process (vLLM prompt log-probs of each trained row's prompt + response, "
                               "before the learner step: time/teacher_score_s), so the learner ranks never load it: "
                               "for a teacher too large for the learner's GPUs. Needs teacher.path and an "
                               "algorithm that reads the teacher (refused before start)")
    live_traces: Literal["off", "missing", "all"] = Field(
        "off", description="LUFFY only: which training prompts the teacher (teacher.path, on a vLLM engine of its own) "
                           "writes a trace for while the run goes on. off = traces come from data.demos alone; "
                           "missing = every training prompt with no trace in data.demos; all = every training prompt "
                           "(a file trace is kept until the teacher's replaces it). One trace per prompt, checked by "
                           "the run's reward: only non-empty traces scoring ≥ 1 are used and appended, one JSON line each in "
                           "data.demos' layout, to teacher_traces.jsonl in the run folder, which a later run reads "
                           "offline with --demos (a resumed run reads its own back: no prompt is traced twice). Needs "
                           "teacher.path and --algo luffy (refused before start)")
