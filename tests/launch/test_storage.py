"""Shared storage: path keys made absolute, and the start-up check that every node sees the run folder
(a real one-node Ray cluster; the two-node failure on a real second node is in tests/cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from configs.loading import ConfigError, resolve
from launch.state.storage import (
    CHECK_DIR,
    WHAT_MUST_BE_SHARED,
    Node,
    StorageError,
    absolutize,
    check_shared_storage,
    other_nodes,
    probe_storage,
    shared_paths,
)


def test_absolutize_makes_every_set_path_absolute_and_leaves_unset_ones(monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    # ("./models/qwen": a bare org/name that is no path here is a Hub id, `launch.prep.hub`)
    cfg = resolve("luffy", flags={"model.path": "./models/qwen", "data.path": "~/d/train.parquet",
                                  "data.demos": "/shared/teacher.jsonl", "logging.output_dir": "runs/a/../b",
                                  "resume": "runs/old"})
    out = absolutize(cfg, "/work/here")
    assert out.model.path == "/work/here/models/qwen"
    assert out.model.cache_dir == "/work/here/.cache/models"  # the default is relative too
    assert out.data.path == "/home/u/d/train.parquet"  # ~ expanded, cwd not prefixed
    assert out.data.demos == "/shared/teacher.jsonl"  # already absolute: unchanged
    assert out.logging.output_dir == "/work/here/runs/a/../b"  # lexical: `..` kept, symlinks not resolved
    assert out.resume == "/work/here/runs/old"
    assert out.data.eval_path is None and out.pure.prm_path is None  # unset stays unset
    assert cfg.model.path == "./models/qwen"  # the input is not modified


def test_shared_paths_name_the_keys_the_user_set():
    built_in = resolve("grpo")
    assert shared_paths(built_in, "/c/tiny-sft-1") == {"model.cache_dir": "/c/tiny-sft-1"}
    own = resolve("grpo", flags={"model.path": "/m", "data.path": "/d.parquet", "data.task": "file"})
    assert shared_paths(own, "/m") == {"model.path": "/m", "data.path": "/d.parquet"}


def test_the_teacher_path_is_made_absolute_and_shared():
    cfg = resolve("opd", flags={"teacher.path": "./models/teacher"})
    out = absolutize(cfg, "/work/here")
    assert out.teacher.path == "/work/here/models/teacher"
    assert shared_paths(out, "/c/tiny")["teacher.path"] == "/work/here/models/teacher"
    with pytest.raises(ConfigError, match="teacher.path: org/no-such-teacher is not a local directory"):
        absolutize(resolve("opd", flags={"teacher.path": "org/no-such-teacher"}), "/work/here")


def test_probe_reports_a_missing_marker_another_folder_and_a_missing_input(tmp_path):
    check = tmp_path / "check"
    check.mkdir()
    # no driver marker at all: the run folder is not shared
    (missing,) = probe_storage(str(check), "n1", "abc", {})
    assert "cannot read the driver's marker" in missing and str(check / "driver") in missing
    assert (check / "node-abc").read_text() == "n1"  # the node still leaves its own marker
    (check / "driver").write_text("someone-else")
    (other,) = probe_storage(str(check), "n1", "abc", {"model.path": str(tmp_path / "nope")})[:1]
    assert "a different folder under the same path" in other
    (check / "driver").write_text("n1")
    assert probe_storage(str(check), "n1", "abc", {"model.path": str(tmp_path / "nope")}) == [
        f"cannot see model.path = {tmp_path / 'nope'}"]
    assert probe_storage(str(check), "n1", "abc", {"model.path": str(tmp_path)}) == []


@pytest.fixture(scope="module")
def ray_one_node(tmp_path_factory):
    """A local one-node Ray whose workers run in a directory of their own (the job's `working_dir`), as
    they would on another node: a relative path then points elsewhere for them than for the driver."""
    import ray

    empty = tmp_path_factory.mktemp("worker-cwd")
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR",
             runtime_env={"working_dir": str(empty)})
    yield ray
    ray.shutdown()


def test_every_node_reads_and_writes_the_marker(ray_one_node, tmp_path):
    nodes = other_nodes(include_driver_node=True)
    assert len(nodes) == 1 and other_nodes() == []  # the driver's own node is left out by default
    run = tmp_path / "run"
    run.mkdir()
    check_shared_storage(run, nodes, {"model.cache_dir": str(tmp_path)})
    assert not (run / CHECK_DIR).exists()  # cleaned up


def test_a_node_that_cannot_see_the_run_folder_stops_the_run(ray_one_node, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("run").mkdir()
    (node,) = other_nodes(include_driver_node=True)
    with pytest.raises(StorageError) as err:  # "run" is relative: the worker's cwd has no such folder
        check_shared_storage("run", [node], {"data.path": "train.parquet"})
    msg = str(err.value)
    assert f"node {node}: cannot read the driver's marker run/{CHECK_DIR}/" in msg
    assert "the run folder is not shared with this node" in msg
    assert f"node {node}: cannot write run/{CHECK_DIR}/" in msg
    assert f"node {node}: cannot see data.path = train.parquet" in msg
    assert msg.endswith(WHAT_MUST_BE_SHARED)
    assert not (tmp_path / "run" / CHECK_DIR).exists()


def test_a_node_the_probe_cannot_reach_is_an_error_not_a_hang(ray_one_node, tmp_path):
    gone = Node("ab" * 28, "198.18.0.99")  # no such node in the cluster
    with pytest.raises(StorageError, match=r"node 198\.18\.0\.99 \(Ray node abababababab\): could not run "
                                           r"the storage probe there"):
        check_shared_storage(tmp_path, [gone], timeout_s=60)
