"""Sessions found from the prompt (docs/SERVING.md, "How sessions are found"): a
request that names no session continues the session whose history its prompt
extends, looked up in an index kept in the shared store, so every replica finds
the same session.

**Hashes.** A prompt's token ids are cut into blocks of ``block_tokens`` and
hashed in a chain, as vLLM's prefix cache does: hash k covers tokens
``[0, k * block_tokens)`` and is the hash of hash k-1 and block k. The chain
starts from the client's scope (its API key's fingerprint), so a client never
finds a session of another key.

**Index.** One entry per round of a session (its last
``MAX_ENTRIES_PER_SESSION``), filed under the chain hash of the block-aligned
part of the round's prompt (the first ``floor(prompt / block) * block``
tokens); the entry holds the exact lengths of that prompt and of the prompt
followed by the round's output (what the decode engine's KV held after it),
each with a hash of its tokens after the key. A lookup hashes the new prompt's
blocks, reads every key they name in one store round trip, and checks each entry
found against the new prompt's own tokens: a match is a whole round's history
that the new prompt strictly extends, never a shared block alone, so sessions
that share a system prompt are not pinned to one engine (a prompt that extends
no history starts a new session, bound by free KV as any). Of several matches
the longest wins; ties go to a session's latest round, then to the smallest
session id.

**Diverged histories.** A client that edits an earlier turn, or a template that
re-renders one differently, sends a prompt that extends an earlier round of its
session but not the latest: it continues the session from that round's history
(``HistoryMatch.diverged``), the longest common prefix the index can verify, and
its entries of the rounds after that one are dropped once the new round is
filed (the decode engine holds the new branch: an entry of the old one would
count tokens it no longer holds as history). The engines reuse what their KV holds of it and recompute the rest (vLLM's prefix
cache matches whole blocks by content: never KV of other tokens). What an engine
reuses may go beyond the match, to the block where the edit begins; the
coordinator counts only what it verified.

Sessions the client names are filed too, under a scope of their own (the
client's and the session id), so a prompt of theirs is verified against their
own rounds only and never found by a request naming no session
(``Coordinator.verify_history``).

Clients that send text (chat) re-tokenize the model's reply, which need not
give the ids it generated: the prompt-level entry finds them. Clients that
send token ids resend the output: the history-level entry tells apart sessions
whose first prompts were identical.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ampd.serve.state.store import HistoryEntry, StateStore

HASH_BYTES = 16  # 128-bit hashes: a false match needs a collision, negligible at any index size
TOKEN_BYTES = 4  # token ids are checked to fit [0, 2^31) (requests.py)
# [our choice] A key holds at most this many sessions (sessions whose prompts agree up to the
# same block boundary); beyond, the oldest is dropped from the index, so a lookup decodes a
# bounded list whatever the traffic.
MAX_ENTRIES_PER_KEY = 64
# [our choice] A session keeps entries for its last this many rounds: a client that edits a
# turn further back starts a new session (bounded index whatever the sessions' lengths; agent
# sessions in the traces we replay run 2-20 rounds).
MAX_ENTRIES_PER_SESSION = 16


@dataclass(frozen=True, slots=True)
class HistoryMatch:
    """The session a prompt continues.

    Attributes:
        session_id: the session.
        matched_tokens: length of its history that the prompt starts with, tokens.
        diverged: the match is an earlier round's history, not the session's
            latest (an edited turn): the decode engine holds other tokens after
            ``matched_tokens``.
        round_index: the round whose history it is (-1 for a new session).
    """

    session_id: str
    matched_tokens: int
    diverged: bool = False
    round_index: int = -1


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as little-endian 32-bit integers (the same bytes on every replica)."""
    return np.asarray(tokens, dtype="<u4").tobytes()


def chain_hashes(data: bytes, block_tokens: int, scope: str) -> list[bytes]:
    """The chain hash of every full block of ``data`` (``token_bytes`` of a
    prompt): element k covers tokens ``[0, (k + 1) * block_tokens)``."""
    digest = hashlib.blake2b(b"ampd-history\x00" + scope.encode("utf-8", "surrogatepass"),
                             digest_size=HASH_BYTES).digest()
    step = block_tokens * TOKEN_BYTES
    hashes = []
    for start in range(0, len(data) - step + 1, step):
        digest = hashlib.blake2b(digest + data[start:start + step], digest_size=HASH_BYTES).digest()
        hashes.append(digest)
    return hashes


