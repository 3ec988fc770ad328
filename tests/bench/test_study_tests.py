"""steps-opd's registered verdict rule (bench/evidence/evidence_studies.py, STEPS_OPD.registered) on S, the samples
OPD needed per seed to reach that seed's GRPO end, against GRPO's 80 × 64 = 5,120."""

from bench.evidence.study_tests import opd_word


def test_the_opd_rule_uses_the_four_words_as_registered():
    assert opd_word([1280, 2560, 640], 5120) == "reproduced"  # every seed within half (2,560 is half: still in)
    assert opd_word([1280, 2624, 640], 5120) == "direction only"  # one seed past half, all before the end
    assert opd_word([1280, 5120, 640], 5120) == "inconclusive"  # reached only at GRPO's own end on one seed
    assert opd_word([None, None, None], 5120) == "not reproduced"  # never reached on any seed
    assert opd_word([1280, None, 640], 5120) == "inconclusive"
