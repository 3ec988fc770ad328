"""PURE's process reward: per-token decoding, step ends, the rule checker and the HF token-classification
PRM behind one interface, and the "process_rewards" provider inside a learner step."""

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForTokenClassification

from learner.learner import Learner
from learner.prm.pure import (
    HFTokenClassificationPRM,
    RuleStepChecker,
    make_prm,
    response_steps,
    score_response,
    token_batches,
    token_texts,
)
from tests.learner.helpers import make_cfg, make_groups
from tests.learner.local_ranks import LearnerGroup, spawn_ranks

SOLUTION = "2+7+0=9, 9\n\n1+0+0=1, 19\n\n\\boxed{19}"  # Problem(12, "+", 7).solution


def _ids(tokenizer, text, eos=True):
    return tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if eos else [])


def test_token_texts_join_to_the_response(tokenizer):
    ids = _ids(tokenizer, "2+7\n\n")
    assert token_texts(tokenizer, ids) == ["2", "+", "7", "\n", "\n", ""]  # eos decodes to ""


@pytest.mark.parametrize("text,scores", [
    (SOLUTION, [1.0, 1.0, 1.0]),
    (SOLUTION.replace("1+0+0=1, 19", "1+0+0=2, 29").replace("{19}", "{29}"), [1.0, -1.0, -1.0]),
    ("2+7+0=9, 9\n\nI think", [1.0, 0.0]),
])
def test_rule_checker_step_ends_and_scores(tokenizer, text, scores):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12+7?"}], tokenize=True,
                                           add_generation_prompt=True)
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    ends, got = score_response(RuleStepChecker(), tokenizer, prompt, _ids(tokenizer, text))
    # "2+7+0=9, 9\n\n" is 12 characters (tokens 0..11): the first step ends at token 11; the second
    # step "1+0+0=1, 19\n\n" (13) ends at 24; the final step ends at the eos (the last token).
    n = len(text) + 1
    assert ends == ([11, 24, n - 1] if len(scores) == 3 else [11, n - 1])
    assert got == scores


def test_a_multi_turn_response_has_one_step_per_policy_turn(tokenizer):
    # policy "1+2\n\n=3" (7 tokens), tool result "<3>" (3 environment tokens), policy "ok" + eos (3 tokens):
    # with env, the "\n\n" inside turn 1 splits nothing; step 2 holds the observation and turn 2
    turn1, obs, turn2 = _ids(tokenizer, "1+2\n\n=3", eos=False), _ids(tokenizer, "<3>", eos=False), _ids(tokenizer, "ok")
    env = [False] * len(turn1) + [True] * len(obs) + [False] * len(turn2)
    (_, text, chars), spans = response_steps(tokenizer, [], turn1 + obs + turn2, env)
    assert spans == [(0, 7), (7, 13)]
    assert [text[a:b] for a, b in chars] == ["1+2\n\n=3", "<3>ok"]  # the eos decodes to ""
    assert response_steps(tokenizer, [], turn1 + obs + turn2)[1] == [(0, 5), (5, 13)]  # single-turn reading


def test_empty_steps_get_no_step_end_and_prose_shifts_nothing(tokenizer):
    """A response ending in "\n\n" + eos: its empty last step is ignored and the step before it ends at
    the final token (no 0-scored step to take the min-form weight); a prose step first keeps the
    following correct steps at +1 (content, not position, decides)."""
    prompt = tokenizer("What is 12+7?", add_special_tokens=False)["input_ids"]
    text = "Let me add.\n\n" + SOLUTION + "\n\n"
    ends, got = score_response(RuleStepChecker(), tokenizer, prompt, _ids(tokenizer, text))
    # Character tokenizer: "Let me add.\n\n" (13) is tokens 0..12, "2+7+0=9, 9\n\n" (12) 13..24,
    # "1+0+0=1, 19\n\n" (13) 25..37, "\\boxed{19}\n\n" (12) 38..49, and the eos, 50, is an empty step:
    # ignored, so the boxed step ends at 50 instead of 49.
    n = len(text) + 1
    assert ends == [12, 24, 37, n - 1] and got == [0.0, 1.0, 1.0, 1.0]
    assert score_response(RuleStepChecker(), tokenizer, prompt, _ids(tokenizer, "\n\n")) == ([2], [0.0])


