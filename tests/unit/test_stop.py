"""Closing a window: event memory reused across windows and sessions."""

import gc

import gpuprof

CPU = [gpuprof.ProfilerActivity.CPU]


def leaf(x):
    return x + 1


def middle(n):
    total = 0
    for i in range(n):
        total += leaf(i) + len(str(i))
    return total


def session_bytes(n):
    with gpuprof.profile(activities=CPU, max_events=2_000_000) as prof:
        for _ in range(n):
            middle(100)
        held = prof.buffer_stats()["bytes_held"]
    return held, prof


def test_event_memory_is_reused_by_the_next_sessions(no_gc):
    first, prof = session_bytes(300)
    assert first >= 60_000 * 16  # 300 x ~200 events
    del prof
    gc.collect()
    for _ in range(3):
        held, prof = session_bytes(300)
        del prof
        gc.collect()
        assert held == first


def test_windows_give_their_events_back_when_their_results_go(no_gc):
    held = []

    def ready(p):
        held.append(p.buffer_stats()["bytes_held"])

    sched = gpuprof.schedule(wait=0, warmup=1, active=1)
    with gpuprof.profile(activities=CPU, schedule=sched, on_trace_ready=ready) as prof:
        for _ in range(40):
            middle(2000)
            prof.step()
    assert len(held) >= 19
    # the pool stops growing at once
    assert max(held[2:]) == max(held[:2])
