"""The step-by-step testbed: `algo-train --algo ALGO --testbed steps`, one command like the quick-start.

Why a second built-in task: the quick-start's answers of two or three columns leave dense (per-step) rewards
little to add, its 2-layer character model cannot learn long worked solutions, and its rule step checker
cannot be exploited, so PURE, PRIME and LUFFY cannot show what their papers claim on it
(`../shared/reviews/evidence_notes.md`). The testbed has:

- a multi-step task: `data.arithmetic.level` steps-main (4-5 digit + and −, 5-6 checkable steps), with
  steps-hard (7-8 digits, 8-9 steps) beyond its warm model (`tasks.arithmetic.LEVELS`);
- a deeper warm model (configs/testbeds/steps.yaml: 4 layers, hidden 128, 0.87 M parameters), SFT-warmed on
  noisy worked solutions of steps-main whatever level the run trains on, and cached like the quick-start's
  (`launch.prep.model_prep`, its own key). Its warm-up stops at the first check, every `WARM_CHECK_EVERY`
  steps, whose greedy held-out accuracy reaches `WARM_TARGET` (`AccuracyStop`), or at
  `model.sft_warmup_steps`: a mid-range start (0.2-0.5) that RL must raise, without guessing the step count
  for a model whose learning speed depends on its shape; the checks' accuracies are kept in the model's
  `warmup.json`;
- for `--algo pure`, a learned PRM (`launch.prep.testbed_prm`) used through `pure.prm=hf` exactly as a
  user's PRM is; `--set pure.prm=rule` (or any pure.prm) keeps that scorer instead.

The command (`launch.cli`) resolves the config with configs/testbeds/<name>.yaml laid over configs/<algo>.yaml
(as a `--config` file is) and gives the run the cache directories of the warm model and the PRM as `model.path`
and `pure.prm_path`, before the user's `--set` keys (`command_for_testbed`: parsing builds nothing, so
`--dry-run` and the docs' command checks stay instant); just before the run starts, `build_testbed` builds
what is not cached yet. The run itself is an ordinary run of a model under `model.cache_dir` (config.yaml
records both paths, so `--resume` needs no testbed). Measured build times and figures: docs/running.md
"The step-by-step testbed".

The tools testbed (`--testbed tools`, configs/testbeds/tools.yaml, `launch.prep.testbed_tools`): steps-hard
problems with the built-in calculator offered (`env.tools`), and a warm model of the same shape whose warm-up
saw a share of tool-using demonstrations; no PRM (PURE needs the user's `pure.prm`; LUFFY and SFT are refused with
`env:`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from configs.data_section import ArithmeticTaskConfig
from configs.loading import ConfigError, resolve, user_keys
from configs.schema import RunConfig

TESTBEDS = ("steps", "tools")  # name -> configs/testbeds/<name>.yaml; tools: launch.prep.testbed_tools
MAIN_LEVEL = "steps-main"  # the level the warm model and the PRM learn from
WARM_TARGET = 0.3  # greedy held-out accuracy at which the warm-up stops
WARM_CHECK_EVERY = 100  # SFT steps between two accuracy checks


def yaml_of_testbed(name: str) -> Path:
    """configs/testbeds/<name>.yaml."""
    from importlib import resources

    if name not in TESTBEDS:
        raise ConfigError(f"--testbed: unknown testbed {name!r}; choose one of {', '.join(TESTBEDS)}")
    return Path(str(resources.files("configs").joinpath(f"testbeds/{name}.yaml")))


def warm_config(cfg: RunConfig) -> RunConfig:
    """`cfg` as the warm-up and the PRM read it: the main level, whatever level the run trains on."""
    data = cfg.data.model_copy(update={"arithmetic": ArithmeticTaskConfig(level=MAIN_LEVEL)}, deep=True)
    return cfg.model_copy(update={"data": data}, deep=True)


class AccuracyStop:
    """The warm-up's `launch.prep.model_prep.StopRule`: after every `every` SFT steps, the greedy accuracy of the
    learner's model on the config's held-out prompts (data.eval_prompts of its level, answers of at most
    rollout.max_response_tokens tokens); stop once it reaches `target`. `history`: the checks made."""

    def __init__(self, cfg: RunConfig, target: float = WARM_TARGET, every: int = WARM_CHECK_EVERY, log=print):
        self.cfg, self.target, self.every, self.log = cfg, target, every, log
        self.history: list[dict] = []
        self.done = 0  # SFT steps taken so far
        self._prompts: tuple[list[list[int]], list[str]] | None = None

    def key(self) -> dict:
        return {"accuracy_at_least": self.target, "every": self.every,
                "max_new_tokens": self.cfg.rollout.max_response_tokens}

    def held_out(self, tokenizer) -> tuple[list[list[int]], list[str]]:
        """(prompt ids, answers) of the held-out prompts, in the config's prompt style."""
        if self._prompts is None:
            from actors.prompts import encode_prompt
            from launch.prep.data import load_prompt_records, prompt_style

            _, records = load_prompt_records(self.cfg)
            style = prompt_style(self.cfg)
            self._prompts = ([encode_prompt(tokenizer, r.prompt, style) for r in records],
                             [r.ground_truth for r in records])
        return self._prompts

    def __call__(self, done: int, learner) -> bool:
        self.done = done
        if done % self.every:
            return False
        from launch.prep.policy_samples import greedy_accuracy

        prompts, answers = self.held_out(learner.tokenizer)
        acc = greedy_accuracy(learner.policy.lm, learner.tokenizer, prompts, answers,
                              self.cfg.rollout.max_response_tokens)
        self.history.append({"step": done, "accuracy": acc})
        self.log(f"[sft] step {done}: greedy held-out accuracy {acc:.3f} (stops at {self.target:g})")
        return acc >= self.target


