#!/usr/bin/env python3
"""Sums `ncu --csv --print-summary per-kernel --metrics gpu__time_duration.sum` by kernel
name: each kernel's invocations, total and mean time, and share of the whole, largest first.
Usage: ncu_summary.py FILE.csv"""
import csv
import sys

rows = []
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    unit = r.get("Metric Unit", "nsecond")
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(unit, 1e-3)
    n = int(r["Invocations"])
    avg = float(r["Average"].replace(",", "")) * scale
    rows.append((n * avg, n, avg, r["Kernel Name"][:110]))
total = sum(r[0] for r in rows) or 1.0
rows.sort(reverse=True)
print(f"total {total / 1e3:.1f} ms over {sum(r[1] for r in rows)} launches")
print(f"{'share':>6} {'total ms':>9} {'calls':>6} {'mean us':>9}  kernel")
for t, n, avg, name in rows:
    print(f"{100 * t / total:5.1f}% {t / 1e3:9.2f} {n:6} {avg:9.1f}  {name}")
