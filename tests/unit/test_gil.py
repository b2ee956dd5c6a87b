"""gpuprof's own threads get the GIL back from a main thread that lets it go and
takes it back often (csrc/record/gil.c): _wait_readable hands the GIL over."""

import os
import threading
import time

import pytest
from gpuprof import _gpuprof

ROUNDS = 20
PASS_CAP = 3_000


def test_a_thread_waking_from_a_wait_gets_the_gil_from_a_busy_main_thread(tmp_path):
    """The main thread runs a Python loop of about a millisecond a pass with one stat()
    in each, which starves a plain select()'s return for seconds (thousands of
    passes). Counted in passes, not seconds: with the handoff the thread, woken by a
    byte the main thread writes, is back in Python within a few passes."""
    r, w = os.pipe()
    acks = []

    def waiter():
        for _ in range(ROUNDS):
            # as the on-demand thread waits: the byte is read inside the wait (an
            # os.read() here would let the GIL go again, with no handoff to get it back)
            assert _gpuprof._wait_readable(r, 30.0, True)
            acks.append(True)

    probe = str(tmp_path)
    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    worst = 0
    try:
        for k in range(ROUNDS):
            time.sleep(0.01)  # the waiter is back asleep in its wait
            os.write(w, b"!")
            passes = 0
            while len(acks) <= k and passes < PASS_CAP:
                os.path.exists(probe)
                sum(range(30_000))
                passes += 1
            worst = max(worst, passes)
            if passes == PASS_CAP:
                break
    finally:
        os.write(w, b"!" * ROUNDS)  # let a thread still waiting go
        t.join(30)
        os.close(r)
        os.close(w)
    assert len(acks) == ROUNDS
    assert worst < 200, f"the waiting thread needed {worst} passes of the main loop"


def test_a_wait_that_times_out_says_so():
    r, w = os.pipe()
    try:
        assert _gpuprof._wait_readable(r, 0.0) is False
        os.write(w, b"!")
        assert _gpuprof._wait_readable(r, 0.0) is True
    finally:
        os.close(r)
        os.close(w)


def test_a_draining_wait_reads_what_the_pipe_holds():
    r, w = os.pipe()
    os.set_blocking(r, False)
    try:
        os.write(w, b"!" * 5000)  # more than one read's worth
        assert _gpuprof._wait_readable(r, 1.0, True) is True
        with pytest.raises(BlockingIOError):
            os.read(r, 1)  # nothing left
        os.write(w, b"!")
        assert _gpuprof._wait_readable(r, 1.0) is True
        assert os.read(r, 10) == b"!"  # without drain the byte stays
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize(
    ("fd", "timeout", "match"),
    [(-1, 1.0, "fd must be >= 0"), (0, -1.0, "timeout_s"), (0, float("inf"), "timeout_s")],
)
def test_bad_arguments_are_named(fd, timeout, match):
    with pytest.raises(ValueError, match=match):
        _gpuprof._wait_readable(fd, timeout)