@pytest.fixture(scope="module")
def hf_prm_dir(tiny_dir, tokenizer, tmp_path_factory):
    cfg = LlamaConfig.from_pretrained(tiny_dir)
    cfg.num_labels = 2
    torch.manual_seed(3)
    model = LlamaForTokenClassification(cfg)
    out = tmp_path_factory.mktemp("prm") / "tiny_prm"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_hf_prm_reads_softmax_difference_at_step_tags(hf_prm_dir, tokenizer):
    prm = HFTokenClassificationPRM(hf_prm_dir)
    prompt, response = "ab", "x\n\nyz"
    ids, tags = prm.encode(prompt, response, [(0, 3), (3, 5)])
    nl = tokenizer.convert_tokens_to_ids("\n")
    # prompt "a" "b", step 1 "x" (its "\n\n" separator removed) + tag, step 2 "y" "z" + tag
    assert ids == tokenizer("abx", add_special_tokens=False)["input_ids"] + [nl] + \
        tokenizer("yz", add_special_tokens=False)["input_ids"] + [nl]
    assert tags == [3, 6]
    scores = prm.score_steps(prompt, response, [(0, 3), (3, 5)])
    with torch.no_grad():
        logits = prm.model(input_ids=torch.tensor([ids])).logits[0]
    p = torch.softmax(logits, -1)
    expected = (p[:, 1] - p[:, 0])[tags]
    np.testing.assert_allclose(scores, expected.numpy(), atol=1e-6)
    assert all(-1.0 <= s <= 1.0 for s in scores) and scores[0] != scores[1]
    assert prm.score_steps(prompt, response, []) == []


def test_rule_checker_needs_an_arithmetic_prompt():
    with pytest.raises(ValueError, match="What is"):
        RuleStepChecker().score_steps("Tell me a story", "once\n\n", [(0, 6)])


def test_pure_step_with_the_hf_prm(tiny_dir, tokenizer, hf_prm_dir):
    cfg = make_cfg("pure", pure={"prm": "hf", "prm_path": str(hf_prm_dir)})
    learner = Learner(cfg, 0, 1, tiny_dir)
    groups = make_groups(tokenizer, 2, 4)
    m = learner.step(groups, 0)
    prm = HFTokenClassificationPRM(hf_prm_dir)
    scores = [s for g in groups for smp in g.samples
              for s in score_response(prm, tokenizer, g.prompt_tokens, smp.tokens)[1]]
    assert m["pure/step_score_mean"] == pytest.approx(float(np.mean(scores)), abs=1e-6)
    assert m["pure/min_step_score"] < m["pure/step_score_mean"]


def test_hf_prm_scores_many_rows_per_forward(hf_prm_dir):
    """5 responses of different lengths (one without steps), 3 rows per forward: 2 forwards in all
    (ceil(4 scored rows / 3)); every row's scores equal its own single-row forward within 1e-5 (fp32;
    only the padded kernel shapes differ), so the length sort is undone and tags are read per row."""
    prm = HFTokenClassificationPRM(hf_prm_dir, batch_rows=3)
    items = [("What is 1+1?", "1+1=2\n\n\\boxed{2}", [(0, 7), (7, 16)]),
             ("ab", "x", [(0, 1)]),
             ("ab", "", []),
             ("What is 12+7?", SOLUTION, [(0, 12), (12, 25), (25, 35)]),
             ("q", "yz\n\nw", [(0, 4), (4, 5)])]
    calls = []
    forward = prm.model.forward
    prm.model.forward = lambda *a, **k: calls.append(k["input_ids"].shape) or forward(*a, **k)
    batched = prm.score_batch(items)
    assert len(calls) == 2 and calls[0][0] == 3 and calls[1][0] == 1
    del prm.model.forward
    assert batched[2] == [] and [len(b) for b in batched] == [2, 1, 0, 3, 2]
    for got, item in zip(batched, items):
        np.testing.assert_allclose(got, prm.score_batch([item])[0], atol=1e-5, rtol=0)


