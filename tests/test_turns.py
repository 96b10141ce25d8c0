"""Turns: needed holders never wait; a guess waits for them and for another guess."""

from __future__ import annotations

import threading
import time

from runner.turns import Turns


def _wait_for(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_needed_holder_never_waits_and_guesses_wait_for_it() -> None:
    turns = Turns()
    order: list[str] = []
    release = threading.Event()
    holding = threading.Event()

    def guess_holder() -> None:
        with turns.turn(speculative=True):
            holding.set()
            release.wait(5)
            order.append("guess holding")

    def needed() -> None:
        with turns.turn():
            order.append("needed")
            time.sleep(0.1)  # a guess that queued meanwhile waits for this to end

    def guess() -> None:
        with turns.turn(speculative=True):
            order.append("guess waiting")

    first = threading.Thread(target=guess_holder)
    first.start()
    holding.wait(5)
    threads = [threading.Thread(target=needed), threading.Thread(target=guess)]
    for thread in threads:
        thread.start()
    _wait_for(lambda: order == ["needed"])  # in beside the guess that holds
    release.set()
    for thread in [first, *threads]:
        thread.join(5)
    assert order == ["needed", "guess holding", "guess waiting"]


def test_needed_holders_share_and_a_guess_enters_only_alone() -> None:
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
                        # A guess enters only when nobody holds a turn.
                        mixed |= guesses_inside > 0 or needed_inside > 0
                        guesses_inside += 1
                    else:
                        needed_inside += 1
                    most_needed = max(most_needed, needed_inside)
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
    assert not mixed, "a guess took its turn beside another holder"
    assert most_needed > 1, "needed holders never shared"
    assert needed_inside == guesses_inside == 0
