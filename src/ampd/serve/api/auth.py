"""Access control of the coordinator's HTTP API (docs/SERVING.md, "Access").

- **Client keys** (optional): the OpenAI endpoints want ``Authorization: Bearer
  <key>``, as OpenAI clients send it, from ``serve.api_keys_file`` and the
  ``AMPD_API_KEYS`` environment variable. Each session belongs to the key that
  created it (its *scope*, a fingerprint of the key, never the key itself):
  rounds of it under another key are refused. Without client keys the API is
  open and every client shares one scope.
- **Admin** (``/metrics``, ``/ampd/decisions``: they show session ids): the
  admin keys of ``serve.admin_keys_file`` and ``AMPD_ADMIN_KEYS`` when there are
  some, else clients on loopback only.

Keys are compared by their SHA-256 digests (a lookup, no early-exit string
comparison on the secret); none is logged or written into a configuration.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fastapi.security import HTTPAuthorizationCredentials

from ampd.core.errors import InputError
from ampd.serve.rounds.round import ServeError

API_KEYS_ENV = "AMPD_API_KEYS"
ADMIN_KEYS_ENV = "AMPD_ADMIN_KEYS"
SCOPE_HEX_CHARS = 16  # [our choice] 64 bits of the key's SHA-256: tells keys apart, reveals nothing usable


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def read_keys(path: str, environ: Mapping[str, str], variable: str) -> list[str]:
    """Keys from a file (one a line; blank lines and ``#`` comments skipped) and
    an environment variable (separated by commas or whitespace).

    Raises:
        InputError: the file cannot be read, or holds no key.
    """
    keys = environ.get(variable, "").replace(",", " ").split()
    if path:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as err:
            raise InputError(f"cannot read the key file {path}: {err.strerror}") from None
        from_file = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not from_file:
            raise InputError(f"the key file {path} holds no key")
        keys += from_file
    return keys


@dataclass(frozen=True)
class AccessPolicy:
    """Who may call what.

    Attributes:
        client_scopes: SHA-256 hex digest of each client key -> its scope.
        admin_digests: SHA-256 hex digests of the admin keys.
    """

    client_scopes: Mapping[str, str]
    admin_digests: frozenset[str]

    @classmethod
    def load(cls, api_keys_file: str = "", admin_keys_file: str = "",
             environ: Mapping[str, str] | None = None) -> AccessPolicy:
        """The policy of ``serve.api_keys_file``, ``serve.admin_keys_file`` and the
        ``AMPD_API_KEYS`` / ``AMPD_ADMIN_KEYS`` variables of ``environ`` (default:
        this process's environment).

        Raises:
            InputError: a key file that cannot be read or holds no key.
        """
        environ = os.environ if environ is None else environ
        clients = read_keys(api_keys_file, environ, API_KEYS_ENV)
        admins = read_keys(admin_keys_file, environ, ADMIN_KEYS_ENV)
        return cls({_digest(k): _digest(k)[:SCOPE_HEX_CHARS] for k in clients},
                   frozenset(_digest(k) for k in admins))

    @property
    def open(self) -> bool:
        """True when the OpenAI endpoints need no key."""
        return not self.client_scopes

    def client_scope(self, credentials: HTTPAuthorizationCredentials | None) -> str:
        """The scope of a client's request ("" when no keys are configured).

        Raises:
            ServeError: 401 without a key, or with one that is not a client key.
        """
        if self.open:
            return ""
        if credentials is None:
            raise ServeError(401, "missing API key: send Authorization: Bearer <key>")
        scope = self.client_scopes.get(_digest(credentials.credentials))
        if scope is None:
            raise ServeError(401, "invalid API key")
        return scope

    def check_admin(self, credentials: HTTPAuthorizationCredentials | None, peer: str | None) -> None:
        """Let an admin request through.

        Raises:
            ServeError: 401 without an admin key (when admin keys exist), 403 for
                a client key, or for a client not on loopback when none exist.
        """
        if not self.admin_digests:
            if not _loopback(peer):
                raise ServeError(403, "admin endpoints answer on loopback only unless admin keys are set "
                                      f"(serve.admin_keys_file or {ADMIN_KEYS_ENV})")
            return
        if credentials is None:
            raise ServeError(401, "missing admin key: send Authorization: Bearer <admin key>")
        digest = _digest(credentials.credentials)
        if digest in self.admin_digests:
            return
        if digest in self.client_scopes:
            raise ServeError(403, "this key is not an admin key")
        raise ServeError(401, "invalid admin key")


def _loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