def test_token_batches_cap_rows_and_padded_tokens():
    # ascending lengths 10, 20, 30, 500, 600 under 4 rows and 1,000 tokens (rows × longest):
    # 10+20+30 → 3 × 30 = 90; 500 would make 4 × 500 = 2,000 > 1,000: a new batch; 600: 2 × 600 > 1,000
    assert token_batches([10, 20, 30, 500, 600], 4, 1000) == [[0, 1, 2], [3], [4]]
    assert token_batches([10, 20, 30, 500, 600], 4, None) == [[0, 1, 2, 3], [4]]  # the row cap only
    assert token_batches([2000], 4, 1000) == [[0]]  # a row over the budget goes alone


def test_the_hf_prm_batches_long_rows_by_tokens(hf_prm_dir):
    """N10: the PRM's forwards were cut by rows only (`learner.micro_batch_samples`, 32 in pure.yaml: 32
    rows of 4 k tokens hold ~15 GB of a 7B PRM's MLP transients). With the learner's token budget (here
    `learner.micro_batch_tokens=200`), 6 long rows of 80-90 tokens under a cap of 8 rows go 2 per forward
    (3 × 90 > 200), and the short ones still share one; the scores are those of one forward each."""
    cfg = make_cfg("pure", pure={"prm": "hf", "prm_path": str(hf_prm_dir)},
                   learner={"micro_batch_samples": 8, "micro_batch_tokens": 200})
    prm = make_prm(cfg, torch.device("cpu"))
    assert (prm.batch_rows, prm.batch_tokens) == (8, 200)
    long = [("ab", "x" * n + "\n\n", [(0, n + 2)]) for n in (80, 82, 84, 86, 88, 78)]  # 2 + n + 1 tokens
    short = [("ab", "xy", [(0, 2)]), ("ab", "z", [(0, 1)])]
    calls = []
    forward = prm.model.forward
    prm.model.forward = lambda *a, **k: calls.append(tuple(k["input_ids"].shape)) or forward(*a, **k)
    batched = prm.score_batch(long + short)
    del prm.model.forward
    # the character tokenizer: "ab" + n "x" + the tag = n + 3 tokens; sorted: 5, 4 | 81, 83 | 85, 87 | 89, 91
    assert calls == [(2, 5), (2, 83), (2, 87), (2, 91)]
    assert all(rows * width <= 200 for rows, width in calls[1:])
    for got, item in zip(batched, long + short):
        np.testing.assert_allclose(got, prm.score_batch([item])[0], atol=1e-5, rtol=0)


ITEMS = [("What is 1+1?", "1+1=2\n\n\\boxed{2}", [(0, 7), (7, 16)]),
         ("ab", "x", [(0, 1)]),
         ("What is 12+7?", SOLUTION, [(0, 12), (12, 25), (25, 35)]),
         ("q", "yz\n\nw", [(0, 4), (4, 5)])]


def _sharded_scores(rank: int, world: int, prm_dir: str) -> dict:
    """One rank of a PRM sharded over `world` ranks; rank 0 scores 3 items (2 forwards of 2 rows at most),
    rank 1 one (1 forward): rank 1 must join rank 0's second forward."""
    from torch.distributed.tensor import DTensor

    from learner.distributed import init_distributed
    from learner.fsdp import make_mesh

    init_distributed(rank, world, torch.device("cpu"), timeout_s=120)
    prm = HFTokenClassificationPRM(prm_dir, batch_rows=2, mesh=make_mesh(torch.device("cpu"), world))
    params = list(prm.model.parameters())
    scores = prm.score_batch(ITEMS[:3] if rank == 0 else ITEMS[3:])
    return {"scores": scores, "all_sharded": all(isinstance(p, DTensor) for p in prm.model.parameters()),
            "local": sum(p.to_local().numel() for p in params), "total": sum(p.numel() for p in params),
            "grad": any(p.requires_grad for p in params)}


