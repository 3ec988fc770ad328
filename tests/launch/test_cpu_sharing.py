"""One CPU machine: learner ranks on cores of their own (`plan_rank_cores`), actors on every core at a lower
priority (`lower_priority`), so a core the learner leaves idle generates and the learner preempts the
actors when it computes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from launch.placement import plan_rank_cores


def test_ranks_take_whole_cores_from_the_top_and_share_the_last_one_when_they_run_out():
    assert plan_rank_cores(1, 1.0, cores=[0, 1]) == [[1]]  # the quick-start: the learner on core 1
    assert plan_rank_cores(2, 0.5, cores=[0, 1]) == [[1], [0]]  # a half-core rank still gets a whole core
    assert plan_rank_cores(2, 2.0, cores=list(range(8))) == [[6, 7], [4, 5]]
    assert plan_rank_cores(3, 1.0, cores=[0, 1]) == [[1], [0], [0]]  # more ranks than cores: the last core shared


def test_lower_priority_renices_every_thread_and_the_threads_started_later_inherit_it():
    # a fresh process: nice is per thread, so one thread started before the call and one after
    code = textwrap.dedent("""
        import os, threading
        from launch.roles import lower_priority
        seen, go = {}, threading.Event()
        def early():
            go.wait()
            seen["early"] = os.getpriority(os.PRIO_PROCESS, 0)
        t = threading.Thread(target=early); t.start()
        base = os.getpriority(os.PRIO_PROCESS, 0)
        lower_priority(7)
        go.set(); t.join()
        late = threading.Thread(target=lambda: seen.__setitem__("late", os.getpriority(os.PRIO_PROCESS, 0)))
        late.start(); late.join()
        print(base, os.getpriority(os.PRIO_PROCESS, 0), seen["early"], seen["late"])
        lower_priority(30)  # never past 19
        print(os.getpriority(os.PRIO_PROCESS, 0))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__)))).stdout.split("\n")
    base, main, early, late = map(int, out[0].split())
    assert (main, early, late) == (min(19, base + 7),) * 3
    assert int(out[1]) == 19
