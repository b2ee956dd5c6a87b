"""A busy main thread beside a poller thread that sleeps: the sleeping is waiting."""

import threading
import time


def poll(stop):
    while not stop.is_set():
        time.sleep(0.005)


def crunch():
    total = 0
    for _ in range(40):
        total += sum(i * i for i in range(20_000))  # work line
    return total


stop = threading.Event()
poller = threading.Thread(target=poll, args=(stop,), name="poller")
poller.start()
print("total", crunch())
stop.set()
poller.join()
