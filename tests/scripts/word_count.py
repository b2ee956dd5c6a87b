"""A word count, no training loop: generator expressions in list comprehensions over a
corpus (the findings must not call them a data loader)."""

import collections
import random

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


def make_corpus(n_lines, rng):
    return [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(n_lines)]  # corpus


def count_words(corpus):
    counts = collections.Counter()
    for line in corpus:
        counts.update(w.lower() for w in line.split())  # count
    return counts


def main():
    counts = count_words(make_corpus(5000, random.Random(0)))
    print("words", sum(counts.values()))


main()
