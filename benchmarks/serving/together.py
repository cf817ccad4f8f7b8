"""Run blocking calls side by side, one thread each, and collect their results."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def run_together(calls: Sequence[Callable[[], T]], *, barrier: bool = False) -> list[T]:
    """Each call on its own thread, started in order; results in the same order. With
    ``barrier`` every thread waits until all have started, so the calls reach the server
    together. The first error raised in a thread is raised again here, after all end."""
    results: list[T | None] = [None] * len(calls)
    errors: list[BaseException] = []
    gate = threading.Barrier(len(calls)) if barrier and calls else None

    def run(i: int) -> None:
        try:
            if gate is not None:
                gate.wait()
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]  # every slot was filled
