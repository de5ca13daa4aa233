#!/usr/bin/env python3
# bench/heap_by_instruction.py: a step's memory by program instruction, for checking a footprint
# (footprint.h) against what the code allocates. Joins bench/heap_sampler.c's lines with a
# `--trace` file: for each instruction of each rank, tcmalloc's bytes in use at its first sample,
# the most in use while it ran (the sampler's exact peak column), and the most RSS and page-heap
# free bytes seen. Non-obvious: "at start" is the first sample after the instruction began, so
# it may already hold the instruction's first tensor; compare steady blocks (a middle one of
# several layers), not block 0 against the last.
# Usage: LT_HEAP_SAMPLE=/tmp/h LT_HEAP_SAMPLE_MS=1 LD_PRELOAD=build/heap_sampler.so \
#          build/longtrain train CFG --trace /tmp/t.json ...
#        python3 bench/heap_by_instruction.py /tmp/t.json /tmp/h.rank0 [/tmp/h.rank1 ...]
# (one rank without RANK writes /tmp/h.pid<pid>; its events are the trace's pid 0).
import json
import re
import sys

MiB = 2**20
trace = json.load(open(sys.argv[1]))
events = trace["traceEvents"] if isinstance(trace, dict) else trace
events = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "program"), key=lambda e: e["ts"])
for path in sys.argv[2:]:
    m = re.search(r"\.rank(\d+)$", path)
    pid = int(m.group(1)) if m else 0
    rows = []
    for line in open(path):
        f = line.split()
        if len(f) < 8:
            continue  # a sampler without the peak column
        rows.append((float(f[0]), int(f[1]), int(f[2]), (int(f[5]) + int(f[6])) * 1024, int(f[7])))
    print(f"== {path}: {len(rows)} samples, RSS max {max(r[3] for r in rows) / MiB:.1f} MiB, "
          f"in use max {max(r[4] for r in rows) / MiB:.1f} MiB")
    print(f"{'instruction':<28} {'in use at start':>15} {'peak in use':>11} {'RSS max':>8} {'free max':>8}  seconds")
    for e in events:
        if e.get("pid", 0) != pid:
            continue
        t0, t1 = e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6
        inside = [r for r in rows if t0 <= r[0] <= t1]
        if not inside:
            continue  # shorter than a sampling period
        print(f"{e['name'][:28]:<28} {inside[0][1] / MiB:>15.1f} {max(r[4] for r in inside) / MiB:>11.1f} "
              f"{max(r[3] for r in inside) / MiB:>8.1f} {max(r[2] for r in inside) / MiB:>8.1f}  {e['dur'] / 1e6:.3f}")
