"""Keyed locks: one lock per key, forgotten once free."""

from __future__ import annotations

import threading

from gpu_slicer.slicer.keyed_locks import KeyedLocks


def test_a_keyed_lock_excludes_others_of_its_key_and_is_forgotten_once_free() -> None:
    locks = KeyedLocks[str]()
    with locks.held("a"), locks.held("b"):
        assert len(locks) == 2
        taken: list[bool] = []

        def other() -> None:
            with locks.held("c"):
                taken.append(True)

        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        assert taken == [True]  # another key is not held up
    assert len(locks) == 0
