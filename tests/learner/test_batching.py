"""Batch assembly: rows, rank shards (whole groups), micro-batch plans, padding and packing, staleness."""

import numpy as np
import pytest
import torch

from buffer.records import Group, Sample
from learner import batching


def _group(gid: int, prompt_len: int, resp_lens: list[int], version: int = 5, reward: float = 1.0) -> Group:
    samples = []
    for k, t in enumerate(resp_lens):
        samples.append(Sample(tokens=np.arange(10, 10 + t, dtype=np.int32),
                              logprobs=np.full(t, -0.5 - k, dtype=np.float32),
                              versions=np.full(t, version - k, dtype=np.int32),
                              prefix_mask=np.zeros(t, dtype=bool), reward=reward * (k % 2)))
    return Group(group_id=f"g{gid}", prompt_index=gid, prompt_tokens=np.arange(1, 1 + prompt_len, dtype=np.int32),
                 samples=samples)


def test_microbatch_positions_targets_and_padding():
    # One group, prompt [1, 2, 3]; responses [10, 11] and [10, 11, 12, 13].
    rows = batching.rows_from_groups([_group(0, 3, [2, 4])])
    mb = batching.make_microbatch(rows, [1, 0], pad_id=0, device=torch.device("cpu"))
    # Inputs: prompt + response[:-1]: row 1 → 1 2 3 10 11 12 (6), row 0 → 1 2 3 10 padded to 6.
    assert mb.input_ids.tolist() == [[1, 2, 3, 10, 11, 12], [1, 2, 3, 10, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]
    # Hidden state at position P-1+t predicts response token t: row 1 (b=0) → 2,3,4,5; row 0 (b=1) → 6+2, 6+3.
    assert mb.positions.tolist() == [2, 3, 4, 5, 8, 9]
    assert mb.targets.tolist() == [10, 11, 12, 13, 10, 11]
    assert mb.width == 4 and mb.num_tokens == (3 + 4) + (3 + 2)
    dense = mb.scatter(torch.arange(6.0))
    assert dense.tolist() == [[0, 1, 2, 3], [4, 5, 0, 0]]


def test_packed_microbatch_has_row_positions_and_no_padding():
    # The rows of the padded test above, in order [0, 1]: row 0 → 1 2 3 10 (4), row 1 → 1 2 3 10 11 12 (6).
    rows = batching.rows_from_groups([_group(0, 3, [2, 4])])
    mb = batching.make_microbatch(rows, [0, 1], pad_id=0, device=torch.device("cpu"), packed=True)
    assert mb.input_ids.tolist() == [[1, 2, 3, 10, 1, 2, 3, 10, 11, 12]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]] and mb.attention_mask is None
    assert mb.row_bounds == (0, 4, 10)
    # Row 0 starts at 0 → positions P-1+t = 2, 3; row 1 starts at 4 → 4+2 … 4+5 (padded: 1·6+2 … = 8 … 11).
    assert mb.positions.tolist() == [2, 3, 6, 7, 8, 9]
    assert mb.targets.tolist() == [10, 11, 10, 11, 12, 13]
    assert mb.scatter(torch.arange(6.0)).tolist() == [[0, 1, 0, 0], [2, 3, 4, 5]]
    assert mb.width == 4 and mb.num_tokens == (3 + 2) + (3 + 4)


def test_global_step_batch_and_staleness():
    rows = batching.rows_from_groups([_group(0, 3, [2, 4], version=7), _group(1, 2, [3], version=6)])
    b = batching.global_step_batch(rows, torch.device("cpu"), step=4)
    assert b.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]]
    assert b.group_index.tolist() == [0, 0, 1] and b.step == 4
    assert b.behav_logprobs[1].tolist() == [-1.5] * 4 and b.behav_logprobs[0, 2:].tolist() == [0, 0]
    # Learner version 9: oldest versions 7, 6, 6 → lags 2, 3, 3; mean 8/3.
    m = batching.staleness_metrics(rows, 9)
    assert m["staleness/min"] == 2 and m["staleness/max"] == 3
    assert m["staleness/mean"] == pytest.approx(8 / 3)


