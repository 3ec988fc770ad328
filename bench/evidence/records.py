"""Keep a study's finished runs in the repository, so its verdict can be re-derived (and the study continued) on
any machine.

A study's runs live in an --out-dir outside the repository, with their checkpoints, models and logs (16 MB a
run on the step-by-step testbed). A fresh machine starts without them: the runs behind a verdict, or half a
study's runs, are lost with it. This copies from each finished run the three files every analysis reads
(summary.json, metrics.jsonl, eval_prompts.jsonl; about 0.5 MB, 0.1 MB once git compresses them) and the run's
resolved config.yaml (its exact settings) into bench/evidence/records/<study>/<arm>-s<seed>/. That folder is an
--out-dir like any other:

  .venv/bin/python bench/evidence/records.py --study steps-credit --from /work/studies_out     # keep the runs
  .venv/bin/python bench/evidence/evidence.py --study steps-credit --reuse --out-dir bench/evidence/records
  .venv/bin/python bench/evidence/study_tests.py --study steps-credit --out-dir bench/evidence/records
  cp -r bench/evidence/records/steps-credit OUT/    # continue the study into OUT: evidence.py skips these runs

What a record lacks: the final model (hf/step_N), so `study_tests.py --sample` needs the run itself, and the
run's log (the machine's load while it ran is in the study's own log).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common.runs import ROOT, log  # noqa: E402
from bench.evidence.evidence_studies import STUDIES  # noqa: E402
from bench.evidence.study_tests import runs as finished_runs  # noqa: E402

RECORDS = ROOT / "bench" / "evidence" / "records"
KEPT = ("summary.json", "metrics.jsonl", "eval_prompts.jsonl", "config.yaml")


def keep(src: Path, study: str, dest: Path = RECORDS) -> list[str]:
    """Copy the kept files of every finished run of `study`'s arms in `src` (an --out-dir; `study_tests.runs`
    finds them, as every test does) to `dest/<study>/`; the names of the runs copied. A run not finished (stopped
    early, still running) is skipped; one lacking a kept file is refused before anything is copied."""
    runs = sorted((d for arm in STUDIES[study].arms for d in finished_runs(src, study, arm.name).values()),
                  key=lambda d: d.name)
    for run in runs:
        missing = [f for f in KEPT if not (run / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{run}: finished but lacks {', '.join(missing)} (a run from before these files "
                                    "were written cannot be kept whole)")
    for run in runs:
        out = dest / study / run.name
        out.mkdir(parents=True, exist_ok=True)
        for f in KEPT:
            shutil.copyfile(run / f, out / f)
    return [r.name for r in runs]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", required=True, choices=sorted(STUDIES))
    p.add_argument("--from", dest="src", type=Path, required=True, metavar="OUT_DIR",
                   help="the --out-dir the study's runs were made into")
    args = p.parse_args(argv)
    try:
        kept = keep(args.src, args.study)
    except FileNotFoundError as e:
        log(f"records: {e}")
        return 2
    log(f"records: kept {len(kept)} finished run(s) of {args.study} in {RECORDS / args.study}: {' '.join(kept)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
