"""Models as users have them: a Hub id (`--model org/name`) found in the local HF cache is the run's model,
with no network; one that is not cached is refused before start with the download command and the cache
searched. And `model.trust_remote_code` reaches every loader of the model's own code: transformers'
tokenizer, config and model classes (learner policy and reference, PURE's PRM, the actors' tokenizer,
samples, preflight) and vLLM's engine arguments.

The cache is built as huggingface_hub lays it out (`tests.hub_cache`) and named the way a user names
theirs, with HF_HUB_CACHE; as huggingface_hub reads that variable when it is imported, those checks run in
a fresh process, as a user's `algo-train` does."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from actors.engine import EngineSpec
from actors.prompts import load_tokenizer
from configs.schema import RunConfig
from launch.loop.samples import SampleLog
from launch.prep.hub import is_hub_id
from launch.prep.preflight import PreflightError, preflight
from learner.prm.pure import make_prm
from tasks.tiny_model import build_tiny_model
from tests.hub_cache import hub_cache

ROOT = Path(__file__).resolve().parents[2]


def as_user(cache: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(cache)}
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


RESOLVE = """
import sys
sys.path.insert(0, {root!r})
from configs.loading import resolve
from launch.commands.evaluate import build_parser, eval_config
from launch.prep.model_prep import prepare_model
from launch.prep.preflight import preflight
from launch.state.storage import absolutize

cfg = resolve("grpo", flags={{"model.path": "org/tiny-chat"}})
preflight(cfg)
print(absolutize(cfg, ".").model.path)
print(prepare_model(cfg))
print(eval_config(build_parser().parse_args(["--model", "org/tiny-chat", "--data", "d.jsonl"])).model.path)
"""


def test_a_cached_hub_id_is_the_snapshot_offline(tmp_path):
    snapshot = hub_cache(tmp_path / "hub", "org/tiny-chat", build_tiny_model(tmp_path / "tiny"))
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "d.jsonl").write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    done = as_user(tmp_path / "hub", "-c", RESOLVE.format(root=str(ROOT)), cwd=tmp_path / "work")
    assert done.returncode == 0, done.stderr
    # preflight passed; config.yaml records the snapshot; the roles load it; `algo-train eval` takes the id too
    assert done.stdout.splitlines() == [str(snapshot)] * 3


def test_an_uncached_hub_id_is_refused_with_the_download_command(tmp_path):
    (tmp_path / "hub").mkdir()
    done = as_user(tmp_path / "hub", "-m", "launch.cli", "--algo", "grpo", "--steps", "20", "--model",
                   "org/not-downloaded", "--output", str(tmp_path / "run"), cwd=ROOT)
    assert done.returncode == 2 and not (tmp_path / "run").exists()
    assert done.stderr.splitlines() == [
        f"algo-train: model.path: org/not-downloaded is not a local directory and not in the HF cache {tmp_path}/hub "
        "— download it with `hf download org/not-downloaded` (older huggingface_hub: `huggingface-cli download "
        "org/not-downloaded`), set HF_HUB_CACHE (or HF_HOME) to the cache that holds it, or pass a local HF model "
        "directory"]


def test_a_local_directory_wins_over_a_hub_id(tmp_path):
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert not is_hub_id("org/model", tmp_path) and is_hub_id("org/model", tmp_path / "org")
    assert not is_hub_id("/abs/model") and not is_hub_id("./org/model") and not is_hub_id("a/b/c")


CONFIG_PY = """from transformers import LlamaConfig


class TinyRemoteConfig(LlamaConfig):
    model_type = "tiny_remote"
"""
MODELING_PY = """from torch import nn
from transformers import LlamaForCausalLM, LlamaModel, LlamaPreTrainedModel
from transformers.modeling_outputs import TokenClassifierOutput

from .configuration_tiny import TinyRemoteConfig


class TinyRemoteLM(LlamaForCausalLM):
    config_class = TinyRemoteConfig


class TinyRemoteTagger(LlamaPreTrainedModel):
    config_class = TinyRemoteConfig

    def __init__(self, config):
        super().__init__(config)
        self.model = LlamaModel(config)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return TokenClassifierOutput(logits=self.score(hidden))
"""
TOKENIZATION_PY = """from transformers import PreTrainedTokenizerFast


