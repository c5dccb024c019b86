#!/usr/bin/env python3
"""Per windowed run: micro-steps against sum over windows of ceil(window's real tokens / (W x the unwindowed
run's real tokens per rank-step)), the count at the unwindowed run's fill with whole micro-steps per window.
usage: ceil_est.py RANKS.csv"""
import csv, sys, collections, math
runs = collections.OrderedDict()
for row in csv.DictReader(open(sys.argv[1])):
    runs.setdefault((row['trace'], int(row['window_tokens'])), collections.defaultdict(list))[int(row['step'])].append(row)
fill = {}
print('| trace | target | micro-steps | at the unwindowed fill, whole micro-steps per window | windows | micro-steps per window (histogram) |')
print('|---|---|---|---|---|---|')
for (tr, wt), steps in runs.items():
    W = len(steps[0])
    if wt == 0:
        fill[tr] = sum(int(r['real_tokens']) for k in steps for r in steps[k]) / (len(steps) * W)
        continue
    est = 0; tok = 0; m = 0; hist = collections.Counter(); nw = 0
    for k in sorted(steps):
        rs = steps[k]; tok += sum(int(r['real_tokens']) for r in rs); m += 1
        if rs[0]['closes_window'] == '1':
            est += math.ceil(tok / (W * fill[tr]) - 1e-9); hist[m] += 1; nw += 1; tok = 0; m = 0
    print(f'| {tr} | {wt} | {len(steps)} | {est} | {nw} | {dict(sorted(hist.items()))} |')
