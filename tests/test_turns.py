"""Turns: needed holders share; a guess holds alone, and a needed waiter overtakes guesses that
queued before it."""

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


def test_needed_holders_share_and_a_guess_holds_alone() -> None:
    turns = Turns()
    needed_inside = 0
    guesses_inside = 0
    most_needed = 0
    mixed = False
    lock = threading.Lock()
    start = threading.Barrier(6)

    def work(speculative: bool) -> None:
        nonlocal needed_inside, guesses_inside, most_needed, mixed
        start.wait(5)
        for _ in range(20):
            with turns.turn(speculative):
                with lock:
                    if speculative:
                        guesses_inside += 1
                    else:
                        needed_inside += 1
                    most_needed = max(most_needed, needed_inside)
                    mixed |= guesses_inside > 1 or (guesses_inside > 0 and needed_inside > 0)
                time.sleep(0.002)
                with lock:
                    if speculative:
                        guesses_inside -= 1
                    else:
                        needed_inside -= 1

    threads = [threading.Thread(target=work, args=(i % 2 == 0,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not mixed, "a guess held its turn beside another holder"
    assert most_needed > 1, "needed holders never shared"
    assert needed_inside == guesses_inside == 0
