#!/usr/bin/env python3
"""Overhead of gpuprof's Python profile hook, side by side with other profilers.

Runs three workloads (recursive fib, a pure-Python tokenizer/parser/evaluator,
a NumPy loop of small C calls) under each mode -- no profiler, a do-nothing C
"floor" hook, gpuprof recording (ACTIVE), gpuprof installed but idle (WAIT),
cProfile, and yappi / viztracer / pyinstrument when importable -- in one
process, interleaving the modes in every repeat. Then measures gpuprof's
aggregation throughput (time spent in ``prof.stop()`` per recorded event) on
a run of >= 10 million events.

    GPUPROF_NO_CUDA=1 python3 setup.py build_ext --inplace
    PYTHONPATH=python python3 benchmarks/bench_python_hook.py [--quick] [--repeats N]
        [--json PATH] [--workloads fib,parser,numpy] [--no-throughput]

Prints a table and writes JSON (default benchmarks/results/bench_python_hook.json).
See benchmarks/README.md for what each mode means.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import heapq
import importlib.util
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path
from resource import RUSAGE_SELF, getrusage

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))

import gpuprof  # noqa: E402
from _runinfo import run_info  # noqa: E402
from gpuprof import _gpuprof  # noqa: E402

perf_ns = time.perf_counter_ns
cpu_ns = time.thread_time_ns  # this thread's CPU time: not advanced while other load runs

# ---------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def make_fib(n: int, reps: int):
    def run():
        total = 0
        for _ in range(reps):
            total += fib(n)
        return total

    return run, f"fib({n}) x {reps}"


# -- (b) a tokenizer, recursive-descent parser and evaluator of arithmetic with
#        variables: small classes, properties, many short methods, dict lookups,
#        plus a heapq-driven "scheduler" that evaluates statements by priority.


class Token:
    __slots__ = ("kind", "text", "pos")

    def __init__(self, kind, text, pos):
        self.kind = kind
        self.text = text
        self.pos = pos

    @property
    def is_op(self):
        return self.kind == "op"

    def matches(self, kind, text=None):
        return self.kind == kind and (text is None or self.text == text)


class Lexer:
    OPS = frozenset("+-*/%()=;")

    def __init__(self, source):
        self.source = source
        self.pos = 0

    @property
    def at_end(self):
        return self.pos >= len(self.source)

    def peek_char(self):
        return self.source[self.pos]

    def advance(self):
        ch = self.source[self.pos]
        self.pos += 1
        return ch

    def skip_space(self):
        while not self.at_end and self.peek_char() == " ":
            self.advance()

    def read_while(self, pred):
        start = self.pos
        while not self.at_end and pred(self.peek_char()):
            self.advance()
        return self.source[start : self.pos]

    def tokens(self):
        out = []
        while True:
            self.skip_space()
            if self.at_end:
                out.append(Token("eof", "", self.pos))
                return out
            ch = self.peek_char()
            start = self.pos
            if ch.isdigit():
                out.append(Token("num", self.read_while(str.isdigit), start))
            elif ch.isalpha():
                out.append(Token("name", self.read_while(str.isalnum), start))
            elif ch in self.OPS:
                out.append(Token("op", self.advance(), start))
            else:
                raise SyntaxError(f"bad character {ch!r} at {start}")


class Node:
    __slots__ = ()

    def evaluate(self, env):
        raise NotImplementedError


class Num(Node):
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def evaluate(self, env):
        return self.value


class Var(Node):
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def evaluate(self, env):
        return env.lookup(self.name)


class BinOp(Node):
    __slots__ = ("op", "left", "right")
    FUNCS = {
        "+": lambda a, b: a + b,
        "-": lambda a, b: a - b,
        "*": lambda a, b: a * b,
        "/": lambda a, b: a // b if b else 0,
        "%": lambda a, b: a % b if b else 0,
    }

    def __init__(self, op, left, right):
        self.op = op
        self.left = left
        self.right = right

    def evaluate(self, env):
        return self.FUNCS[self.op](self.left.evaluate(env), self.right.evaluate(env)) % 1000003


class Assign(Node):
    __slots__ = ("name", "expr")

    def __init__(self, name, expr):
        self.name = name
        self.expr = expr

    def evaluate(self, env):
        value = self.expr.evaluate(env)
        env.store(self.name, value)
        return value


class Parser:
    def __init__(self, tokens):
        self.tokens = tokens
        self.index = 0

    @property
    def current(self):
        return self.tokens[self.index]

    def advance(self):
        tok = self.tokens[self.index]
        self.index += 1
        return tok

    def expect(self, kind, text=None):
        tok = self.advance()
        if not tok.matches(kind, text):
            raise SyntaxError(f"expected {text or kind} at {tok.pos}, got {tok.text!r}")
        return tok

    def program(self):
        stmts = []
        while not self.current.matches("eof"):
            stmts.append(self.statement())
            self.expect("op", ";")
        return stmts

    def statement(self):
        name = self.expect("name").text
        self.expect("op", "=")
        return Assign(name, self.expr())

    def expr(self):
        node = self.term()
        while self.current.is_op and self.current.text in "+-":
            node = BinOp(self.advance().text, node, self.term())
        return node

    def term(self):
        node = self.factor()
        while self.current.is_op and self.current.text in "*/%":
            node = BinOp(self.advance().text, node, self.factor())
        return node

    def factor(self):
        tok = self.advance()
        if tok.kind == "num":
            return Num(int(tok.text))
        if tok.kind == "name":
            return Var(tok.text)
        if tok.matches("op", "("):
            node = self.expr()
            self.expect("op", ")")
            return node
        raise SyntaxError(f"unexpected {tok.text!r} at {tok.pos}")


class Env:
    def __init__(self):
        self.values = {}
        self.reads = 0

    def lookup(self, name):
        self.reads += 1
        return self.values.get(name, 1)

    def store(self, name, value):
        self.values[name] = value


class Scheduler:
    """Runs statements in priority order (a heapq priority queue)."""

    def __init__(self):
        self.queue = []
        self.seq = 0

    def submit(self, priority, stmt):
        heapq.heappush(self.queue, (priority, self.seq, stmt))
        self.seq += 1

    def run(self, env):
        checksum = 0
        while self.queue:
            _, _, stmt = heapq.heappop(self.queue)
            checksum = (checksum * 31 + stmt.evaluate(env)) % 1000003
        return checksum


def make_source(n_stmts: int, seed: int = 1234) -> str:
    rng = random.Random(seed)
    names = [f"v{i}" for i in range(32)]

    def gen(depth):
        r = rng.random()
        if depth > 3 or r < 0.3:
            return str(rng.randint(0, 999)) if rng.random() < 0.5 else rng.choice(names)
        if r < 0.4:
            return f"({gen(depth + 1)})"
        return f"{gen(depth + 1)} {rng.choice('+-*/%')} {gen(depth + 1)}"

    return " ".join(f"{rng.choice(names)} = {gen(0)};" for _ in range(n_stmts))


def make_parser(n_stmts: int, reps: int):
    source = make_source(n_stmts)

    def run():
        checksum = 0
        for _ in range(reps):
            stmts = Parser(Lexer(source).tokens()).program()
            sched = Scheduler()
            for i, stmt in enumerate(stmts):
                sched.submit((i * 7919) % 97, stmt)
            checksum ^= sched.run(Env())
        return checksum

    return run, f"tokenize+parse+evaluate {n_stmts} statements ({len(source)} chars) x {reps}"


# -- (c) a NumPy loop of many small C calls.


def make_numpy(iters: int):
    rng = np.random.default_rng(0)
    arrays = [rng.random(8) for _ in range(16)]
    other = rng.random(8)
    out = np.empty(8)

    def run():
        total = 0.0
        for i in range(iters):
            a = arrays[i & 15]
            total += a.sum()
            np.add(a, other, out=out)
            np.multiply(out, 0.5, out=out)
            total += out[i & 7]
            total += len(out)
            total += float(np.maximum(a, other).max())
            b = a[2:6]
            total += b.shape[0] + int(np.argmin(b))
        return total

    return run, (
        f"{iters} iterations of sum/add/multiply/index/len/maximum/max/argmin on 8-element arrays"
    )


# ---------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------


def _rusage_delta(a, b) -> dict:
    return {
        "utime_s": round(b.ru_utime - a.ru_utime, 4),
        "stime_s": round(b.ru_stime - a.ru_stime, 4),
        "minflt": b.ru_minflt - a.ru_minflt,
    }


def _timed(fn, start, stop, info=None):
    """Run fn between start() and stop() with GC off; return (ns, stop_ns).

    When info is a dict, the same two spans in this thread's CPU time (cpu_ns,
    stop_cpu_ns) and getrusage deltas of the run and of stop() go into it."""
    gc.collect()
    gc.disable()
    try:
        start()
        try:
            r0 = getrusage(RUSAGE_SELF)
            t0 = perf_ns()
            c0 = cpu_ns()
            fn()
            c1 = cpu_ns()
            t1 = perf_ns()
            r1 = getrusage(RUSAGE_SELF)
        finally:
            s0 = perf_ns()
            sc0 = cpu_ns()
            stop()
            sc1 = cpu_ns()
            s1 = perf_ns()
            r2 = getrusage(RUSAGE_SELF)
    finally:
        gc.enable()
    if info is not None:
        info["cpu_ns"] = c1 - c0
        info["stop_cpu_ns"] = sc1 - sc0
        info["rusage"] = _rusage_delta(r0, r1)
        info["stop_rusage"] = _rusage_delta(r1, r2)
    return t1 - t0, s1 - s0


def _run(fn, start, stop) -> dict:
    info: dict = {}
    ns, stop_ns = _timed(fn, start, stop, info)
    return {"ns": ns, "stop_ns": stop_ns, **info}


class Mode:
    name = ""
    description = ""

    def run(self, fn) -> dict:
        raise NotImplementedError


class NoProfiler(Mode):
    name = "none"
    description = "no profiler"

    def run(self, fn):
        return _run(fn, lambda: None, lambda: None)


class FloorHook(Mode):
    name = "floor"
    description = "C hook: clock_gettime + one 16-byte store per event (PyEval_SetProfile)"

    def __init__(self, module):
        self.mod = module

    def run(self, fn):
        out = _run(fn, lambda: self.mod.install(1 << 20), self.mod.uninstall)
        out["events"] = int(self.mod.count())
        return out


class GpuprofActive(Mode):
    name = "gpuprof"
    description = "gpuprof recording (no schedule: ACTIVE)"

    def __init__(self, max_events):
        self.max_events = max_events

    def run(self, fn):
        prof = gpuprof.profile(
            activities=[gpuprof.ProfilerActivity.CPU], max_events=self.max_events
        )
        out = _run(fn, prof.__enter__, partial(prof.__exit__, None, None, None))
        threads = prof.results.threads()
        out["events"] = int(threads["events"].sum())
        out["dropped"] = int(threads["dropped"].sum())
        del prof, threads
        gc.collect()
        return out


class GpuprofWait(Mode):
    name = "gpuprof-wait"
    description = "gpuprof hook installed, schedule in WAIT (idle hook)"

    def run(self, fn):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # warmup=0 warns; irrelevant here
            sched = gpuprof.schedule(wait=10**9, warmup=0, active=1)
        prof = gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU], schedule=sched)
        return _run(fn, prof.__enter__, lambda: prof.__exit__(None, None, None))


class GpuprofSetprofile(GpuprofActive):
    """On 3.12+ the default backend is sys.monitoring; this measures the other one."""

    name = "gpuprof-setprofile"
    description = "gpuprof recording through PyEval_SetProfile (GPUPROF_HOOK=setprofile)"

    def run(self, fn):
        os.environ["GPUPROF_HOOK"] = "setprofile"
        try:
            return super().run(fn)
        finally:
            del os.environ["GPUPROF_HOOK"]


class CProfileMode(Mode):
    name = "cProfile"
    description = "cProfile.Profile (C, builtins=True)"

    def run(self, fn):
        prof = cProfile.Profile()
        return _run(fn, prof.enable, prof.disable)


class YappiMode(Mode):
    name = "yappi"
    description = "yappi, wall clock"

    def __init__(self, yappi):
        self.yappi = yappi

    def run(self, fn):
        y = self.yappi
        y.set_clock_type("wall")
        y.clear_stats()
        out = _run(fn, y.start, y.stop)
        y.clear_stats()
        return out


class VizTracerMode(Mode):
    name = "viztracer"
    description = "viztracer, default options, nothing saved"

    def __init__(self, cls):
        self.cls = cls

    def run(self, fn):
        tracer = self.cls(verbose=0)
        out = _run(fn, tracer.start, tracer.stop)
        tracer.clear()
        return out


class PyinstrumentMode(Mode):
    name = "pyinstrument"
    description = "pyinstrument (statistical, 1 ms interval)"

    def __init__(self, cls):
        self.cls = cls

    def run(self, fn):
        prof = self.cls(interval=0.001)
        return _run(fn, prof.start, prof.stop)


def optional_modes() -> list[Mode]:
    modes: list[Mode] = []
    try:
        import yappi

        modes.append(YappiMode(yappi))
    except Exception:
        pass
    try:
        from viztracer import VizTracer

        modes.append(VizTracerMode(VizTracer))
    except Exception:
        pass
    try:
        from pyinstrument import Profiler

        modes.append(PyinstrumentMode(Profiler))
    except Exception:
        pass
    return modes


# ---------------------------------------------------------------------------
# Building the floor hook
# ---------------------------------------------------------------------------


def _load(path: Path):
    spec = importlib.util.spec_from_file_location("floor_hook", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_floor(tmp: Path):
    """Compile benchmarks/floor_hook.c into tmp; return (module, how) or (None, why)."""
    src = tmp / "floor_hook.c"
    shutil.copy(HERE / "floor_hook.c", src)
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    errors = []
    # 1. setuptools' build_ext: the interpreter's own compiler and flags.
    try:
        from setuptools import Distribution, Extension

        ext = Extension("floor_hook", [str(src)], extra_compile_args=["-O2"])
        dist = Distribution({"name": "floor_hook", "ext_modules": [ext]})
        cmd = dist.get_command_obj("build_ext")
        cmd.build_lib = str(tmp / "lib")
        cmd.build_temp = str(tmp / "obj")
        cmd.ensure_finalized()
        with open(os.devnull, "w") as null:
            saved = os.dup(1), os.dup(2)
            os.dup2(null.fileno(), 1)
            os.dup2(null.fileno(), 2)
            try:
                cmd.run()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
        built = next((tmp / "lib").glob("floor_hook*" + suffix))
        return _load(built), "setuptools build_ext"
    except Exception as exc:  # noqa: BLE001 - any failure falls through to cc
        errors.append(f"setuptools: {exc!r}")
    # 2. plain cc with the interpreter's include dir.
    out = tmp / ("floor_hook" + suffix)
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    cmdline = [
        cc,
        "-O2",
        "-shared",
        "-fPIC",
        f"-I{sysconfig.get_paths()['include']}",
        str(src),
        "-o",
        str(out),
    ]
    try:
        proc = subprocess.run(cmdline, capture_output=True, text=True)
        if proc.returncode == 0:
            return _load(out), " ".join(cmdline)
        errors.append(f"cc: {proc.stderr.strip()[-500:]}")
    except Exception as exc:  # noqa: BLE001
        errors.append(f"cc: {exc!r}")
    return None, "; ".join(errors)


# ---------------------------------------------------------------------------
# Metadata
# ---------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def metadata(args) -> dict:
    return {
        **run_info("bench_python_hook"),
        "machine": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu_model": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "affinity_cpus": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else None,
        },
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "build": " ".join(platform.python_build()),
            "compiler": platform.python_compiler(),
        },
        "numpy": np.__version__,
        "gpuprof": getattr(gpuprof, "__version__", None),
        "quick": args.quick,
        "repeats": args.repeats,
    }


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


def sizes(quick: bool) -> dict:
    if quick:
        return {
            "fib": (20, 6),
            "parser": (150, 4),
            "numpy": 4000,
            "throughput": (27, 1),
            "throughput_repeats": 1,
        }
    return {
        "fib": (22, 150),
        "parser": (400, 25),
        "numpy": 40000,
        "throughput": (30, 2),
        "throughput_repeats": 3,
    }


def bench_workloads(workloads, modes, repeats) -> dict:
    results = {}
    for wname, (fn, desc) in workloads.items():
        fn()  # warm caches, intern nothing: no profiler is on
        runs = {m.name: [] for m in modes}
        t_start = time.perf_counter()
        for rep in range(repeats):
            k = rep % len(modes)
            for mode in modes[k:] + modes[:k]:  # rotate the order every repeat
                runs[mode.name].append(mode.run(fn))
        elapsed = time.perf_counter() - t_start
        per_mode = {}
        for name, rs in runs.items():
            ns = [r["ns"] for r in rs]
            total = [r["ns"] + r["stop_ns"] for r in rs]  # recording plus stop()
            cpu = [r["cpu_ns"] for r in rs]
            cpu_total = [r["cpu_ns"] + r["stop_cpu_ns"] for r in rs]
            entry = {
                "median_ns": int(statistics.median(ns)),
                "min_ns": min(ns),
                "median_total_ns": int(statistics.median(total)),
                "min_total_ns": min(total),
                "median_cpu_ns": int(statistics.median(cpu)),
                "median_total_cpu_ns": int(statistics.median(cpu_total)),
                "runs": rs,
            }
            if "events" in rs[0]:
                entry["events"] = rs[0]["events"]
            if "dropped" in rs[0]:
                entry["dropped"] = max(r["dropped"] for r in rs)
            entry["median_stime_s"] = statistics.median(r["rusage"]["stime_s"] for r in rs)
            entry["median_minflt"] = int(statistics.median(r["rusage"]["minflt"] for r in rs))
            if "stop_ns" in rs[0]:
                entry["median_stop_ns"] = int(statistics.median(r["stop_ns"] for r in rs))
            per_mode[name] = entry
        results[wname] = {
            "description": desc,
            "modes": per_mode,
            "wall_s": round(elapsed, 2),
            "derived": derive(per_mode),
        }
        print(f"  {wname}: done in {elapsed:.1f} s", file=sys.stderr, flush=True)
    return results


def derive(per_mode: dict) -> dict:
    """Ratios of the medians. Every ratio comes twice: for the recording alone
    ("median_ns") and for recording plus the stop call ("median_total_ns"), which
    is what a user timing the whole ``with`` block sees."""
    out: dict = {}
    for suffix, key in (
        ("", "median_ns"),
        ("_with_stop", "median_total_ns"),
        ("_min", "min_ns"),
        ("_with_stop_min", "min_total_ns"),
        ("_cpu", "median_cpu_ns"),
        ("_with_stop_cpu", "median_total_cpu_ns"),
    ):
        base = per_mode["none"][key]
        added = {n: m[key] - base for n, m in per_mode.items()}
        out["slowdown" + suffix] = {n: m[key] / base for n, m in per_mode.items()}
        out["added_ns" + suffix] = added
        if "floor" in per_mode and added["floor"] > 0:
            out["gpuprof_added_over_floor_added" + suffix] = added["gpuprof"] / added["floor"]
            out["gpuprof_wait_added_over_floor_added" + suffix] = (
                added["gpuprof-wait"] / added["floor"]
            )
            # What recording costs on top of an installed-but-idle hook: on CPython
            # 3.10/3.11 any profile hook switches the eval loop to its tracing dispatch,
            # which is most of the floor; this ratio isolates clock+store vs gpuprof.
            idle = per_mode["gpuprof-wait"][key]
            floor_rec = per_mode["floor"][key] - idle
            if floor_rec > 0:
                out["gpuprof_over_floor_above_idle_hook" + suffix] = (
                    per_mode["gpuprof"][key] - idle
                ) / floor_rec
        if "cProfile" in per_mode:
            out["gpuprof_over_cprofile" + suffix] = (
                per_mode["gpuprof"][key] / per_mode["cProfile"][key]
            )
            if added["cProfile"] > 0:
                out["gpuprof_added_over_cprofile_added" + suffix] = (
                    added["gpuprof"] / added["cProfile"]
                )
    per_event = {}
    for name in ("floor", "gpuprof"):
        ev = per_mode.get(name, {}).get("events")
        if ev:
            per_event[name] = out["added_ns"][name] / ev
    out["added_ns_per_event"] = per_event
    return out


def _proc_status_kib(field: str) -> int:
    """A ``kB`` field of /proc/self/status (VmRSS, VmHWM), or -1 where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return -1