@pytest.mark.slow
def test_the_hf_prm_shards_over_the_learner_ranks_like_the_reference(hf_prm_dir):
    """C8: every rank held a whole PRM (15.2 GB for a 7B on each GPU). Sharded with FSDP2 over 2 gloo ranks,
    each rank holds about half of it, the ranks run equal numbers of forwards (rank 1, with fewer rows,
    joins rank 0's second one), the root unit is resharded afterwards, and the scores equal the whole
    PRM's (fp32, within the padded kernels' rounding)."""
    ranks = spawn_ranks(_sharded_scores, 2, str(hf_prm_dir), timeout_s=300)
    whole = HFTokenClassificationPRM(hf_prm_dir, batch_rows=2).score_batch(ITEMS)
    for got, want in zip(ranks[0]["scores"] + ranks[1]["scores"], whole):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    for r in ranks:
        assert r["all_sharded"] and not r["grad"]
        assert r["local"] <= r["total"] // 2 + 64  # its half of every tensor (the odd row to rank 0)


def _prm_is_sharded(learner) -> bool:
    from torch.distributed.tensor import DTensor

    return all(isinstance(p, DTensor) for p in learner.providers["process_rewards"].prm.model.parameters())


@pytest.mark.slow
def test_a_pure_step_on_two_ranks_scores_as_one_rank_with_the_prm_sharded(tiny_dir, tokenizer, hf_prm_dir):
    """The learner shards the PRM when it shards the policy (2 ranks) and the step's PRM scores equal a
    single rank's, whose PRM stays whole."""
    cfg = make_cfg("pure", pure={"prm": "hf", "prm_path": str(hf_prm_dir)})
    groups = make_groups(tokenizer, 2, 4)
    with LearnerGroup(cfg, 2, str(tiny_dir), timeout_s=300) as group:
        two = group.step(groups, 0)
        assert group.call(_prm_is_sharded) == [True, True]
    one_learner = Learner(cfg, 0, 1, tiny_dir)
    assert not _prm_is_sharded(one_learner)
    one = one_learner.step(groups, 0)
    for k in ("pure/step_score_mean", "pure/min_step_score"):
        assert two[k] == pytest.approx(one[k], abs=1e-5), k


def test_pure_prm_runs_in_the_compute_dtype(hf_prm_dir):
    """make_prm loads the HF PRM in the dtype it is given (the learner passes model.dtype resolved:
    bfloat16 on a GPU); bf16 scores stay within bf16 rounding (2e-2) of the fp32 ones."""
    cfg = make_cfg("pure", pure={"prm": "hf", "prm_path": str(hf_prm_dir)})
    prm16 = make_prm(cfg, torch.device("cpu"), torch.bfloat16)
    assert prm16.model.dtype == torch.bfloat16 and prm16.batch_rows == cfg.learner.micro_batch_samples
    assert prm16.batch_tokens is None  # micro_batch_tokens auto on a CPU learner: the row cap only
    item = ("What is 12+7?", SOLUTION, [(0, 12), (12, 25), (25, 35)])
    np.testing.assert_allclose(prm16.score_steps(*item), make_prm(cfg, torch.device("cpu")).score_steps(*item),
                               atol=2e-2, rtol=0)


def test_a_step_scorer_function_is_a_prm(tmp_path):
    """pure.prm=path/to/file.py:function: called with (prompt, response, step spans), one score per step."""
    plugin = tmp_path / "steps.py"
    plugin.write_text("def score(prompt, response, spans):\n"
                      "    return [None if response[a:b].strip() == 'skip' else len(prompt) + a for a, b in spans]\n"
                      "def three(prompt, response, spans):\n    return [1.0, 1.0, 1.0]\n")
    prm = make_prm(make_cfg("pure", pure={"prm": f"{plugin}:score"}), torch.device("cpu"))
    # prompt "ab" (2 chars); steps "x" at 0, "skip" at 2, "yz" at 7 -> 2 + 0, None, 2 + 7
    assert prm.score_steps("ab", "x\nskip\nyz", [(0, 1), (2, 6), (7, 9)]) == [2.0, None, 9.0]
    bad = make_prm(make_cfg("pure", pure={"prm": f"{plugin}:three"}), torch.device("cpu"))
    with pytest.raises(ValueError, match="returned 3 scores for 2 steps"):
        bad.score_steps("ab", "x\nskip\nyz", [(0, 1), (2, 6)])


