"""Mooncake FAST'25 trace JSONL -> sessions, rebuilding the sessions the trace
does not record.

Source: kvcache-ai/Mooncake ``FAST25-release/traces`` (Apache-2.0); Qin et al.,
"Mooncake: Trading More Storage for Less Computation", FAST'25. One line = one
request: ``timestamp`` (arrival, ms), ``input_length``, ``output_length``
(tokens), ``hash_ids`` (one id per 512-token block of the input; equal ids =
equal prefix blocks). Other keys are ignored.

Rebuilding sessions (the trace has no session id):
  * a request's *full blocks* are its ``hash_ids`` minus the last one when
    ``input_length`` is not a multiple of the block size (that block is partial
    and its id changes once the conversation grows);
  * a block is *shared* when more than ``shared_fraction`` (1 %) of requests
    hold it: system prompts common to many users; a prefix made only of shared
    blocks proves nothing, so a link needs at least one non-shared full block;
  * request j continues request i when i came earlier (by timestamp, then file
    order) and i's full blocks are a prefix of j's ``hash_ids``; among several
    such i, the longest prefix wins (the most specific evidence), then the
    latest request with that prefix (the most recent turn). On the conversation
    trace this differs from "latest of any length" for 4 of 3,932 links, but it
    keeps a prefix shared by a few unrelated requests (a template below the 1 %
    mark) from stealing a conversation's next turn;
  * a request is the parent of at most one child: the first later request that
    picks it. A second request extending the same prefix (a regenerated or
    edited turn) starts its own session, so sessions stay linear chains.

Mapping to rounds:
  * round input = ``input_length`` for the first request of a chain; for a child,
    ``input_length - parent.input_length - parent.output_length`` (the turn's
    new tokens), clamped at >= 1 when the child does not grow the context (a
    retry with the same prompt);
  * output = ``output_length``;
  * ``tool_s`` after a parent = child timestamp - parent timestamp, in seconds.
    The trace holds no service times, so this gap is the parent's own service
    time plus the user's think time, not an environment latency alone; the trace
    timestamps are also coarse (about 3 s steps in the real traces);
  * session id ``mooncake-<line>`` of the chain's first request; ``arrival_s``
    = its timestamp in seconds.
Cost: one pass over the requests walking a prefix tree of block ids, so
O(total blocks); the 12,031-request conversation trace converts in about a second.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ampd.core.errors import InputError
from ampd.core.session import MAX_TIME_S, MAX_TOKENS, Round, Session
from ampd.workload.jsonl import read_json_lines
from ampd.workload.records import input_error, parse_record

BLOCK_TOKENS = 512
SHARED_FRACTION = 0.01


class _RequestRecord(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    timestamp: float = Field(ge=0.0, le=MAX_TIME_S * 1000, allow_inf_nan=False)
    input_length: int = Field(ge=1, le=MAX_TOKENS)
    output_length: int = Field(ge=1, le=MAX_TOKENS)
    hash_ids: list[int]


@dataclass(frozen=True, slots=True)
class _Request:
    line: int
    record: _RequestRecord
    full_blocks: int


def convert_mooncake(path: str | Path, *, block_tokens: int = BLOCK_TOKENS,
                     shared_fraction: float = SHARED_FRACTION) -> list[Session]:
    """Rebuild multi-round sessions from a Mooncake trace (rules in the module doc).

    Args:
        block_tokens: tokens per ``hash_ids`` block (512 in the FAST'25 traces).
        shared_fraction: a block held by more than this fraction of requests is
            a shared system-prompt block. Tiny files need a larger value: with
            10 requests, 1 % would mark every block shared.

    Returns:
        Sessions sorted by arrival.

    Raises:
        InputError: ``"<file>:<line>: <field>: ..."`` for invalid JSON, a
            missing or bad field, or a ``hash_ids`` list whose length is not
            ``ceil(input_length / block_tokens)``; also for an empty file, a
            ``block_tokens`` below 1 or a ``shared_fraction`` outside [0, 1].
    """
    if not (isinstance(block_tokens, int) and block_tokens >= 1):
        raise InputError(f"convert_mooncake: block_tokens must be an integer >= 1, got {block_tokens!r}")
    if not 0.0 <= shared_fraction <= 1.0:
        raise InputError(f"convert_mooncake: shared_fraction must be in [0, 1], got {shared_fraction!r}")
    requests = _read_requests(path, block_tokens)
    shared = _shared_blocks(requests, shared_fraction)
    parents = _link_parents(requests, shared)
    return _build_sessions(requests, parents)


def _read_requests(path: str | Path, block_tokens: int) -> list[_Request]:
    requests = []
    for line, data in read_json_lines(path):
        record = parse_record(_RequestRecord, data, f"{path}:{line}")
        expected_blocks = math.ceil(record.input_length / block_tokens)
        if len(record.hash_ids) != expected_blocks:
            raise input_error(
                f"{path}:{line}", "hash_ids",
                f"{len(record.hash_ids)} ids for input_length {record.input_length}, "
                f"expected ceil({record.input_length} / {block_tokens}) = {expected_blocks}")
        partial = record.input_length % block_tokens != 0
        requests.append(_Request(line, record, len(record.hash_ids) - partial))
    return sorted(requests, key=lambda r: r.record.timestamp)


def _shared_blocks(requests: list[_Request], shared_fraction: float) -> set[int]:
    holders = Counter(block for r in requests for block in set(r.record.hash_ids))
    limit = shared_fraction * len(requests)
    return {block for block, count in holders.items() if count > limit}


def _link_parents(requests: list[_Request], shared: set[int]) -> list[int | None]:
    """Parent index of each request (None: starts a session). Walks a prefix
    tree of block ids; ``waiting[node]`` holds, oldest first, the requests whose
    full blocks end at that node and that have no child yet."""
    tree: dict[tuple[int, int], int] = {}
    waiting: dict[int, list[int]] = {}
    parents: list[int | None] = []
    for index, request in enumerate(requests):
        nodes = _walk(tree, request.record.hash_ids)
        parents.append(_claim_parent(nodes, waiting))
        full = request.full_blocks
        if full and any(block not in shared for block in request.record.hash_ids[:full]):
            waiting.setdefault(nodes[full - 1], []).append(index)
    return parents


def _walk(tree: dict[tuple[int, int], int], blocks: list[int]) -> list[int]:
    """Node id of every prefix of ``blocks`` (node 0 = empty prefix), adding
    the nodes not seen before."""
    nodes = []
    node = 0
    for block in blocks:
        node = tree.setdefault((node, block), len(tree) + 1)
        nodes.append(node)
    return nodes


def _claim_parent(nodes: list[int], waiting: dict[int, list[int]]) -> int | None:
    """Take the latest waiting request at the deepest node that has one."""
    for node in reversed(nodes):
        if waiting.get(node):
            return waiting[node].pop()
    return None


def _build_sessions(requests: list[_Request], parents: list[int | None]) -> list[Session]:
    child_of = {parent: child for child, parent in enumerate(parents) if parent is not None}
    sessions = []
    for index, parent in enumerate(parents):
        if parent is None:
            chain = _chain(index, child_of)
            root = requests[index]
            rounds = tuple(_round(requests, chain, position) for position in range(len(chain)))
            sessions.append(Session(f"mooncake-{root.line}", root.record.timestamp / 1000.0, rounds))
    return sessions


def _chain(first: int, child_of: dict[int, int]) -> list[int]:
    chain = [first]
    while chain[-1] in child_of:
        chain.append(child_of[chain[-1]])
    return chain


def _round(requests: list[_Request], chain: list[int], position: int) -> Round:
    this = requests[chain[position]].record
    new_tokens = this.input_length
    if position > 0:
        parent = requests[chain[position - 1]].record
        new_tokens = max(1, this.input_length - parent.input_length - parent.output_length)
    tool_s = 0.0
    if position + 1 < len(chain):
        tool_s = (requests[chain[position + 1]].record.timestamp - this.timestamp) / 1000.0
    return Round(new_tokens, this.output_length, tool_s)