class TinyRemoteTokenizer(PreTrainedTokenizerFast):
    pass
"""


@pytest.fixture(scope="module")
def remote_dir(tmp_path_factory) -> Path:
    """The tiny model as a repository with its own code: config, model classes and tokenizer class live in
    .py files beside the weights (`auto_map`), as custom architectures on the Hub ship them."""
    path = build_tiny_model(tmp_path_factory.mktemp("remote") / "tiny")
    config = json.loads((path / "config.json").read_text())
    config.update(model_type="tiny_remote", num_labels=2, architectures=["TinyRemoteLM"], auto_map={
        "AutoConfig": "configuration_tiny.TinyRemoteConfig", "AutoModelForCausalLM": "modeling_tiny.TinyRemoteLM",
        "AutoModelForTokenClassification": "modeling_tiny.TinyRemoteTagger"})
    (path / "config.json").write_text(json.dumps(config))
    tok = json.loads((path / "tokenizer_config.json").read_text())
    tok.update(tokenizer_class="TinyRemoteTokenizer",
               auto_map={"AutoTokenizer": [None, "tokenization_tiny.TinyRemoteTokenizer"]})
    (path / "tokenizer_config.json").write_text(json.dumps(tok))
    for name, code in (("configuration_tiny", CONFIG_PY), ("modeling_tiny", MODELING_PY),
                       ("tokenization_tiny", TOKENIZATION_PY)):
        (path / f"{name}.py").write_text(code)
    return path


def cfg_for(model: Path, trust: bool, **sections) -> RunConfig:
    return RunConfig.model_validate({"model": {"path": str(model), "trust_remote_code": trust}, **sections})


@pytest.fixture
def one_rank():
    """The private process group of an in-process learner, removed afterwards (other tests make their own)."""
    import torch.distributed as dist

    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_trust_remote_code_reaches_the_learner_and_the_prm(remote_dir, one_rank, tmp_path):
    from transformers import AutoModelForCausalLM

    from learner.checkpoint import export_hf
    from learner.learner import Learner

    learner = Learner(cfg_for(remote_dir, True), rank=0, world_size=1, model_dir=remote_dir, device="cpu")
    assert type(learner.tokenizer).__name__ == "TinyRemoteTokenizer"
    assert type(learner.policy.lm).__name__ == "TinyRemoteLM"
    assert type(learner.reference().lm).__name__ == "TinyRemoteLM"  # the KL / PRIME reference
    # the HF export carries the model's code with it, so it loads as the model did
    export = export_hf(learner.save(tmp_path / "checkpoint"), tmp_path / "hf", dtype=torch.float32)
    assert type(AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True)).__name__ == "TinyRemoteLM"
    pure = {"algo": "pure", "pure": {"prm": "hf", "prm_path": str(remote_dir)}}
    assert type(make_prm(cfg_for(remote_dir, True, **pure), torch.device("cpu")).model).__name__ == "TinyRemoteTagger"
    with pytest.raises(ValueError, match="contains custom code which must be executed"):
        make_prm(cfg_for(remote_dir, False, **pure), torch.device("cpu"))
    with pytest.raises(ValueError, match="contains custom code which must be executed"):
        Learner(cfg_for(remote_dir, False), rank=0, world_size=1, model_dir=remote_dir, device="cpu")


def test_trust_remote_code_reaches_the_actors_samples_preflight_and_vllm(remote_dir, tmp_path):
    tokenizer = load_tokenizer(str(remote_dir), True)  # the actors' and the driver's
    assert type(tokenizer).__name__ == "TinyRemoteTokenizer"
    samples = SampleLog(tmp_path, 1, 1, remote_dir, trust_remote_code=True)
    assert samples._decode(tokenizer("42")["input_ids"]) == "42"
    preflight(cfg_for(remote_dir, True))
    with pytest.raises(PreflightError, match=r"model.path: the tokenizer in .* does not load \(The repository .* "
                                             "contains custom code which must be executed"):
        preflight(cfg_for(remote_dir, False))
    from vllm.engine.arg_utils import AsyncEngineArgs

    for trust in (True, False):
        spec = EngineSpec.from_config(cfg_for(remote_dir, trust), remote_dir, weight_transfer=False)
        assert AsyncEngineArgs(**spec.engine_args_kwargs()).trust_remote_code is trust  # what the engine is built with
