"""KV transfer times over NVLink and the network, worked out by hand."""

import pytest

from ampd.core.deployment import Role, WorkerSpec
from ampd.core.errors import InputError
from ampd.perf.catalog import gpu
from ampd.perf.topology import Topology, default_topology

GIB = 2**30


def _worker(worker_id, tp, server):
    return WorkerSpec(worker_id, Role.DECODE, tp, server)


def test_same_worker_costs_nothing():
    w = _worker(3, 4, 0)
    assert Topology().transfer_s(GIB, w, w) == 0.0


def test_one_gib_over_the_network():
    # 200 GB/s one way between servers, whatever the TP; 50 us latency.
    t = Topology().transfer_s(GIB, _worker(0, 2, 0), _worker(1, 4, 1))
    assert t == pytest.approx(50e-6 + 1_073_741_824 / 200e9, rel=1e-12)


def test_nvlink_uses_the_smaller_tp_pairs_at_half_the_bidirectional_figure():
    # TP2 -> TP4 on one server: 2 GPU pairs x 450 GB/s one way = 900 GB/s.
    t = Topology(nvlink_gb_per_s=900).transfer_s(GIB, _worker(0, 2, 0), _worker(1, 4, 0))
    assert t == pytest.approx(50e-6 + 1_073_741_824 / 900e9, rel=1e-12)


def test_default_topology_takes_the_gpu_nvlink():
    topo = default_topology(gpu("A100-80GB"))
    assert (topo.nvlink_gb_per_s, topo.network_gb_per_s, topo.gpus_per_server) == (600, 200, 8)


def test_bad_topology_is_refused():
    with pytest.raises(InputError):
        Topology(network_gb_per_s=0)
