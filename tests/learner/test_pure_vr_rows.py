"""pure.vr_fraction through the learner: the process_rewards provider marks each row's prompt with
`algos.pure.maths.vr_prompt` and the advantage reads it."""

from algos.pure.maths import vr_prompt
from learner.learner import Learner
from tests.learner.helpers import make_cfg, make_groups


def test_vr_rows_follow_the_prompt_hash(tiny_dir, tokenizer):
    groups = make_groups(tokenizer, 4, 4, version=1)
    cfg = make_cfg("pure", learner={"batch_prompts": 4}, pure={"vr_fraction": 0.5})
    learner = Learner(cfg, 0, 1, tiny_dir)
    m = learner.step(groups, version=1)
    want = sum(vr_prompt(g.prompt_tokens.tolist(), cfg.seed, 0.5) for g in groups) / len(groups)
    assert m["pure/vr_row_frac"] == want
