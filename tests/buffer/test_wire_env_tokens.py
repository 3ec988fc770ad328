"""Environment tokens of multi-turn rows on the wire: they travel bit-exact, are validated (version -1, log mu
0, never a demonstration token) and never count for the oldest version the buffer admits by."""

from __future__ import annotations

import numpy as np
import pytest

from buffer.records import ENV_VERSION, Group, Sample
from buffer.settings import BufferSettings
from buffer.wire import WireError, encode_group, parse_group
from tests.buffer.helpers import assert_same_group


def two_turn_group(versions=(7, 7, 9, 9), env_version=ENV_VERSION, env_lp=0.0, prefix_on_env=False) -> Group:
    """One row: turn 1 (2 tokens at versions[0:2]), a 3-token observation, turn 2 (versions[2:4])."""
    env = np.array([0, 0, 1, 1, 1, 0, 0], bool)
    v = np.array([versions[0], versions[1], env_version, env_version, env_version, versions[2], versions[3]], np.int32)
    lp = np.array([-0.5, -0.25, env_lp, env_lp, env_lp, -1.0, -2.0], np.float32)
    prefix = env.copy() if prefix_on_env else np.zeros(7, bool)
    s = Sample(tokens=np.arange(10, 17, dtype=np.int32), logprobs=lp, versions=v, prefix_mask=prefix, reward=1.0,
               env_mask=env)
    plain = Sample(tokens=np.array([5, 6], np.int32), logprobs=np.array([-0.1, -0.2], np.float32),
                   versions=np.array([8, 8], np.int32), prefix_mask=np.zeros(2, bool), reward=0.0)
    return Group("g", 3, np.array([1, 2], np.int32), [s, plain])


def parsed(g: Group):
    return parse_group([bytes(memoryview(f)) for f in encode_group(g)], BufferSettings().limits)


def test_env_mask_round_trips_and_environment_tokens_are_no_version():
    g = two_turn_group()
    wg = parsed(g)
    assert_same_group(g, wg.to_group())
    assert wg.to_group().samples[1].env_mask.tolist() == [False, False]  # single-turn rows: all False
    # oldest policy version: min(7, 7, 9, 9, 8, 8) = 7; the environment's -1 is not a version
    assert wg.oldest_version == 7 == g.oldest_version()


@pytest.mark.parametrize("edit,reason", [
    ({"env_version": 3}, "bad_version"),  # an environment token must carry ENV_VERSION
    ({"env_lp": -0.5}, "bad_value"),  # ... and log mu 0
    ({"prefix_on_env": True}, "bad_mask"),  # ... and is never a demonstration token too
    ({"versions": (7, -1, 9, 9)}, "bad_version"),  # a policy token needs a version >= 0
])
def test_bad_environment_tokens_are_refused(edit, reason):
    with pytest.raises(WireError) as e:
        parsed(two_turn_group(**edit))
    assert e.value.reason == reason


def test_a_trajectory_spanning_versions_is_admitted_by_its_oldest_policy_token():
    """The admission rule for long episodes (docs/architecture.md): a multi-turn group's staleness is the
    learner version minus its OLDEST policy token's version (turn 1 here), so every trained token lags at
    most K = buffer.max_staleness; environment tokens carry no version and never count."""
    from buffer.core import BufferCore

    c = BufferCore(BufferSettings(batch_prompts=1, max_staleness=1))
    c.set_version(8)
    assert c.request_credit("a", 1, 7) == 1  # granted at version 7: trained by version 8 at the latest
    ok, reason, _ = c.push("a", parsed(two_turn_group(versions=(7, 7, 9, 9))))  # a push landed between turns
    assert ok, reason  # lag 8 - 7 = 1 <= K; its turn-2 tokens (version 9) lag less
    c.set_version(9)  # now turn 1 would lag 9 - 7 = 2 > K: the group is dropped, not trained
    assert c.take(1) is None
    assert c.counts["dropped/stale_on_version"] == 1 and c.discarded == [[0, 3]]  # settled in the ledger, once