def _reset_peak_rss() -> bool:
    """Reset the process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def bench_throughput(n: int, reps: int, repeats: int, max_events: int) -> dict:
    """prof.stop() on a window of >= 10 M events, repeated; then the key_averages()
    table of that window. Every run is a new session in this process, as a program
    that profiles several times would make them."""

    def work():
        for _ in range(reps):
            fib(n)

    runs = []
    for _ in range(repeats):
        prof = gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU], max_events=max_events)
        info: dict = {}
        record_ns, stop_ns = _timed(
            work, prof.__enter__, partial(prof.__exit__, None, None, None), info
        )
        threads = prof.results.threads()
        events = int(threads["events"].sum())
        t3 = perf_ns()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
        t4 = perf_ns()
        runs.append(
            {
                "record_ns": record_ns,
                "stop_ns": stop_ns,
                "events": events,
                **info,
                "dropped": int(threads["dropped"].sum()),
                "table_ns": t4 - t3,
                "table_lines": table.count("\n") + 1,
            }
        )
        del prof, threads, table
        gc.collect()
    stop = int(statistics.median(r["stop_ns"] for r in runs))
    events = runs[0]["events"]
    per_event = [r["stop_ns"] / r["events"] for r in runs if r["events"]]
    per_event_cpu = [r["stop_cpu_ns"] / r["events"] for r in runs if r["events"]]
    return {
        "workload": f"fib({n}) x {reps}",
        "max_events": max_events,
        "events": events,
        "dropped": max(r["dropped"] for r in runs),
        "event_bytes": int(_gpuprof._test_constants()["EVENT_BYTES"]),
        "median_stop_ns": stop,
        "stop_ns_per_event": stop / events if events else None,
        "stop_ns_per_event_runs": per_event,
        "stop_spread": max(per_event) / min(per_event) - 1 if per_event else None,
        "stop_cpu_ns_per_event_runs": per_event_cpu,
        "stop_cpu_spread": max(per_event_cpu) / min(per_event_cpu) - 1 if per_event_cpu else None,
        "median_record_ns": int(statistics.median(r["record_ns"] for r in runs)),
        "record_ns_per_event": statistics.median(r["record_ns"] for r in runs) / events
        if events
        else None,
        "median_stop_utime_s": statistics.median(r["stop_rusage"]["utime_s"] for r in runs),
        "median_stop_stime_s": statistics.median(r["stop_rusage"]["stime_s"] for r in runs),
        "median_stop_minflt": int(statistics.median(r["stop_rusage"]["minflt"] for r in runs)),
        "median_table_ns": int(statistics.median(r["table_ns"] for r in runs)),
        "runs": runs,
    }


def memory_probe(n: int, reps: int, max_events: int) -> dict:
    """Peak memory of one window in a fresh process (run by ``--memory-probe``):
    the peak RSS from just before start() to just after the key_averages() table,
    minus the RSS before start(), per recorded event. In a fresh process nothing
    of gpuprof's is there to reuse, so every byte the window needs is counted."""
    prof = gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU], max_events=max_events)
    fib(15)  # warm the workload's code
    gc.collect()
    gc.disable()
    can_reset = _reset_peak_rss()
    rss0 = _proc_status_kib("VmRSS")
    with prof:
        for _ in range(reps):
            fib(n)
    prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
    peak = _proc_status_kib("VmHWM")
    rss1 = _proc_status_kib("VmRSS")
    gc.enable()
    events = int(prof.results.threads()["events"].sum())
    return {
        "events": events,
        "rss_before_kib": rss0,
        "peak_kib": peak,
        "rss_after_kib": rss1,
        "peak_reset": can_reset,
        "peak_bytes_per_event": (peak - rss0) * 1024 / events if can_reset and events else None,
    }


