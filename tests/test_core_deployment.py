"""Deployment notation and placement on servers."""

import pytest

from ampd.core import Deployment, InputError, Role


def test_parse_and_print_round_trip():
    d = Deployment.parse("P:<TP=2,DP=2> D:<TP=4,DP=1>")
    assert str(d) == "P:<TP=2,DP=2> D:<TP=4,DP=1>"
    assert d.num_gpus == 8
    mixed = Deployment.parse("p:<tp=1,dp=2>+<TP=2,DP=1> D:<TP=4,DP=1>")
    assert str(mixed) == "P:<TP=1,DP=2>+<TP=2,DP=1> D:<TP=4,DP=1>" and mixed.num_gpus == 8


def test_placement_never_splits_a_replica_across_servers():
    # 16 GPUs, 2 servers: TP8 decode fills one server, four TP2 prefill the other.
    workers = Deployment.parse("P:<TP=2,DP=4> D:<TP=8,DP=1>").workers(16)
    assert [(w.role, w.tp, w.server) for w in workers] == [(Role.PREFILL, 2, 1)] * 4 + [(Role.DECODE, 8, 0)]


@pytest.mark.parametrize("text, message", [
    ("P:<TP=2,DP=2>", "at least one decode"),
    ("P:<TP=2;DP=2> D:<TP=4,DP=1>", "cannot read group"),
    ("X:<TP=2,DP=2>", "cannot read"),
    ("D:<TP=0,DP=1>", ">= 1"),
    ("P:<TP=2,DP=3> D:<TP=4,DP=1>+", "cannot read group ''"),  # a group left out is not an empty one
    ("P:<TP=2,DP=3> D:+<TP=4,DP=1>", "cannot read group ''"),
])
def test_bad_notation_is_refused_with_reason(text, message):
    with pytest.raises(InputError, match=message):
        Deployment.parse(text)


def test_too_many_gpus_or_unpackable_is_refused():
    with pytest.raises(InputError, match="needs 12 GPUs, the cluster has 8"):
        Deployment.parse("P:<TP=4,DP=1> D:<TP=8,DP=1>").workers(8)
    with pytest.raises(InputError, match="exceeds 8 GPUs per server"):
        Deployment.parse("D:<TP=16,DP=1>").workers(16)
    with pytest.raises(InputError, match="do not pack"):
        Deployment.parse("D:<TP=3,DP=2>").workers(6, gpus_per_server=4)  # servers of 4 and 2 GPUs: 3 + 3 do not fit
