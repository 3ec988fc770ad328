"""The environment interface a user implements for everything tools do not cover (games, multi-step tasks).

    class Guess(Environment):
        def reset(self, record):               # the prompt's record -> first observation (None: the prompt)
            self.secret = int(record["ground_truth"])
            return None
        def step(self, action):                # the policy's turn (text) -> (observation, reward, done)
            guess = int(action.strip() or 0)
            if guess == self.secret:
                return "", 1.0, True
            return ("higher" if guess < self.secret else "lower"), 0.0, False

Named `env.environment: path/to/file.py:Guess` (or `module:Guess`). One instance per trajectory, made with
no arguments (TRL's `environment_factory`, veRL's interaction per request), so an instance holds the state
of one episode. `reset` and `step` may be `async def`.

- `record`: {"question", "ground_truth", "data_source", "extra", "prompt_index"} of the prompt.
- `reset` returns the first observation: None (or "") to start from the data's prompt; a string becomes
  the group's prompt instead (one user message, with `data.system_prompt` and the chat template). The n
  trajectories of a group share their prompt, so reset must return the same text for them (a function of
  the record); a group whose resets disagree ends with `env/errors`.
- `step` returns the observation (sent back as a user message; "" sends nothing), the turn's reward, and
  whether the episode is over. The episode's reward is the sum of its turns' rewards (`reward.fn` is not
  called for an environment).

A class that cannot load, cannot be made without arguments, or whose `reset`/`step` do not take one
argument each is refused before the run starts with the reason (`check_environment_class`).
"""

from __future__ import annotations

import inspect

from envs.tools import ToolLoadError, load_object


class Environment:
    """Base class (optional: any class with these two methods fits)."""

    def reset(self, record: dict) -> str | None:
        return None

    def step(self, action: str) -> tuple[str, float, bool]:
        raise NotImplementedError


def load_environment_class(spec: str) -> type:
    """The class `env.environment` names, checked (`check_environment_class`)."""
    cls = load_object(spec, "env.environment")
    check_environment_class(cls, spec)
    return cls


def check_environment_class(cls, spec: str) -> None:
    """`ToolLoadError` naming the fix unless `cls` is a class made with no arguments whose `reset(record)` and
    `step(action)` take one argument each."""
    where = f"env.environment={spec}"
    if not inspect.isclass(cls):
        raise ToolLoadError(f"{where}: is a {type(cls).__name__}, not a class — name a class with reset(record) "
                            "and step(action)")
    try:
        inspect.signature(cls).bind()
    except TypeError as e:
        raise ToolLoadError(f"{where}: cannot be made without arguments ({e}); one instance is made per trajectory "
                            "— give __init__'s parameters defaults") from None
    except ValueError:
        pass  # no signature to read (a builtin base): nothing to check
    for name, arg in (("reset", "record"), ("step", "action")):
        method = getattr(cls, name, None)
        if not callable(method):
            raise ToolLoadError(f"{where}: has no method {name}({arg})")
        try:
            inspect.signature(method).bind(None, arg)
        except TypeError:
            raise ToolLoadError(f"{where}: {name}{inspect.signature(method)} must take one argument, {name}(self, "
                                f"{arg})") from None
