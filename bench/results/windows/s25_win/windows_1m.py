#!/usr/bin/env python3
"""Packed 1m windows: per trace, how many ran one or two micro-steps per rank against FewestMicroSteps
(ceil(tokens / (W x L_max))) and the slowest rank's excess over the mean. usage: windows_1m.py RANKS.csv 32768"""
import csv, sys, collections
# per window: tokens, micro-steps, fewest, T_b, per trace summary for target
path, target = sys.argv[1], int(sys.argv[2])
cap = 4096; W = 8
runs = collections.OrderedDict()
for r in csv.DictReader(open(path)):
    if int(r['window_tokens']) != target: continue
    runs.setdefault(r['trace'], collections.defaultdict(list))[int(r['step'])].append(r)
for trace, steps in runs.items():
    wins = []; cur = []
    for k in sorted(steps):
        rs = sorted(steps[k], key=lambda r: int(r['rank']))
        cur.append(rs)
        if rs[0]['closes_window'] == '1':
            wins.append(cur); cur = []
    if cur: wins.append(cur)
    hist = collections.Counter(); excess = collections.Counter(); tb = 0; tmean = 0
    for w in wins:
        tok = sum(int(r['real_tokens']) for st in w for r in st)
        ns = sum(int(r['samples']) for st in w for r in st)
        fewest = max(1, -(-tok // (W * cap)))
        m = len(w)
        hist[(fewest, m)] += 1
        sums = [sum(float(st[i]['cost']) for st in w) for i in range(W)]
        tb += max(sums); tmean += sum(sums) / W
        excess[(fewest, m)] += max(sums) - sum(sums)/W
    print(trace, 'windows', len(wins), 'T_b', round(tb), 'mean-rank', round(tmean), 'imb', round(tb / tmean, 4))
    for k in sorted(hist): print('   fewest %d ran %d: %d windows, imbalance excess %.0f' % (k[0], k[1], hist[k], excess[k]))
