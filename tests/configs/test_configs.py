"""Config schema, YAML files and the CLI's parse-time errors."""

import subprocess
import sys
from pathlib import Path

import pytest

import algos
from configs.loading import ConfigError, builtin_config_path, dump, resolve
from configs.schema import RunConfig
from launch.cli import main

ROOT = Path(__file__).resolve().parents[2]
YAMLS = sorted((ROOT / "configs").glob("*.yaml"))


def test_every_algorithm_has_a_yaml_and_a_registered_spec():
    assert {p.stem for p in YAMLS} == set(algos.names()) | {"quickstart"}


@pytest.mark.parametrize("path", YAMLS, ids=[p.stem for p in YAMLS])
def test_every_checked_in_yaml_parses(path):
    cfg = resolve(config_file=str(path))
    assert cfg.algo == ("grpo" if path.stem == "quickstart" else path.stem)
    # round trip: the dumped config validates to the same object
    assert RunConfig.model_validate(__import__("yaml").safe_load(dump(cfg))) == cfg


def test_quickstart_equals_algo_grpo():
    assert resolve(config_file=str(builtin_config_path("quickstart"))) == resolve("grpo")


def test_overrides_and_flags_apply():
    cfg = resolve("pure", flags={"buffer.max_staleness": 3, "rollout.num_actors": None},
                  overrides=["loss.clip_high=0.28", "learner.betas=[0.9, 0.95]", "pure.credit=strict"])
    assert cfg.buffer.max_staleness == 3 and cfg.rollout.num_actors == 1  # None flag = not given: pure.yaml's
    assert cfg.loss.clip_high == 0.28 and cfg.learner.betas == (0.9, 0.95) and cfg.pure.credit == "strict"


def test_max_staleness_auto():
    """`auto` is max_staleness_auto from K = 1 (config.yaml records both), from YAML, --set or the flag;
    the cap must not lie below where K starts."""
    for cfg in (resolve("grpo", overrides=["buffer.max_staleness=auto"]),
                resolve("grpo", flags={"buffer.max_staleness": "auto"})):
        b = cfg.buffer
        assert (b.max_staleness, b.max_staleness_auto, b.max_staleness_cap) == (1, True, 4)
        assert RunConfig.model_validate(__import__("yaml").safe_load(dump(cfg))) == cfg
    assert resolve("grpo").buffer.max_staleness_auto  # the presets let the run choose K
    with pytest.raises(ConfigError, match="buffer.max_staleness_cap: 2 is below buffer.max_staleness=3"):
        resolve("grpo", overrides=["buffer.max_staleness=3", "buffer.max_staleness_auto=true",
                                   "buffer.max_staleness_cap=2"])
    with pytest.raises(ConfigError, match="buffer.max_staleness: Input should be a valid integer"):
        resolve("grpo", overrides=["buffer.max_staleness=sometimes"])


@pytest.mark.parametrize("algo,overrides,flags,message", [
    ("pure", ["buffer.max_stalenes=2"], {}, "buffer.max_stalenes: unknown key — did you mean 'buffer.max_staleness'"),
    ("grpo", ["buffer.max_staleness=-1"], {}, "buffer.max_staleness: Input should be greater than or equal to 0"),
    ("grpo", ["learner.lr=fast"], {}, "learner.lr: Input should be a valid number"),
    ("pacs", ["learner.micro_batch_samples=12"], {}, "learner.micro_batch_samples: pacs needs whole groups"),
    ("luffy", [], {"data.path": "x.parquet", "data.task": "file"}, "data.demos: luffy needs demonstrations"),
    ("luffy", ["luffy.n_prefix=8"], {}, "luffy.n_prefix: 8 guided rows leave no on-policy row"),
    ("prime", ["buffer.filter=none"], {}, "buffer.filter: PRIME trains on groups inside the accuracy window"),
    ("grpo", ["model.tiny.hidden_size=100"], {}, "model.tiny.hidden_size: head_dim"),
    ("grpo", ["loss.agg=sum"], {}, "loss.agg: Input should be 'token-mean'"),
    ("grpo", ["learner.lr.x=1"], {}, "learner.lr: is a value, not a section"),
    ("grpo", ["nokey"], {}, "expected KEY=VALUE"),
])
def test_bad_configs_fail_naming_the_key(algo, overrides, flags, message):
    with pytest.raises(ConfigError) as e:
        resolve(algo, flags=flags, overrides=overrides)
    assert message in str(e.value)


