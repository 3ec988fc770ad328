"""Every algorithm's resolved config crosses a process boundary: Ray pickles it to each learner rank and
actor, so a config that only this process can unpickle (a section class built on the fly and published
nowhere) stops a Ray run at start while `--serial` runs pass. The end-to-end runs cover some algorithms
through Ray, not all (PACS runs `--serial`): this covers each, in a fresh interpreter."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import algos
from configs.loading import resolve

ROOT = Path(__file__).resolve().parents[2]


def test_every_algorithms_config_unpickles_in_a_fresh_process():
    blobs = {algo: pickle.dumps(resolve(algo)) for algo in algos.names()}
    code = ("import pickle, sys\n"
            "for line in sys.stdin.read().split():\n"
            "    cfg = pickle.loads(bytes.fromhex(line))\n"
            "    print(cfg.algo, type(getattr(cfg, cfg.algo, None)).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, input="\n".join(b.hex() for b in blobs.values()),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = dict(line.split() for line in out.stdout.splitlines())
    assert sorted(got) == sorted(blobs)
    for algo, section in got.items():  # an algorithm with options gets its own section class back
        options = algos.get(algo).options
        assert section == (options.__name__ if options is not None else "NoneType"), (algo, section)