def _byte_level_tokenizer():
    """A byte-level BPE tokenizer (GPT-2/Qwen style) trained on ASCII only: every non-ASCII character is
    split into its UTF-8 bytes, one token each, so "∑" is three tokens that decode alone to "\\ufffd"."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["step one: 2 + 2 = 4\n\nstep two: done"] * 10, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


class _CountingTokenizer:
    """Counts the tokens every decode call is given (the work of `token_texts`)."""

    def __init__(self, inner):
        self.inner, self.decoded = inner, 0

    def batch_decode(self, seqs, **kw):
        self.decoded += sum(len(s) for s in seqs)
        return self.inner.batch_decode(seqs, **kw)

    def decode(self, ids, **kw):
        self.decoded += len(ids)
        return self.inner.decode(ids, **kw)


def test_token_texts_with_split_multibyte_characters_join_and_stay_linear():
    """C9: a character split over byte-level tokens goes to the token that completes it (the tokens
    before it get ""), the texts join to the decoded response, and decoding stays O(n): the old
    prefix-by-prefix fallback decoded n²/2 tokens for such a row (and repeated the whole prefix in its
    output after each split character)."""
    tok = _byte_level_tokenizer()
    text = "so ∑ x ≤ 4 → done\n\nok é"
    ids = _ids(tok, text)
    texts = token_texts(tok, ids)
    assert "".join(texts) == tok.decode(ids, skip_special_tokens=True) == text
    assert texts[:7] == ["s", "o", " ", "", "", "∑", " "] and texts[-1] == ""  # eos decodes to ""
    assert texts == token_texts(tok, ids[:-1]) + [""]
    ascii_ids = _ids(tok, "step one: 2 + 2 = 4")
    assert token_texts(tok, ascii_ids) == tok.batch_decode([[i] for i in ascii_ids], skip_special_tokens=True)
    cut = _ids(tok, "a ≤", eos=False)[:-1]  # cut inside "≤": the partial character ends the last token
    assert "".join(token_texts(tok, cut)) == tok.decode(cut) == "a \ufffd"
    long_ids = _ids(tok, "x ∑ " * 150)  # 901 tokens
    counting = _CountingTokenizer(tok)
    assert "".join(token_texts(counting, long_ids)) == "x ∑ " * 150
    assert counting.decoded < 20 * len(long_ids)  # the old fallback: ~n²/2 = 406k tokens decoded


def test_hf_prm_loads_tensor_by_tensor_onto_its_device_not_whole_through_host_ram(hf_prm_dir, monkeypatch):
    """C8: the PRM is built on the meta device and filled from the safetensors files one tensor at a
    time on its device; `from_pretrained` (a whole copy in host RAM per rank, then moved) is not used."""
    from transformers import AutoModelForTokenClassification

    reference = AutoModelForTokenClassification.from_pretrained(hf_prm_dir, dtype=torch.float32)
    monkeypatch.setattr(AutoModelForTokenClassification, "from_pretrained",
                        classmethod(lambda *a, **k: pytest.fail("loaded whole through host RAM")))
    prm = HFTokenClassificationPRM(hf_prm_dir, device="cpu", dtype=torch.bfloat16)
    got = prm.model.state_dict()
    assert prm.model.dtype == torch.bfloat16 and not prm.model.training
    for name, t in reference.state_dict().items():
        assert torch.equal(got[name], t.to(torch.bfloat16)), name
    assert all(p.device.type == "cpu" and not p.is_meta for p in prm.model.parameters())
