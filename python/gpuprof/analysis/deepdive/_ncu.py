"""Nsight Compute as plan B: run a command under ``ncu`` and read the same
metrics from its CSV (see gpuprof.analysis.deepdive)."""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

from ._report import (
    METRICS,
    PRIVILEGES_FIX,
    DeepDiveReport,
    KernelDeepDive,
    _all_metric_names,
    _fields_from,
    _finish,
)

# -- Nsight Compute (plan B) -----------------------------------------------------------------

_UNIT_SCALE = {
    "nsecond": 1.0,
    "usecond": 1e3,
    "msecond": 1e6,
    "second": 1e9,
    "byte": 1.0,
    "kbyte": 1e3,
    "mbyte": 1e6,
    "gbyte": 1e9,
    "tbyte": 1e12,
    "kibyte": 1024.0,
    "mibyte": 1024.0**2,
    "gibyte": 1024.0**3,
}


def _number(text: str) -> float | None:
    t = text.strip().replace(",", "")
    if not t or t.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> list[dict]:
    """Rows of ``ncu --csv --page raw`` (wide: one row per launch, a units row
    under the header) or ``--page details`` (long: one row per metric). Each
    result: ``{"id": int, "kernel": str, "metrics": {name: value}}``, values in
    base units (ns, bytes, %) whatever scaling ncu printed.

    Raises:
        ValueError: no CSV header with "Kernel Name" in ``text``.
    """
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "ID" in r), None)
    if head is None:
        raise ValueError(
            "parse_ncu_csv(): no ncu CSV header (a row with 'ID' and 'Kernel "
            "Name') in the text; run ncu with --csv"
        )
    header = rows[head]
    col = {name: i for i, name in enumerate(header)}
    body = rows[head + 1 :]
    out: dict[int, dict] = {}
    if "Metric Name" in col:  # long form
        for r in body:
            if len(r) < len(header):
                continue
            v = _number(r[col["Metric Value"]])
            unit = r[col["Metric Unit"]].strip().lower() if "Metric Unit" in col else ""
            if v is not None:
                v *= _UNIT_SCALE.get(unit, 1.0)
            rid = int(_number(r[col["ID"]]) or 0)
            row = out.setdefault(rid, {"id": rid, "kernel": r[col["Kernel Name"]], "metrics": {}})
            row["metrics"][r[col["Metric Name"]]] = v
        return list(out.values())
    units = [""] * len(header)
    if body and not body[0][col["ID"]].strip():
        units = [u.strip().lower() for u in body[0]] + [""] * (len(header) - len(body[0]))
        body = body[1:]
    first_metric = next((i for i, n in enumerate(header) if "__" in n), len(header))
    for r in body:
        if len(r) < len(header) or not r[col["ID"]].strip():
            continue
        rid = int(_number(r[col["ID"]]) or 0)
        metrics = {}
        for i in range(first_metric, len(header)):
            v = _number(r[i])
            if v is not None:
                v *= _UNIT_SCALE.get(units[i], 1.0)
            metrics[header[i]] = v
        out[rid] = {"id": rid, "kernel": r[col["Kernel Name"]], "metrics": metrics}
    return [out[k] for k in sorted(out)]


def base_name(kernel: str) -> str:
    """The function name alone: no return type, namespaces, template
    arguments or parameters (what ncu calls the "function" name base)."""
    s = kernel.strip()
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):  # parameters: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    s = s[:cut]
    out, depth = [], 0
    for ch in s:  # drop template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    s = "".join(out).strip()
    s = s.split()[-1] if s.split() else s  # return type
    return s.rsplit("::", 1)[-1]


def match_ncu_rows(kernels: list[KernelDeepDive], rows: list[dict]) -> dict[str, list[dict]]:
    """ncu rows per top kernel: the exact name when ncu printed the same one,
    else the same function base name (then template instances share rows)."""
    by_exact: dict[str, list[dict]] = {}
    for r in rows:
        by_exact.setdefault(r["kernel"], []).append(r)
    out: dict[str, list[dict]] = {}
    for k in kernels:
        if k.name in by_exact:
            out[k.name] = by_exact[k.name]
            continue
        b = base_name(k.name)
        got = [r for r in rows if base_name(r["kernel"]) == b]
        if got:
            out[k.name] = got
    return out


def _ncu_known_metrics(exe: str, names: list[str]) -> list[str]:
    """``names`` less those ncu does not know for this GPU (an unknown metric
    makes ncu refuse the whole run); all of them when ncu cannot be asked."""
    try:
        q = subprocess.run([exe, "--query-metrics"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return names
    known = set(re.findall(r"^([a-z0-9]+__[A-Za-z0-9_]+)", q.stdout, re.M))
    return [n for n in names if n.split(".", 1)[0] in known] if known else names


def _run_ncu(
    report: DeepDiveReport, command: Sequence[str], ncu: str | None, timeout_s: float | None
) -> tuple[bool, str]:
    exe = ncu or shutil.which("ncu")
    if not exe:
        return False, (
            "ncu (Nsight Compute) is not on PATH: install it (CUDA toolkit or the "
            "nsight-compute package) or pass ncu='/path/to/ncu'"
        )
    names = _ncu_known_metrics(exe, _all_metric_names())
    bases = sorted({re.escape(base_name(k.name)) for k in report.kernels})
    with tempfile.TemporaryDirectory(prefix="gpuprof-ncu-") as tmp:
        rep = os.path.join(tmp, "deepdive")
        prof_cmd = [
            exe,
            "--clock-control",
            "none",
            "--target-processes",
            "all",
            "--metrics",
            ",".join(names),
            "--kernel-name-base",
            "function",
            "-k",
            "regex:" + "|".join(bases),
            "--launch-count",
            str(20 * len(bases)),
            "--export",
            rep,
            "--force-overwrite",
            *command,
        ]
        try:
            run = subprocess.run(prof_cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False, f"ncu did not finish within timeout_s={timeout_s} s"
        report.replays += 1
        log = (run.stdout or "") + (run.stderr or "")
        if "ERR_NVGPUCTRPERM" in log or "permission to access NVIDIA GPU Performance" in log:
            return False, PRIVILEGES_FIX
        if not os.path.exists(rep + ".ncu-rep"):
            tail = " | ".join(
                ln for ln in log.splitlines() if "==ERROR==" in ln or "==WARNING==" in ln
            )[-600:]
            return False, (
                f"ncu exited with status {run.returncode} and wrote no report"
                + (f": {tail}" if tail else "")
            )
        imp = subprocess.run(
            [exe, "--import", rep + ".ncu-rep", "--csv", "--page", "raw", "--print-units", "base"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    try:
        rows = parse_ncu_csv(imp.stdout)
    except ValueError as e:
        return False, f"could not read ncu's CSV ({e}); ncu said: {imp.stderr.strip()[:300]}"
    matched = match_ncu_rows(report.kernels, rows)
    chosen = {s.field: [m for m in s.candidates] for s in METRICS}
    per_kernel = {
        name: [_fields_from(r["metrics"], chosen) for r in rs] for name, rs in matched.items()
    }
    report.backend = "ncu"
    report.available = True
    if not matched:
        report.notes.append(
            "ncu profiled no launch of the top kernels (does command run the same work?)"
        )
    _finish(report, per_kernel)
    return True, ""
