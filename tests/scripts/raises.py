"""Raises after some work: the CLI must let the traceback and exit code through."""


def work():
    return sum(i * i for i in range(300_000))


work()
raise ValueError("boom from the profiled program")
