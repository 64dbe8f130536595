"""Run a call in a forked process with a time limit (for tests of calls that could hang)."""

from __future__ import annotations

import multiprocessing


def within(seconds, fn, *args):
    """``fn(*args)`` run in a forked process (a C loop holding the GIL cannot block the test); fails the
    test if it has not returned after ``seconds``, re-raises its exception otherwise."""
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)

    def target():
        try:
            writer.send(("value", fn(*args)))
        except Exception as exc:  # noqa: BLE001 - re-raised in the parent
            writer.send(("error", exc))

    child = ctx.Process(target=target, daemon=True)
    child.start()
    ready = reader.poll(seconds)
    if not ready:
        child.kill()
    child.join()
    assert ready, f"{fn.__name__}{args} did not return within {seconds} s"
    kind, value = reader.recv()
    if kind == "error":
        raise value
    return value