def warm_dir(cfg: RunConfig, name: str = "steps") -> Path:
    """Where the testbed `name`'s warm model of `cfg` is cached (built or not)."""
    from launch.prep.model_prep import warm_plan

    wcfg = warm_config(cfg)
    if name == "tools":
        from launch.prep.testbed_tools import tools_warm_dir

        return tools_warm_dir(wcfg)
    return warm_plan(wcfg, AccuracyStop(wcfg))[0]


def prepare_warm(cfg: RunConfig, log=print, every: int = WARM_CHECK_EVERY) -> Path:
    """The testbed's warm model of `cfg` (accuracy checks every `every` SFT steps), built if it is not cached; a
    build writes `warmup.json` into it: the SFT steps taken, the checks, its seconds, and its greedy held-out
    accuracy on every level (`level_accuracies`)."""
    from launch.prep.model_prep import prepare_model

    wcfg = warm_config(cfg)
    stop = AccuracyStop(wcfg, every=every, log=log)
    start = time.monotonic()
    path = prepare_model(wcfg, log=log, until=stop)
    if stop.done:  # built now (a cached model takes no step)
        report = {"steps": stop.done, "max_steps": wcfg.model.sft_warmup_steps, "checks": stop.history,
                  "target": stop.target, "reached_target": any(c["accuracy"] >= stop.target for c in stop.history),
                  "seconds": round(time.monotonic() - start, 1),
                  "greedy_heldout_accuracy": level_accuracies(wcfg, path)}
        (path / "warmup.json").write_text(json.dumps(report, indent=1) + "\n")
    return path


