"""Signing what a journal keeps, so that a shared store is not a door into every process that
resumes from it.

Outputs, effects' results, answers and a run's input are pickled, and unpickling runs what
whoever wrote them put there. With a key, each is signed (HMAC-SHA256) over what it is and where
it belongs (its kind, its key or call) as well as its bytes, so that an entry cannot be moved to
another place either; one that does not verify is refused before it is unpickled. Without a key
nothing is signed, and the store is trusted like code.
"""

from __future__ import annotations

import hashlib
import hmac

from soma.errors import SignatureError


class Signer:
    """Signs and verifies under one key; ``key=None`` signs nothing and verifies everything."""

    __slots__ = ("_key", "where")

    def __init__(self, key: bytes | str | None, where: str) -> None:
        if isinstance(key, str):
            key = key.encode()
        if key is not None and (not isinstance(key, bytes) or not key):
            raise ValueError("key is a non-empty bytes or str, or None")
        self._key = key
        self.where = where

    @property
    def signs(self) -> bool:
        return self._key is not None

    def sign(self, kind: bytes, place: bytes, payload: bytes) -> bytes | None:
        if self._key is None:
            return None
        return hmac.digest(self._key, _message(kind, place, payload), hashlib.sha256)

    def verify(
        self, kind: bytes, place: bytes, payload: bytes, sig: bytes | None, what: str
    ) -> None:
        """Raises ``SignatureError`` naming ``what`` unless ``sig`` is ``payload``'s, at
        ``place``, under the key (nothing is checked without a key)."""
        if self._key is None:
            return
        if sig is None or not hmac.compare_digest(
            sig, hmac.digest(self._key, _message(kind, place, payload), hashlib.sha256)
        ):
            error = SignatureError(
                f"{what} in `{self.where}` does not verify under the journal's key "
                f"({'unsigned' if sig is None else 'signed otherwise or changed since'}): "
                "refused, not unpickled\n"
                "hint: whoever can write the store can run code where it is read; find who "
                "wrote it, or open the journal with the key it was written with"
            )
            error.what = what
            raise error


def _message(kind: bytes, place: bytes, payload: bytes) -> bytes:
    return b"".join(
        (len(kind).to_bytes(2, "big"), kind, len(place).to_bytes(4, "big"), place, payload)
    )
