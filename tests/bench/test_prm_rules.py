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