def run_memory_probe(n: int, reps: int, max_events: int) -> dict | None:
    """memory_probe in a child process (this script with --memory-probe)."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--memory-probe",
        f"{n},{reps},{max_events}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"memory probe failed: {proc.stderr.strip()[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def report(
    meta: dict, floor_info: str, results: dict, throughput: dict | None, memory: dict | None = None
) -> str:
    lines = []
    m = meta["machine"]
    lines.append(
        f"bench_python_hook: Python {meta['python']['version']}, NumPy {meta['numpy']}, "
        f"{m['cpu_count']} CPUs ({m['cpu_model']}), commit "
        f"{(meta['git']['commit'] or 'unknown')[:12]}"
        f"{' (dirty)' if meta['git']['dirty'] else ''}, "
        f"median of {meta['repeats']} repeats"
    )
    lines.append(f"floor hook: {floor_info}")
    lines.append(
        "rec = the workload alone; +stop = the workload plus the profiler's stop call "
        "(gpuprof: closing the window and building its tables)"
    )
    for wname, res in results.items():
        d = res["derived"]
        lines.append("")
        lines.append(f"[{wname}] {res['description']}")
        lines.append(
            f"  {'mode':<19}{'rec ms':>9}{'min':>8}{'slowdown':>9}{'x floor':>8}"
            f"{'+stop ms':>10}{'min':>8}{'slowdown':>9}{'x floor':>8}{'events':>10}"
            f"{'ns/event':>9}{'sys ms':>7}{'faults':>7}"
        )
        floor_added = d["added_ns"].get("floor")
        floor_added_total = d["added_ns_with_stop"].get("floor")
        for name, mm in res["modes"].items():
            added = d["added_ns"][name]
            added_total = d["added_ns_with_stop"][name]
            xf = f"{added / floor_added:7.2f}x" if floor_added and name != "none" else f"{'':>8}"
            xft = (
                f"{added_total / floor_added_total:7.2f}x"
                if floor_added_total and name != "none"
                else f"{'':>8}"
            )
            ev = mm.get("events")
            npe = d["added_ns_per_event"].get(name)
            lines.append(
                f"  {name:<19}{mm['median_ns'] / 1e6:9.1f}{mm['min_ns'] / 1e6:8.1f}"
                f"{d['slowdown'][name]:8.2f}x{xf}"
                f"{mm['median_total_ns'] / 1e6:10.1f}{mm['min_total_ns'] / 1e6:8.1f}"
                f"{d['slowdown_with_stop'][name]:8.2f}x{xft}"
                f"{ev if ev else '':>10}{f'{npe:.1f}' if npe else '':>9}"
                f"{mm['median_stime_s'] * 1e3:7.0f}{mm['median_minflt']:7d}"
            )
        nan = float("nan")
        if "gpuprof_added_over_floor_added" in d:
            lines.append(
                "  gpuprof added / floor added: "
                f"{d['gpuprof_added_over_floor_added_with_stop']:.2f}x with stop() "
                f"({d.get('gpuprof_added_over_floor_added_with_stop_min', nan):.2f}x of the "
                f"minimums), {d['gpuprof_added_over_floor_added']:.2f}x recording only; above "
                "the idle hook (minus gpuprof-wait): "
                f"{d.get('gpuprof_over_floor_above_idle_hook_with_stop', nan):.2f}x, "
                f"{d.get('gpuprof_over_floor_above_idle_hook', nan):.2f}x"
            )
        if "gpuprof_over_cprofile" in d:
            lines.append(
                "  gpuprof / cProfile time: "
                f"{d['gpuprof_over_cprofile_with_stop']:.2f} with stop() "
                f"({d.get('gpuprof_over_cprofile_with_stop_min', nan):.2f} of the minimums), "
                f"{d['gpuprof_over_cprofile']:.2f} recording only; added time: "
                f"{d.get('gpuprof_added_over_cprofile_added_with_stop', nan):.2f}, "
                f"{d.get('gpuprof_added_over_cprofile_added', nan):.2f}"
            )
        if "gpuprof_added_over_floor_added_with_stop_cpu" in d:
            lines.append(
                "  the same in this thread's CPU time (other load on the machine does not "
                "count): gpuprof added / floor added "
                f"{d['gpuprof_added_over_floor_added_with_stop_cpu']:.2f}x with stop(), "
                f"{d['gpuprof_added_over_floor_added_cpu']:.2f}x recording only; gpuprof / "
                f"cProfile {d.get('gpuprof_over_cprofile_with_stop_cpu', nan):.2f} with stop()"
            )
        if res["modes"]["gpuprof"].get("dropped"):
            lines.append(f"  WARNING: gpuprof dropped {res['modes']['gpuprof']['dropped']} events")
    if throughput:
        t = throughput
        lines.append("")
        lines.append(f"[aggregation] gpuprof on {t['workload']}, max_events={t['max_events']:,}")
        lines.append(
            f"  events recorded {t['events']:,} ({t['event_bytes']} bytes each, "
            f"{t['events'] * t['event_bytes'] / 2**20:.0f} MiB), dropped {t['dropped']}"
        )
        lines.append(
            f"  recording {t['median_record_ns'] / 1e9:.2f} s "
            f"({t['record_ns_per_event']:.1f} ns/event incl. the workload)"
        )
        lines.append(
            f"  prof.stop() (aggregation) {t['median_stop_ns'] / 1e9:.3f} s = "
            f"{t['stop_ns_per_event']:.1f} ns/event "
            f"(user {t['median_stop_utime_s']:.2f} s, "
            f"sys {t['median_stop_stime_s']:.2f} s, "
            f"{t['median_stop_minflt']:,} minor faults)"
        )
        lines.append(
            "  stop() of each run: "
            + ", ".join(f"{r['stop_ns'] / 1e9:.3f} s" for r in t["runs"])
            + " = "
            + ", ".join(f"{x:.1f}" for x in t["stop_ns_per_event_runs"])
            + f" ns/event (largest / smallest - 1: {t['stop_spread'] * 100:.0f}%)"
        )
        lines.append(
            "  the same in this thread's CPU time: "
            + ", ".join(f"{x:.1f}" for x in t["stop_cpu_ns_per_event_runs"])
            + f" ns/event (largest / smallest - 1: {t['stop_cpu_spread'] * 100:.0f}%)"
        )
        lines.append(
            f"  key_averages().table() of that window: "
            f"{t['median_table_ns'] / 1e9:.3f} s (each run: "
            + ", ".join(f"{r['table_ns'] / 1e9:.3f} s" for r in t["runs"])
            + ")"
        )
    if memory:
        if memory.get("peak_bytes_per_event") is None:
            lines.append("  peak memory of one window: not measured (cannot reset the peak RSS)")
        else:
            lines.append(
                f"  peak memory of one window, fresh process: "
                f"{(memory['peak_kib'] - memory['rss_before_kib']) / 1024:.0f} MiB for "
                f"{memory['events']:,} events = "
                f"{memory['peak_bytes_per_event']:.1f} bytes/event "
                "(peak RSS from start() to the printed table, minus the RSS before)"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes and 2 repeats (smoke run)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats per mode (default 5)")
    ap.add_argument(
        "--json",
        default=str(HERE / "results" / "bench_python_hook.json"),
        help="where to write the JSON results",
    )
    ap.add_argument(
        "--workloads", default="fib,parser,numpy", help="comma-separated subset of fib,parser,numpy"
    )
    ap.add_argument("--no-throughput", action="store_true", help="skip the aggregation run")
    ap.add_argument("--memory-probe", metavar="N,REPS,MAX_EVENTS", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.memory_probe:  # internal: one window in this fresh process, JSON on stdout
        n, reps, max_ev = (int(x) for x in args.memory_probe.split(","))
        print(json.dumps(memory_probe(n, reps, max_ev)))
        return 0
    if args.repeats is None:
        args.repeats = 2 if args.quick else 5
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")

    if sys.getprofile() is not None:
        print("a profiler is already installed; run this script on its own", file=sys.stderr)
        return 2

    sz = sizes(args.quick)
    makers = {
        "fib": lambda: make_fib(*sz["fib"]),
        "parser": lambda: make_parser(*sz["parser"]),
        "numpy": lambda: make_numpy(sz["numpy"]),
    }
    wanted = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in makers]
    if unknown:
        ap.error(f"unknown workloads {unknown}; choose from {sorted(makers)}")
    workloads = {w: makers[w]() for w in wanted}

    meta = metadata(args)
    max_events = 30_000_000
    with tempfile.TemporaryDirectory(prefix="gpuprof-floor-") as tmp:
        floor_mod, floor_info = build_floor(Path(tmp))
        modes: list[Mode] = [NoProfiler()]
        if floor_mod is not None:
            modes.append(FloorHook(floor_mod))
        else:
            print(f"floor hook could not be built, skipping it: {floor_info}", file=sys.stderr)
            floor_info = f"SKIPPED (could not build: {floor_info})"
        modes += [GpuprofActive(max_events), GpuprofWait(), CProfileMode(), *optional_modes()]
        if hasattr(sys, "monitoring"):  # 3.12+: gpuprof defaults to sys.monitoring
            modes.append(GpuprofSetprofile(max_events))
        meta["modes"] = {m.name: m.description for m in modes}
        meta["workload_sizes"] = sz
        print(
            f"modes: {', '.join(m.name for m in modes)}; workloads: {', '.join(workloads)}",
            file=sys.stderr,
            flush=True,
        )
        results = bench_workloads(workloads, modes, args.repeats)

    throughput = memory = None
    if not args.no_throughput:
        n, reps = sz["throughput"]
        throughput = bench_throughput(n, reps, sz["throughput_repeats"], max_events)
        memory = run_memory_probe(n, reps, max_events)
        print("  aggregation: done", file=sys.stderr, flush=True)

    text = report(meta, floor_info, results, throughput, memory)
    print(text)
    out = {
        "meta": meta,
        "floor_build": floor_info,
        "workloads": results,
        "aggregation": throughput,
        "window_memory": memory,
        "report": text,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
