"""A hashing job through a thread pool's Executor.map: worker threads, no steps."""

import hashlib
from concurrent.futures import ThreadPoolExecutor


def digest(i):
    h = hashlib.sha256()
    for k in range(200):
        h.update(f"{i}:{k}".encode())  # hash
    return h.hexdigest()


with ThreadPoolExecutor(max_workers=4, thread_name_prefix="hasher") as pool:
    out = list(pool.map(digest, range(1000)))
print("digests", len(out))
