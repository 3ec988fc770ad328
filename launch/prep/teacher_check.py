"""Is the teacher usable for distillation? Read before start by `launch.prep.preflight.check_teacher`.

Distillation scores the student's own token ids with the teacher (`learner.providers.TeacherLogprobs`): the
prompt as the student's chat template rendered it and the response the student sampled. That is only
meaningful when the ids mean the same text to both, so the teacher must have the student's tokenizer:
  - the vocabulary: every token string with the same id (added and special tokens included);
  - the special tokens the scored ids hold: eos (the last token of every finished response) and bos;
  - the chat template, when prompts are rendered with the student's own (data.prompt_format=chat and no
    data.chat_template): the teacher then reads prompts in a format it was tuned on. A template given with
    data.chat_template is the user's choice for both and is not compared.
Padding is never scored, so the pad token is not compared. The teacher's model must also have a logit for
every token id the student can emit (config.json vocab_size ≥ the tokenizer's length).
"""

from __future__ import annotations

FIX = ("distillation scores the student's token ids with the teacher, so both need one tokenizer — use a teacher "
       "of the student's model family with its tokenizer files")


def tokenizer_difference(student, teacher, compare_template: bool) -> str | None:
    """The first difference that matters between two HF tokenizers (module docstring), in words; None = none."""
    sv, tv = student.get_vocab(), teacher.get_vocab()
    if sv != tv:
        other = sorted(tok for tok, i in sv.items() if tv.get(tok) != i)
        extra = sorted(tok for tok in tv if tok not in sv)
        if other:
            tok = other[0]
            where = f"id {tv[tok]} in the teacher" if tok in tv else "absent from the teacher"
            return (f"the vocabularies differ ({len(sv)} and {len(tv)} tokens; {len(other)} of the student's tokens "
                    f"are absent from the teacher or have another id, e.g. {tok!r}: id {sv[tok]} in the student, "
                    f"{where})")
        return (f"the vocabularies differ: the teacher has {len(extra)} token(s) the student has not, "
                f"e.g. {extra[0]!r}")
    for name in ("eos_token_id", "bos_token_id"):
        s, t = getattr(student, name, None), getattr(teacher, name, None)
        if s != t:
            return f"the {name.removesuffix('_id')} differs (id {s} in the student, {t} in the teacher)"
    if compare_template and getattr(student, "chat_template", None) != getattr(teacher, "chat_template", None):
        return ("the chat templates differ (the teacher would read prompts in the student's format; give one "
                "template to both with data.chat_template if that is what you want)")
    return None
