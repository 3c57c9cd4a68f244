"""Transaction ids: who holds a queue's lock, unique without a system call per operation.

A default txn id is a random id of this process and a counter; a forked
child draws its own process id. A txn id given by the caller is checked.
"""

from __future__ import annotations

import itertools
import os

from large_queue import errors

#: the longest txn id, in UTF-8 bytes: what a receipt is sized for (see ``_lifecycle.RECEIPT_BYTES``)
MAX_TXN_ID_BYTES = 128


def _new_process_id() -> None:
    global _process_id
    _process_id = os.urandom(8).hex()


# Default txn ids: a random id of this process and a counter, unique without a
# system call per operation (a forked child draws its own process id).
_process_id = ""
_new_process_id()
os.register_at_fork(after_in_child=_new_process_id)
_txn_counter = itertools.count()


def internal(what: str) -> str:
    """A lock holder's name for the library's own operations: ``what`` and a new unique id.

    Unique per call, so that no caller's ``txn_id`` (whose receipt lets a
    retry take back a lock its own txn still holds) can name it and take the
    lock from a live holder.
    """
    return f"{what}/{txn_id(None)}"


def txn_id(txn_id: object) -> str:
    """``txn_id`` as a lock owner name (checked), or a new unique one for None."""
    if txn_id is None:
        return f"{_process_id}-{next(_txn_counter)}"
    if type(txn_id) is int and txn_id.bit_length() > MAX_TXN_ID_BYTES * 4:  # past any id's digits
        raise errors.InvalidArgumentError(
            f"txn_id is an int of {txn_id.bit_length()} bits, longer than {MAX_TXN_ID_BYTES} digits"
        )
    if type(txn_id) not in (int, str) or str(txn_id) == "":
        raise errors.InvalidArgumentError(f"txn_id must be a non-empty str or an int, got {txn_id!r}")
    text = str(txn_id)
    if "\x00" in text:  # Aerospike would cut it there: two ids could become one
        raise errors.InvalidArgumentError(f"txn_id must not hold a NUL character, got {text!r}")
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise errors.InvalidArgumentError(f"txn_id is not valid text (a lone surrogate): {text!r}") from None
    if size > MAX_TXN_ID_BYTES:
        raise errors.InvalidArgumentError(
            f"txn_id is {size} bytes in UTF-8, longer than {MAX_TXN_ID_BYTES} (each receipt is sized for it)"
        )
    return text
