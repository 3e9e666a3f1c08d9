"""What a secure-aggregation node has already answered for: aggregation ids, its uploader set, its key holder.

:class:`SessionLedger` refuses a second masked (or encrypted) upload for one
aggregation id, a sum over another uploader set than the first this node
signed, and another CKKS key holder than the first it encrypted for: a
server holding two sums that differ by one node subtracts them.
:class:`mechanisms.secagg.masking.node.MaskingNode` consults it at the masked and
consistency stages, the Flower CKKS node at encryption and decryption; a
Flower node keeps it in ``context.state`` and optionally in a file
(:func:`privfed.flower.secagg.node_ledger`).
"""

from __future__ import annotations

from collections.abc import Callable

from mechanisms.secagg.crypto import ProtocolAbort

__all__ = ["KEY_SESSION_PREFIX", "SessionLedger"]

#: Prefix of a CKKS session id this node made keys for, in ``used`` (and in a ledger file).
KEY_SESSION_PREFIX = "keys:"


class SessionLedger:
    """The aggregation ids a node has uploaded a masked input for, and the uploaders its sums covered.

    One upload per id, ever: a node's noise share and input go into one
    masked sum per aggregation; a server asking again (to subtract two sums,
    or replaying an old run) is refused.  ``used`` is the persisted list
    (hex ids; ``keys:`` then a hex session id for a CKKS session this node
    made keys for, one key per session).

    One uploader set per node: the first uploader list the node signs
    (``uploaders``) is the only one it signs again.  A server that gets two
    sums over different sets (say with and without a victim) subtracts them
    and holds the victim's input; it needs only two aggregation ids, e.g.
    two run configs that sum the same statistic, so the id alone cannot stop
    it.  Equal sets give equal sums of whatever the node summed: nothing new.
    """

    def __init__(
        self,
        used: list[str] | None = None,
        also: Callable[[int], None] | None = None,
        uploaders: list[int] | None = None,
        holder: int | None = None,
        keep: Callable[[str], None] | None = None,
    ) -> None:
        self.used = list(used or [])
        self.also = also  # a second claim (a ledger kept beyond this run), called after this one's check
        self.uploaders = None if uploaders is None else sorted(int(v) for v in uploaders)
        self.holder = None if holder is None else int(holder)  # the CKKS key holder this node encrypts for
        self.keep = (
            keep  # keeps a pin ("uploaders=0,1,2", "holder=3") or a key session ("keys:...") beyond this run
        )

    def claim(self, aggregation: bytes, node: int) -> None:
        key = bytes(aggregation).hex()
        if key in self.used:
            raise ProtocolAbort(
                f"node {node} aborts at stage 'masked': it refuses a second masked session for aggregation "
                f"{key[:16]}: it already uploaded its masked input (and noise share) for it once; a server that "
                "repeats a sum could subtract the two",
                node=node,
                stage="masked",
                deviation="second-session",
            )
        if self.also is not None:
            self.also(node)
        self.used.append(key)

    def has_key_session(self, session: bytes) -> bool:
        """Whether this node (as CKKS key holder) already made keys for ``session``."""
        return KEY_SESSION_PREFIX + bytes(session).hex() in self.used

    def claim_key_session(self, session: bytes) -> None:
        """Note that this node made CKKS keys for ``session`` (one key per session id, ever): in this
        ledger and, when it is kept beyond the run (``keep``), there too, so a server that starts another
        run cannot have the holder make a second key for the session."""
        line = KEY_SESSION_PREFIX + bytes(session).hex()
        self.used.append(line)
        if self.keep is not None:
            self.keep(line)

    def pin(self, uploaders: list[int], node: int, stage: str) -> None:
        """Accept ``uploaders`` as the set this node's sum covers: the first set, or the same set again."""
        got = sorted(int(v) for v in uploaders)
        if self.uploaders is not None and got != self.uploaders:
            raise ProtocolAbort(
                f"node {node} aborts at stage {stage!r}: the server asks it to be summed with uploaders {got}, but "
                f"its earlier sum covered {self.uploaders}; the difference of two sums over different sets is "
                "one node's input (or the sum of a few), so no share is revealed",
                node=node,
                stage=stage,
                deviation="other-uploaders",
            )
        if self.uploaders is None:
            if self.keep is not None:
                self.keep("uploaders=" + ",".join(str(v) for v in got))
            self.uploaders = got

    def bind_holder(self, holder: int, node: int, stage: str) -> None:
        """Accept ``holder`` as the CKKS key holder this node encrypts for: the first, or the same again.

        A node never sees whose ciphertexts a CKKS sum adds; its key holder does, and pins that set.  One
        key holder per node keeps every CKKS sum of this node behind that one pin.
        """
        if self.holder is not None and int(holder) != self.holder:
            raise ProtocolAbort(
                f"node {node} aborts at stage {stage!r}: the server names key holder {holder}, but this node "
                f"encrypted for key holder {self.holder} before; that holder refuses a sum over another set, "
                "another holder would not know it",
                node=node,
                stage=stage,
                deviation="other-key-holder",
            )
        if self.holder is None:
            if self.keep is not None:
                self.keep(f"holder={int(holder)}")
            self.holder = int(holder)

    def record(self) -> dict:
        """The ledger as flat values (for a Flower ConfigRecord)."""
        out: dict = {"used": list(self.used)}
        if self.uploaders is not None:
            out["uploaders"] = list(self.uploaders)
        if self.holder is not None:
            out["holder"] = self.holder
        return out
