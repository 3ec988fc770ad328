"""bench/common/cpu_roles.py: processes sorted into roles, CPU per step between two readings, and the window
that takes the readings when a run's metrics reach two steps."""

import os
import time

from bench.common.cpu_roles import CpuWindow, cpu_by_pid, per_step, role_of


def test_roles_from_titles_and_command_lines():
    assert role_of("VLLM::EngineCore") == "engine"
    assert role_of("ray::LearnerRank.step") == role_of("ray::LearnerRank") == "learner"
    assert role_of("ray::ActorRole") == "actor"
    assert role_of("/venv/bin/python -B -c from multiprocessing.spawn import spawn_main; spawn_main(fd=9)") == "buffer"
    assert role_of("/venv/bin/python -m launch.commands.supervisor /r/.run_config.json /r") == "driver"
    assert role_of("/venv/lib/ray/core/src/ray/raylet/raylet --x") == "other"


def test_cpu_per_step_counts_new_processes_from_zero_and_ended_ones_not_at_all():
    before = {1: ("engine", 10.0), 2: ("learner", 4.0), 3: ("actor", 1.0)}
    # 70 steps later: the engine used 35 s (0.5 a step), the learner 21 s (0.3), actor 3 ended, a new engine 7 s (0.1)
    after = {1: ("engine", 45.0), 2: ("learner", 25.0), 4: ("engine", 7.0)}
    assert per_step(before, after, 70) == {"engine": 0.6, "learner": 0.3}


def test_the_window_reads_between_the_two_steps(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    w = CpuWindow(tmp_path, first=2, last=4, poll_s=0.02)
    w.start()
    with open(metrics, "a") as f:
        for step in range(1, 6):
            f.write(f'{{"step": {step}, "time/train_s": 0.1}}\n')
            f.flush()
            end = time.process_time() + 0.1
            while time.process_time() < end:  # this process burns ~0.1 CPU-s a step
                pass
            time.sleep(0.1)
    w.join(timeout=10)
    assert w.result["steps"] == 2 and set(w.result) == {"steps", "wall_s", "cores_busy", "cpu_s_per_step"}
    assert w.result["cpu_s_per_step"]["other"] >= 0.05  # this test's process is "other"
    assert os.getpid() in cpu_by_pid()


def test_a_window_stopped_before_its_steps_has_no_result(tmp_path):
    w = CpuWindow(tmp_path, first=1, last=2, poll_s=0.02)
    w.start()
    w.stop()
    w.join(timeout=5)
    assert not w.is_alive() and w.result == {}