def level_accuracies(cfg: RunConfig, model_dir: Path) -> dict[str, float]:
    """Greedy held-out accuracy of the model in `model_dir` on every level (`tasks.arithmetic.LEVELS`), on the
    held-out prompts a run of `cfg` at that level evaluates on."""
    import torch
    from transformers import AutoModelForCausalLM

    from actors.prompts import load_tokenizer
    from launch.prep.policy_samples import greedy_accuracy
    from tasks.arithmetic import LEVELS

    tokenizer = load_tokenizer(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = {}
    for level in LEVELS:
        lcfg = cfg.model_copy(update={"data": cfg.data.model_copy(
            update={"arithmetic": ArithmeticTaskConfig(level=level)}, deep=True)}, deep=True)
        stop = AccuracyStop(lcfg)
        out[level] = greedy_accuracy(model, tokenizer, *stop.held_out(tokenizer), cfg.rollout.max_response_tokens)
    return out


def _testbed_run(name: str, algo: str | None, config_file: str | None, flags: dict,
                 overrides: list[str]) -> tuple[RunConfig, bool]:
    """(the run's config before the testbed's paths are given to it, whether it takes the learned PRM); refuses
    what the testbed replaces: a --config file, a model, a data file."""
    if config_file:
        raise ConfigError(f"--testbed {name}: lays {yaml_of_testbed(name)} over configs/<algo>.yaml as a --config "
                          "file would — pass your keys with --set, or copy its keys into your file and drop --testbed")
    given = user_keys({}, flags, overrides)
    for key, flag in (("model.path", "--model"), ("data.path", "--data")):
        if key in given:
            raise ConfigError(f"{flag}: --testbed {name} trains its own warm model on its own task — drop {flag} "
                              "(or drop --testbed)")
    cfg = resolve(algo, str(yaml_of_testbed(name)), flags, overrides)  # what the user gave, validated
    prm = cfg.algo == "pure" and not {"pure.prm", "pure.prm_path"} & given
    if prm and name == "tools":
        raise ConfigError("--algo pure --testbed tools: the tools testbed trains no PRM (a PURE step there is a policy "
                          "turn, and the steps testbed's PRM scores column steps) — name yours with --set "
                          "pure.prm=FILE.py:FUNCTION (or pure.prm=hf --set pure.prm_path=DIR), or use grpo, rloo, "
                          "pacs or prime")
    return cfg, prm


def command_for_testbed(name: str, algo: str | None, config_file: str | None, flags: dict,
                        overrides: list[str]) -> tuple[str, list[str]]:
    """(the --config file, the --set list) of the testbed `name`'s run (module docstring): the warm model's (and
    PURE's PRM's) cache directories first, the user's keys after. Builds nothing (`build_testbed` does)."""
    return str(yaml_of_testbed(name)), [*testbed_sets(name, algo, config_file, flags, overrides), *overrides]


def testbed_sets(name: str, algo: str | None, config_file: str | None, flags: dict,
                 overrides: list[str]) -> list[str]:
    """The --set keys the testbed `name` gives a run of these arguments: `model.path=` its warm model's cache
    directory and, for PURE without a PRM of the user's, `pure.prm=hf pure.prm_path=` its PRM's."""
    from launch.prep.testbed_prm import prm_dir

    cfg, prm = _testbed_run(name, algo, config_file, flags, overrides)
    warm = warm_dir(cfg, name)
    extra = [f"model.path={warm.resolve()}"]
    if prm:
        extra += ["pure.prm=hf", f"pure.prm_path={prm_dir(cfg, warm).resolve()}"]
    return extra


def build_testbed(name: str, algo: str | None, flags: dict, overrides: list[str], log=print) -> list[Path]:
    """Build what `command_for_testbed` names (the warm model, and PURE's PRM), unless cached; their paths."""
    cfg, prm = _testbed_run(name, algo, None, flags, overrides)
    if name == "tools":
        from launch.prep.testbed_tools import prepare_tools_warm

        return [prepare_tools_warm(warm_config(cfg), cfg, log)]
    warm = prepare_warm(cfg, log)
    if not prm:
        return [warm]
    from launch.prep.testbed_prm import prepare_prm

    return [warm, prepare_prm(warm_config(cfg), warm, log=log)]  # same prm_dir key as cfg: warm_config changes the level only
