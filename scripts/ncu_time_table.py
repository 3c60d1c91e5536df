#!/usr/bin/env python3
"""Per-kernel GPU time from `ncu --csv --metrics gpu__time_duration.sum` (stdin or a file):
kernel, instances, mean us, total ms, share of the total; the 25 largest, then the sum."""
import collections
import csv
import sys

src = open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin
rows = list(csv.DictReader(l for l in src if l.startswith('"')))
agg = collections.defaultdict(list)
for r in rows:
    if r.get("Metric Name") == "gpu__time_duration.sum":
        v = float(r["Metric Value"].replace(",", ""))
        v *= {"usecond": 1e3, "msecond": 1e6}.get(r.get("Metric Unit", "nsecond"), 1)
        agg[r["Kernel Name"][:56]].append(v)
tot = sum(sum(v) for v in agg.values()) or 1.0
print(f"{'kernel':56s} {'n':>6s} {'mean us':>9s} {'total ms':>9s} {'share':>6s}")
for k, v in sorted(agg.items(), key=lambda kv: -sum(kv[1]))[:25]:
    print(f"{k:56s} {len(v):6d} {sum(v)/len(v)/1e3:9.2f} {sum(v)/1e6:9.3f} {100*sum(v)/tot:5.1f}%")
print(f"{'all':56s} {sum(len(v) for v in agg.values()):6d} {'':9s} {tot/1e6:9.3f}")
