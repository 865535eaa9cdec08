"""``ampd.profile.cpu_use``: each part's CPU seconds, checked against what the
processes themselves read from their own CPU clock (``time.process_time``, the
kernel's per-process counter, read inside each process), and the share worked out
by hand."""

import subprocess
import sys
import time

import psutil
import pytest

from ampd.profile.cpu_use import cpu_seconds, cpu_share

# A process that burns 0.3 s of CPU by its own clock, writes that reading to a file and
# sleeps. With "spawn" it first starts a copy of itself (the grandchild), which stays
# alive; with "reap" the copy writes its reading and exits, and is waited for (its CPU
# then counts in its parent's children times) before the process burns its own.
_BURNER = """
import subprocess, sys, time
out, mode = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
if mode:
    child = subprocess.Popen([sys.executable, __file__, out + ".child"] + (["exit"] if mode == "reap" else []))
    if mode == "reap":
        child.wait()
while time.process_time() < 0.3:
    pass
with open(out, "w") as f:
    f.write(repr(time.process_time()))
if mode != "exit":
    time.sleep(120)
"""


def _wait_for(*paths):
    deadline = time.monotonic() + 60
    while not all(p.exists() and p.read_text() for p in paths):
        assert time.monotonic() < deadline, "the burners did not report"
        time.sleep(0.05)
    return [float(p.read_text()) for p in paths]


@pytest.mark.parametrize("mode", ["spawn", "reap"])
def test_a_part_counts_its_process_and_the_processes_below_it(tmp_path, mode):
    # spawn: the grandchild is alive and read itself; reap: it has exited and is read in
    # its parent's children times. Either way the part holds both burns.
    script = tmp_path / "burn.py"
    script.write_text(_BURNER)
    out = tmp_path / "used"
    child = subprocess.Popen([sys.executable, str(script), str(out), mode])
    try:
        own, grandchild = _wait_for(out, tmp_path / "used.child")
        # Both have stopped burning (asleep or gone): the kernel's counters hold still, to its
        # 10 ms tick.
        tree = cpu_seconds({"part": child.pid})
        alone = cpu_seconds({"part": child.pid}, tree=False)
        assert tree["part"] == pytest.approx(own + grandchild, abs=0.05)
        assert alone["part"] == pytest.approx(own, abs=0.05)
    finally:
        for proc in psutil.Process(child.pid).children(recursive=True):
            proc.kill()
        child.kill()
        child.wait()
    assert cpu_seconds({"gone": child.pid}) == {"gone": 0.0}


def test_share_is_seconds_used_per_wall_second():
    # a: 2.5 - 1.0 = 1.5 s over 2 s; b: new, 0.5 s over 2 s.
    assert cpu_share({"a": 1.0}, {"a": 2.5, "b": 0.5}, 2.0) == {"a": 0.75, "b": 0.25}
    with pytest.raises(ValueError, match="wall_s"):
        cpu_share({}, {"a": 1.0}, 0.0)