def _tail_hash(key: bytes, tail: bytes) -> str:
    """Hash of the tokens after a key (any number, not a whole block)."""
    return hashlib.blake2b(key + tail, digest_size=HASH_BYTES).hexdigest()


class HistoryIndex:
    """Finds and files the histories of sessions found from their prompts.

    Args:
        store: the shared store holding the index.
        block_tokens: tokens per hashed block (``serve.session_block_tokens``).
    """

    def __init__(self, store: StateStore, block_tokens: int) -> None:
        self.store, self.block_tokens = store, block_tokens

    async def find(self, prompt: Sequence[int], scope: str) -> HistoryMatch | None:
        """The session whose history ``prompt`` extends the furthest, or None.

        Args:
            prompt: the request's whole prompt, token ids.
            scope: the client's API key fingerprint ("" without keys).

        Raises:
            StoreUnavailable: the store did not answer.
        """
        data = token_bytes(prompt)
        hashes = chain_hashes(data, self.block_tokens, scope)
        found = await self.store.history_entries([h.hex() for h in hashes])
        best, best_rank = None, None
        for block, entries in enumerate(found):
            start = (block + 1) * self.block_tokens
            for entry in entries:
                tokens = _extends(data, hashes[block], start, entry)
                rank = (-tokens, not entry.latest, entry.session_id)
                if tokens and (best_rank is None or rank < best_rank):
                    best, best_rank = HistoryMatch(entry.session_id, tokens, not entry.latest, entry.round_index), rank
        return best

    async def record(self, session_id: str, scope: str, prompt: Sequence[int], output: Sequence[int],
                     round_index: int, branch_round: int | None = None) -> bool:
        """File the history of ``session_id`` after round ``round_index``: its
        prompt, and the prompt followed by ``output`` (the ids the decode engine
        generated), as the session's latest entry. A round whose prompt extended
        round ``branch_round`` (a diverged history) drops the session's entries
        of the rounds after that one: they are another branch, which the decode
        engine no longer holds, so every entry left is a prefix of what it holds
        and a later match never counts tokens of the abandoned branch as history.
        False when not filed: a prompt shorter than one block (nothing worth
        finding), or a session that ended meanwhile.

        Raises:
            StoreUnavailable: the store did not answer.
        """
        aligned_tokens = len(prompt) // self.block_tokens * self.block_tokens
        if aligned_tokens == 0:
            return False
        data = token_bytes([*prompt, *output])
        key = chain_hashes(data[:aligned_tokens * TOKEN_BYTES], self.block_tokens, scope)[-1]
        prompt_end = len(prompt) * TOKEN_BYTES
        entry = HistoryEntry(session_id, len(prompt), _tail_hash(key, data[aligned_tokens * TOKEN_BYTES:prompt_end]),
                             len(prompt) + len(output), _tail_hash(key, data[aligned_tokens * TOKEN_BYTES:]),
                             round_index)
        return await self.store.index_history(session_id, key.hex(), entry, MAX_ENTRIES_PER_KEY,
                                              MAX_ENTRIES_PER_SESSION,
                                              round_index - 1 if branch_round is None else branch_round)


def _extends(data: bytes, key: bytes, start_tokens: int, entry: HistoryEntry) -> int:
    """Tokens of ``entry``'s history (or, failing that, of its prompt) that the
    prompt in ``data`` starts with and goes beyond; 0 when neither."""
    prompt_tokens = len(data) // TOKEN_BYTES
    for tokens, digest in ((entry.history_tokens, entry.history_hash), (entry.prompt_tokens, entry.prompt_hash)):
        if start_tokens <= tokens < prompt_tokens and \
                _tail_hash(key, data[start_tokens * TOKEN_BYTES:tokens * TOKEN_BYTES]) == digest:
            return tokens
    return 0
