"""Writes the file named by its first argument, then prints its arguments: the CLI
tests tell from the file whether the program ran."""

import sys

with open(sys.argv[1], "w") as f:
    f.write("the program ran\n")
print("argv:", sys.argv[1:])
