"""Does some work, then closes its standard output, as a program may."""

import sys


def work():
    return sum(i * i for i in range(200_000))


print("work", work())
sys.stdout.close()
