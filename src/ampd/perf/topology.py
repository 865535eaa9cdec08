"""Where KV cache travels: NVLink inside a server, the network between servers
(AMPD.md section 2, ``T_kv``; section 4 for the paper's H20 cluster)."""

from __future__ import annotations

from dataclasses import dataclass

from ampd.core.deployment import WorkerSpec
from ampd.core.errors import InputError
from ampd.perf.catalog import GpuSpec

_GB = 1e9


@dataclass(frozen=True, slots=True)
class Topology:
    """Servers of ``gpus_per_server`` GPUs joined by a network.

    Attributes:
        gpus_per_server: GPUs per server (8 in the paper's H20 servers).
        nvlink_gb_per_s: NVLink bandwidth of one GPU as datasheets state it, both
            directions together (H20: 900 GB/s, AMPD.md section 4). A copy is one-way,
            so one GPU pair moves data at half of it.
        network_gb_per_s: one server's network bandwidth, all its NICs together, one way
            (InfiniBand 200 GB/s between servers, AMPD.md section 4).
        transfer_latency_s: fixed cost of one KV transfer (set-up, completion notice).
            [our choice] 50 us: the order of an RDMA write's set-up plus its completion
            notification; not measured.

    KV shards and TP: a worker of TP n holds 1/n of every token's KV on each GPU (KV
    heads are split). Inside a server the shards move in parallel over
    ``min(tp_src, tp_dst)`` GPU pairs: the side with fewer GPUs bounds the links in use.
    Between servers all shards share the source server's NICs, so the bandwidth is
    ``network_gb_per_s`` whatever the TP (optimistic when several transfers leave one
    server at once; contention between transfers is the simulator's concern).
    """

    gpus_per_server: int = 8
    nvlink_gb_per_s: float = 900.0
    network_gb_per_s: float = 200.0
    transfer_latency_s: float = 50e-6

    def __post_init__(self) -> None:
        if self.gpus_per_server < 1 or self.nvlink_gb_per_s <= 0 or self.network_gb_per_s <= 0:
            raise InputError(f"topology {self}: GPUs per server and bandwidths must be positive")
        if self.transfer_latency_s < 0:
            raise InputError(f"topology {self}: transfer latency must be >= 0")

    def bandwidth_bytes_per_s(self, src: WorkerSpec, dst: WorkerSpec) -> float:
        """Bytes/s a transfer from ``src`` to ``dst`` gets (see the class docstring)."""
        if src.server == dst.server:
            return min(src.tp, dst.tp) * self.nvlink_gb_per_s / 2 * _GB
        return self.network_gb_per_s * _GB

    def transfer_s(self, num_bytes: float, src: WorkerSpec, dst: WorkerSpec) -> float:
        """Seconds to move ``num_bytes`` from ``src`` to ``dst``: 0 when they are the same
        worker, else ``transfer_latency_s + num_bytes / bandwidth``."""
        if src.worker_id == dst.worker_id:
            return 0.0
        return self.transfer_latency_s + num_bytes / self.bandwidth_bytes_per_s(src, dst)


def default_topology(gpu: GpuSpec) -> Topology:
    """The paper's topology (AMPD.md section 4) with ``gpu``'s datasheet NVLink bandwidth."""
    return Topology(nvlink_gb_per_s=gpu.nvlink_gb_per_s)
