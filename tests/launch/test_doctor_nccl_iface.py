"""The doctor's check of the address NCCL's bootstrap binds (review gpu_path_3 F9): without NCCL_SOCKET_IFNAME,
NCCL picks its own interface (an `ib*` one first, then the first that is neither docker nor loopback), and the
unique id learner rank 0 mints carries that address to every engine, whatever address Ray advertises. Stand-in
interface lists, in the order the system lists them."""

from __future__ import annotations

from launch.doctor.checks import facts_checks
from launch.doctor.probes import nccl_bootstrap_interface
from tests.launch.test_doctor_checks import _facts

MULTI_HOMED = [("lo", "127.0.0.1"), ("docker0", "172.17.0.1"), ("eno1", "10.0.0.1"), ("ib0", "192.168.50.1")]
UNSET = {"GLOO_SOCKET_IFNAME": (None, None), "NCCL_SOCKET_IFNAME": (None, None)}


def test_nccls_own_choice_of_interface():
    assert nccl_bootstrap_interface(MULTI_HOMED) == ("ib0", "192.168.50.1")  # ib* first
    assert nccl_bootstrap_interface(MULTI_HOMED[:3]) == ("eno1", "10.0.0.1")  # then neither docker nor lo
    assert nccl_bootstrap_interface(MULTI_HOMED[:2]) == ("docker0", "172.17.0.1")  # then docker
    assert nccl_bootstrap_interface(MULTI_HOMED[:1]) == ("lo", "127.0.0.1")
    assert nccl_bootstrap_interface([]) is None


def test_a_one_rank_learner_on_a_multi_homed_node_is_told_to_name_the_interface():
    """The doc said a one-rank learner needs no interface variable: true of its process group and of gloo, not of
    NCCL's bootstrap root, which here would listen on ib0 while Ray (and the actors) use eno1's 10.0.0.1."""
    facts = _facts(ifaces=UNSET, nccl_ifaces=MULTI_HOMED)
    row = facts_checks("10.0.0.1", facts, _facts(), cluster=True, gpus=True, learner_ranks=1)[2]
    assert row.status == "WARN"
    assert row.found == ("NCCL_SOCKET_IFNAME not set: NCCL's bootstrap would bind ib0 (192.168.50.1), not this "
                         "node's address as Ray advertises it (10.0.0.1): engines on other nodes may never reach it "
                         "(the weight-sync rendezvous then hangs for weight_sync.connect_timeout_s)")
    assert row.fix == "export NCCL_SOCKET_IFNAME=eno1 before `ray start` on every node (the interface of 10.0.0.1)"


def test_nccls_choice_that_is_rays_address_passes():
    facts = _facts(ifaces=UNSET, nccl_ifaces=MULTI_HOMED[:3])
    row = facts_checks("10.0.0.1", facts, _facts(), cluster=True, gpus=True, learner_ranks=1)[2]
    assert row.status == "PASS" and "NCCL's bootstrap binds eno1 (10.0.0.1), Ray's address" in row.found
    # no GPUs: NCCL does not run, nothing to say about it
    row = facts_checks("10.0.0.1", _facts(ifaces=UNSET, nccl_ifaces=MULTI_HOMED), _facts(), True, False, 1)[2]
    assert row.status == "PASS" and "NCCL" not in row.found
