"""The KV transfer path's typed errors. Every failure of a pull is a `TransferError`; the decode
side turns it into vLLM's load-failure policy (recompute), never into wrong tokens."""

from __future__ import annotations


class TransferError(RuntimeError):
    """A KV transfer failed: the peer refused, vanished, stalled or sent something unexpected."""


class IncompatiblePeer(TransferError):
    """The producer and the consumer disagree on what a block's bytes mean (model weights, dtype,
    block size, layout, layer count, KV heads, head size) or on the transport."""


class TransferTimeout(TransferError):
    """The peer made no progress for the I/O timeout inside an exchange."""


class PeerClosed(TransferError):
    """The peer closed or reset the connection; `received` bytes of the interrupted read had arrived."""

    def __init__(self, message: str, received: int = 0):
        super().__init__(message)
        self.received = received


class ChecksumMismatch(TransferError):
    """The bytes of `block_ids` (the consumer's local ids) arrived, but their checksums differ from
    the producer's: those blocks are a load error (vLLM recomputes them); the others are good."""

    def __init__(self, message: str, block_ids: list[int]):
        super().__init__(message)
        self.block_ids = list(block_ids)
