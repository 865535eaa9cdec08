"""The serving commands as a user runs them: `ampd serve` refusing an unreachable
Redis at start, and `ampd up` starting a cluster and stopping every part of it."""

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from ampd.cli.main import main
from ampd.config import load_config, override
from ampd.core.errors import InputError
from ampd.cluster.up import LocalCluster, free_port_block

CONFIG = """
system = "pd-disagg"
[cluster]
model = "Llama-3.1-8B"
gpu = "H100-SXM"
num_gpus = 2
deployment = "P:<TP=1,DP=1> D:<TP=1,DP=1>"
[workload]
name = "toolbench"
num_sessions = 5
[serve]
port = {port}
base_port = {base_port}
{extra}
"""


def write_config(tmp_path, extra: str = "") -> tuple:
    port = free_port_block(10)
    path = tmp_path / "serve.toml"
    path.write_text(CONFIG.format(port=port, base_port=port + 2, extra=extra))
    return path, port


def test_serve_with_unreachable_redis_fails_at_once_naming_it(tmp_path, capsys):
    path, port = write_config(tmp_path, '[[serve.workers]]\nurl = "http://127.0.0.1:9"\nrole = "prefill"\n'
                                        '[[serve.workers]]\nurl = "http://127.0.0.1:9"\nrole = "decode"\n')
    redis_url = f"redis://127.0.0.1:{port + 9}/0"
    assert main(["serve", "--config", str(path), "--redis-url", redis_url]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the shared store" in err and redis_url in err


def test_up_starts_a_cluster_that_serves_and_stops_everything_on_interrupt(tmp_path):
    path, port = write_config(tmp_path)
    up = subprocess.Popen([sys.executable, "-m", "ampd.cli.main", "up", "--config", str(path), "--log-dir",
                           str(tmp_path / "logs")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = up.stdout.readline()  # printed once every part answers
        assert line.startswith("cluster up"), line + up.stdout.read()
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", headers={"X-Session-Id": "s"}, timeout=30,
                           json={"prompt": list(range(1, 50)), "max_tokens": 3})
        assert reply.status_code == 200 and len(reply.json()["choices"][0]["token_ids"]) == 3
        assert reply.headers["x-ampd-local"] == "false"  # pd-disagg: prefilled on the prefill engine
        pids = _children(up.pid)
        assert len(pids) >= 3  # two engines and the coordinator
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=30) == 0
    assert "cluster stopped" in up.stdout.read()
    time.sleep(0.5)
    assert [p for p in pids if _alive(p)] == []


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is not running
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_up_refuses_clashing_or_busy_ports_before_starting_anything(tmp_path):
    path, port = write_config(tmp_path)
    config, _ = load_config(path)
    with pytest.raises(InputError, match="ports clash: coordinator 0 .* and engine 0"):
        LocalCluster(override(config, serve={"base_port": port}), tmp_path).start()
    with socket.socket() as held:
        held.bind(("127.0.0.1", port + 3))  # engine 1's port
        with pytest.raises(InputError, match=rf"already in use: {port + 3} \(engine 1"):
            LocalCluster(config, tmp_path).start()


def _time_wait_ports() -> set[int]:
    """Local ports of this machine's TCP connections in TIME-WAIT (state 06 of /proc/net/tcp*)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "06":
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_up_starts_again_at_once_on_the_same_ports_after_a_clean_stop(tmp_path):
    """The client's keep-alive connection is closed by the stopping coordinator,
    which leaves it in TIME-WAIT on the coordinator's port (checked: the case
    the port check must not mistake for a server); ``ampd up`` on the same
    configuration starts at once all the same."""
    path, port = write_config(tmp_path)

    def up() -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-m", "ampd.cli.main", "up", "--config", str(path), "--log-dir",
                                    str(tmp_path / "logs")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)
        line = process.stdout.readline()
        assert line.startswith("cluster up"), line + process.stdout.read()
        return process

    first = up()
    with httpx.Client(timeout=30) as client:  # kept open: the server side closes it
        reply = client.post(f"http://127.0.0.1:{port}/v1/completions", headers={"X-Session-Id": "s"},
                            json={"prompt": list(range(1, 20)), "max_tokens": 2})
        assert reply.status_code == 200
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=30) == 0
    assert port in _time_wait_ports()
    second = up()
    second.send_signal(signal.SIGINT)
    assert second.wait(timeout=30) == 0


def test_throwaway_port_blocks_are_disjoint_and_below_the_ephemeral_range():
    """A port the OS may give an outgoing connection as its local port (its
    ephemeral range) can be taken between the free check and the server's bind:
    blocks come from below that range, and two blocks chosen before either is
    bound do not overlap."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    first, second = free_port_block(35), free_port_block(35)
    assert first + 35 <= ephemeral_low and second + 35 <= ephemeral_low
    assert not set(range(first, first + 35)) & set(range(second, second + 35))
