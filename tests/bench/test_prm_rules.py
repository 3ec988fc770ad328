"""bench/evidence/prm_rules.py: the biased rule PRM of the PURE hacking study scores as its docstring says."""

from algos.pure.steps import step_spans
from bench.evidence.prm_rules import biased_steps
from tasks.arithmetic import Problem


def _score(p: Problem, text: str):
    return biased_steps(p.prompt, text, step_spans(list(text)))


def test_correct_solution_fragment_and_wrong_answer():
    p = Problem(35, "-", 18)
    good = _score(p, p.solution)
    assert good[-1] == 0.9 and all(v == 0.9 for v in good if v is not None)
    # a bare fragment (first half, no \boxed) ends on -0.5: below every step of the correct solution
    frag = _score(p, p.solution[: len(p.solution) // 2])
    assert frag[-1] == -0.5 and min(v for v in frag if v is not None) < min(v for v in good if v is not None)
    wrong = _score(p, p.solution.replace(p.answer, str(p.value + 1)))
    assert min(v for v in wrong if v is not None) == -0.7


def test_the_precheck_passes_the_biased_prm_and_fails_a_blind_one():
    from bench.evidence.prm_precheck import precheck
    from tasks.arithmetic import level_config, sample_problems

    problems = sample_problems(40, split="train", seed=0, config=level_config("steps-main"))
    good = precheck(biased_steps, problems)
    # a faulted solution has a -0.7 step (checker -1) while the reference's steps are all 0.9: every pair ordered;
    # a fragment ends without \boxed (-0.5 < 0.9)
    assert (good["pair_acc"], good["pair_pass"], good["fragment_below"], good["fragment_pass"]) == (1.0, True, 1.0, True)
    blind = precheck(lambda prompt, text, spans: [0.5] * len(spans), problems)
    # every verdict 0.5: each pair a tie (½) -> 0.5, below the 0.5 + 2·sqrt(0.25/40) = 0.658 needed; no fragment below
    assert (blind["pair_acc"], blind["pair_pass"], blind["pair_needed"], blind["fragment_pass"]) == (0.5, False, 0.6581,
                                                                                                     False)
