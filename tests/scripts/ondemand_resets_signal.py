"""Arms itself, then puts SIGUSR2 back to its default action (which ends a process),
as a program that takes over its signals might; steps with OnDemand.step().

    python ondemand_resets_signal.py STOP_FILE
"""

import os
import signal
import sys

import gpuprof


def work():
    return sum(range(20_000))


def main(stop):
    od = gpuprof.arm()
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    print(f"ready {od.pid}", flush=True)
    steps = 0
    while not os.path.exists(stop):
        work()
        od.step()
        steps += 1
    print(f"stopped after {steps} steps", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
