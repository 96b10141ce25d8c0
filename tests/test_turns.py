"""Turns: one holder at a time; a needed waiter overtakes guesses that queued before it."""

from __future__ import annotations

import threading
import time

from runner.turns import Turns


def _wait_for(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_needed_waiter_goes_before_speculative_ones_that_queued_first() -> None:
    turns = Turns()
    order: list[str] = []
    release = threading.Event()
    holding = threading.Event()

    def holder() -> None:
        with turns.turn(speculative=True):
            holding.set()
            release.wait(5)
            order.append("holder")

    def waiter(name: str, speculative: bool) -> None:
        with turns.turn(speculative):
            order.append(name)

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    holding.wait(5)
    for name in ("guess-1", "guess-2"):
        threads.append(threading.Thread(target=waiter, args=(name, True)))
        threads[-1].start()
    time.sleep(0.05)  # both guesses are waiting
    threads.append(threading.Thread(target=waiter, args=("needed", False)))
    threads[-1].start()
    _wait_for(lambda: turns._needed_waiting == 1)
    release.set()
    for thread in threads:
        thread.join(5)
    assert order[:2] == ["holder", "needed"]
    assert sorted(order[2:]) == ["guess-1", "guess-2"]


def test_one_holder_at_a_time() -> None:
    turns = Turns()
    inside = 0
    most = 0
    lock = threading.Lock()

    def work(speculative: bool) -> None:
        nonlocal inside, most
        for _ in range(20):
            with turns.turn(speculative):
                with lock:
                    inside += 1
                    most = max(most, inside)
                time.sleep(0.001)
                with lock:
                    inside -= 1

    threads = [threading.Thread(target=work, args=(i % 2 == 0,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert most == 1
    assert inside == 0