def test_shards_hold_whole_groups_balanced_by_tokens():
    # Group token counts: g0 = 4·(2+10) = 48, g1 = 4·(2+2) = 16, g2 = 4·(2+5) = 28, g3 = 4·(2+3) = 20.
    groups = [_group(0, 2, [10] * 4), _group(1, 2, [2] * 4), _group(2, 2, [5] * 4), _group(3, 2, [3] * 4)]
    rows = batching.rows_from_groups(groups)
    shards = batching.shard_groups(rows, 2)
    # Longest first: g0 → rank 0 (48), g2 → rank 1 (28), g3 → rank 1 (48), g1 → rank 0 (64).
    assert shards == [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]]
    assert sorted(sum(shards, [])) == list(range(16))


def test_plan_sorts_by_length_and_respects_limits():
    rows = batching.rows_from_groups([_group(0, 1, [3, 9, 5, 7, 1])])  # seq lens 3, 9, 5, 7, 1
    plan = batching.plan_microbatches(rows, list(range(5)), max_rows=2)
    assert plan == [[1, 3], [2, 0], [4]]
    # Token cap: rows × longest ≤ 14 → [9] alone (2·9 > 14), then 7+5 (2·7 = 14), then 3+1.
    assert batching.plan_microbatches(rows, list(range(5)), max_rows=4, max_tokens=14) == [[1], [3, 2], [0, 4]]


def test_packed_plan_cuts_by_tokens_first_fit():
    rows = batching.rows_from_groups([_group(0, 1, [3, 9, 5, 7, 1])])  # seq lens 3, 9, 5, 7, 1 (rows 0..4)
    plan = batching.plan_microbatches(rows, list(range(5)), max_rows=4, max_tokens=12, packed=True)
    # Longest first, each into the first micro-batch with room: 9 → A; 7 → B (9+7 > 12); 5 → B (7+5 = 12);
    # 3 → A (9+3 = 12); 1 → C (both full). Padded, rows × longest ≤ 12 gives [9] [7] [5, 3] [1].
    assert plan == [[1, 0], [3, 2], [4]]
    assert batching.plan_microbatches(rows, list(range(5)), max_rows=4, max_tokens=12) == [[1], [3], [2, 0], [4]]
    # A budget of 6: 9 and 7 exceed it and get micro-batches of their own; 5 + 1 = 6 share one; 3 alone.
    assert batching.plan_microbatches(rows, list(range(5)), 4, max_tokens=6, packed=True) == [[1], [3], [2, 4], [0]]
    # The row cap still applies: 2 rows at most.
    assert batching.plan_microbatches(rows, list(range(5)), 2, max_tokens=100, packed=True) == [[1, 3], [2, 0], [4]]


def test_whole_group_plans_never_split_a_group():
    groups = [_group(g, 2, [1 + g, 2 + g, 3, 4][: 2 + g % 3]) for g in range(6)]
    rows = batching.rows_from_groups(groups)
    for max_rows in (1, 2, 3, 5, 8):
        plan = batching.plan_microbatches(rows, list(range(len(rows))), max_rows, whole_groups=True)
        for target in (len(plan), len(plan) + 3):
            for mb in batching.equalize(plan, target, rows, whole_groups=True):
                if mb is None:
                    continue
                for g in {rows[i].group for i in mb}:
                    assert {i for i in range(len(rows)) if rows[i].group == g} <= set(mb)
        assert sorted(sum(plan, [])) == list(range(len(rows)))


def test_equalize_splits_before_adding_dummies():
    rows = batching.rows_from_groups([_group(0, 1, [2, 2, 2])])
    assert batching.equalize([[0, 1, 2]], 3, rows, whole_groups=False) == [[0], [1], [2]]
    assert batching.equalize([[0]], 2, rows, whole_groups=False) == [[0], None]
    assert batching.equalize([[0, 1, 2]], 2, rows, whole_groups=True) == [[0, 1, 2], None]


@pytest.mark.parametrize("bad,match", [
    (lambda g: setattr(g, "prompt_tokens", np.zeros(0, np.int32)), "empty prompt"),
    (lambda g: setattr(g.samples[0], "logprobs", np.zeros(1, np.float32)), "logprobs has 1 entries"),
    (lambda g: setattr(g.samples[1], "reward", float("nan")), "non-finite reward"),
])
def test_bad_groups_are_clear_errors(bad, match):
    g = _group(0, 2, [3, 3])
    bad(g)
    with pytest.raises(ValueError, match=match):
        batching.rows_from_groups([g])
