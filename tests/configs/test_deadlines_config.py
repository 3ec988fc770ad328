"""`rollout.deadlines`: auto, seconds or null accepted; anything else refused at load in one line that names
the key and the fix (`configs.deadlines`)."""

from __future__ import annotations

import pytest

from configs.loading import ConfigError, resolve


@pytest.mark.parametrize("override,got", [
    ("rollout.deadlines.progress_s=-1", "-1"),
    ("rollout.deadlines.progress_s=0", "0"),
    ("rollout.deadlines.group_s=soon", "'soon'"),
    ("rollout.deadlines.group_s=off", "false"),  # YAML reads off as false: null is how it is turned off
])
def test_a_bad_deadline_is_refused_naming_the_fix(override, got):
    key = override.split("=")[0]
    with pytest.raises(ConfigError) as e:
        resolve("grpo", overrides=[override])
    line = next(x.strip() for x in str(e.value).splitlines() if x.strip().startswith(key))
    assert line.startswith(f"{key}: expects auto, null (none) or seconds > 0, got {got} — set {key}=auto, a number "
                           "of seconds, or null to turn it off")


def test_retries_must_be_a_count():
    with pytest.raises(ConfigError, match=r"rollout\.deadlines\.retries: Input should be greater than or equal to 0"):
        resolve("grpo", overrides=["rollout.deadlines.retries=-1"])


def test_defaults_seconds_and_null_are_accepted():
    d = resolve("grpo").rollout.deadlines
    assert (d.progress_s, d.group_s, d.retries) == ("auto", "auto", 2)
    d = resolve("grpo", overrides=["rollout.deadlines.progress_s=12", "rollout.deadlines.group_s=null",
                                   "rollout.deadlines.retries=0"]).rollout.deadlines
    assert (d.progress_s, d.group_s, d.retries) == (12.0, None, 0)
