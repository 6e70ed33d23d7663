"""The garbage collector's settings while a driver leads (``GcTuning``)."""

from __future__ import annotations

import gc

__all__ = ["GcTuning"]


class GcTuning:
    """Process-wide garbage collector settings shared by the drivers that currently lead.

    Every step allocates thousands of objects (records, rows, futures) that live until their task
    finishes. With the default youngest-generation threshold (700) the collector runs every few
    tasks, and its older-generation passes walk every live task each time: about a fifth of a
    busy shard's time went there. Collections are made rarer while a driver leads, and the state
    recovered at takeover (which stays for the whole leadership) is frozen out of the collector's
    reach. The first leader applies the settings; the last one to stop puts them back.
    """

    leaders = 0
    saved_threshold: tuple[int, int, int] | None = None
    applied_threshold: tuple[int, int, int] | None = None
    froze = False

    @classmethod
    def acquire(cls, young: int | None) -> None:
        cls.leaders += 1
        if young is None or cls.applied_threshold is not None:
            return
        current = gc.get_threshold()
        if current[0] == 0 or current[0] >= young:
            return  # disabled by threshold, or already less eager than ours: keep it
        cls.saved_threshold = current
        cls.applied_threshold = (young, current[1], current[2])
        gc.set_threshold(*cls.applied_threshold)

    @classmethod
    def freeze(cls) -> None:
        """Move every object alive now (the recovered state) out of the collector's passes."""
        gc.freeze()
        cls.froze = True

    @classmethod
    def release(cls) -> None:
        if cls.leaders == 0:
            return
        cls.leaders -= 1
        if cls.leaders:
            return
        if cls.applied_threshold is not None and gc.get_threshold() == cls.applied_threshold:
            assert cls.saved_threshold is not None
            gc.set_threshold(*cls.saved_threshold)  # unless someone else changed it meanwhile
        cls.saved_threshold = cls.applied_threshold = None
        if cls.froze:
            gc.unfreeze()  # what the last leadership kept alive can be collected again
            cls.froze = False