def test_bad_yaml_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("algo: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        resolve(config_file=str(f))
    with pytest.raises(ConfigError, match="no such file"):
        resolve(config_file=str(tmp_path / "missing.yaml"))


def test_cli_dry_run_and_errors(capsys):
    assert main(["--algo", "pure", "--dry-run", "--max-staleness", "2"]) == 0
    out = capsys.readouterr().out
    assert "algo: pure" in out and "max_staleness: 2  # K:" in out and "max_staleness_auto: false" in out
    # a number is a fixed K, also over a file that spells out max_staleness_auto: true (quickstart.yaml)
    assert main(["--config", str(builtin_config_path("quickstart")), "--dry-run", "--max-staleness", "2"]) == 0
    out = capsys.readouterr().out
    assert "max_staleness: 2  # K:" in out and "max_staleness_auto: false" in out
    assert main(["--algo", "grpo", "--dry-run", "--max-staleness", "auto"]) == 0
    assert "max_staleness_auto: true" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--algo", "grpo", "--dry-run", "--max-staleness", "often"])
    assert "expected a whole number of versions or auto, got 'often'" in capsys.readouterr().err
    assert main(["--algo", "pure", "--set", "pure.credt=strict", "--dry-run"]) == 2
    assert "pure.credt: unknown key — did you mean 'pure.credit'?" in capsys.readouterr().err


def test_console_script_help_lists_every_algorithm():
    exe = Path(sys.executable).with_name("algo-train")
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    for name in algos.names():
        assert f"  {name} " in out


def test_an_algorithm_is_its_registry_entry_and_validates_its_own_section(monkeypatch):
    """A spec added to the registry is accepted as `algo` and its own rules run with the shared ones;
    the built-in specs' rules name their keys."""
    from algos import spec as registry

    def toy_problems(cfg):
        if cfg.loss.clip_low > 0.1:
            yield "loss.clip_low: toy needs ε ≤ 0.1 — set loss.clip_low=0.1"

    toy = registry.AlgoSpec(name="toy", summary="a test algorithm", maths=registry.Maths(losses=()),
                            validate=toy_problems)
    monkeypatch.setitem(registry._REGISTRY, "toy", toy)
    assert RunConfig(algo="toy", loss={"clip_low": 0.05}).algo == "toy"
    with pytest.raises(ValueError, match="loss.clip_low: toy needs"):
        RunConfig(algo="toy")
    with pytest.raises(ValueError, match="unknown algorithm 'nope'; choose one of grpo"):
        RunConfig(algo="nope")
    refused = {
        "pacs": (["loss.is_correction=decoupled"], "loss.is_correction: 'decoupled' decouples a PPO clip"),
        "prime": (["buffer.filter=none"], "buffer.filter: PRIME trains on groups inside the accuracy window"),
        "pure": (["pure.prm=hf"], "pure.prm_path: pure.prm=hf needs"),
        "luffy": (["luffy.n_prefix=8"], "luffy.n_prefix: 8 guided rows leave no on-policy row"),
        "grpo": (["learner.mini_batches=9"], "learner.mini_batches: 9 mini-batches of whole groups need at least"),
    }
    with pytest.raises(ConfigError, match="prime.drop_last_token: with prime.granularity=whole"):
        resolve("prime", overrides=["prime.drop_last_token=true", "prime.granularity=whole"])
    refused["pacs"] = (["loss.overlong_cache_tokens=8"], "loss.overlong_cache_tokens: PACS' BCE labels are the 0/1")
    with pytest.raises(ConfigError, match="loss.ratio_level: PACS has no PPO ratio"):
        resolve("pacs", overrides=["loss.ratio_level=sequence"])
    with pytest.raises(ConfigError, match="prime.ref: 'policy' compares the PRM's untruncated log-probs"):
        resolve("prime", overrides=["prime.ref=policy", "rollout.top_p=0.9"])
    with pytest.raises(ConfigError, match="loss.overlong_cache_tokens: 999 exceeds the generation limit"):
        resolve("grpo", overrides=["loss.overlong_cache_tokens=999"])
    for algo, (overrides, message) in refused.items():
        with pytest.raises(ConfigError, match=message):
            resolve(algo, overrides=overrides)
