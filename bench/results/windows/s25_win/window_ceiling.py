#!/usr/bin/env python3
"""A per-window lower bound on T_b for packed windows as cut (gpu-shaped step model with floor m: cost = a +
max(m, b (p + k)) + c sum len^2), summed over windows: each window's slowest rank costs at least
  * one micro-step per rank (or ceil(tokens / (W L_max)) of them): n a + b (T_w / W + n k) + c Q_w / W
    (the mean over ranks; convexity; the floor m dropped), and
  * the cost of the window's longest sample alone in a micro-step, a + b (L + k) + c L^2, where L is known from
    rank-steps that hold one sample (a lower bound on the longest).
The most of the bound (any-layout) these windows allow is bound / sum; over the unwindowed fraction it is the
ceiling of issue 35's ratio for any layout of the same windows with equal counts.
usage: window_ceiling.py RANKS.csv RESULTS.csv a b c k W L_max target"""
import csv, sys, collections
ranks, results = sys.argv[1], sys.argv[2]
a, b, c, k = (float(x) for x in sys.argv[3:7])
W, Lmax, target = int(sys.argv[7]), int(sys.argv[8]), sys.argv[9]
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for r in csv.DictReader(open(ranks)):
    if r['window_tokens'] != target or 'packed' not in r['policy']:
        continue
    runs[r['trace']][int(r['step'])].append(r)
res = {}
for r in csv.DictReader(open(results)):
    if 'packed' in r['policy']:
        res[(r['trace'], r['window_tokens'])] = r
for trace, steps in runs.items():
    wins, cur = [], []
    for s in sorted(steps):
        cur.append(steps[s])
        if steps[s][0]['closes_window'] == '1':
            wins.append(cur)
            cur = []
    lb_sum, tb = 0.0, 0.0
    for w in wins:
        T = sum(int(x['real_tokens']) for st in w for x in st)
        Q = sum(float(x['sum_len_sq']) for st in w for x in st)
        n = max(1, -(-T // (W * Lmax)))
        L = max([int(x['real_tokens']) for st in w for x in st if int(x['samples']) == 1] or [0])
        mean_lb = n * a + b * (T / W + n * k) + c * Q / W
        long_lb = a + b * (L + k) + c * L * L if L else 0.0
        lb_sum += max(mean_lb, long_lb)
        tb += max(sum(float(st[i]['cost']) for st in w) for i in range(W))
    rw = res[(trace, target)]
    r0 = res[(trace, '0')]
    bound = float(rw['bound_seconds'])
    none = float(r0['of_bound'])
    print(f"{trace}: windows {len(wins)}, T_b {tb:.4f}, per-window bound {lb_sum:.4f}; (b) {bound / tb:.4f}, "
          f"ceiling {bound / lb_sum:.4f}; over the unwindowed {none:.4f}: {bound / tb / none:.4f}, ceiling {bound / lb_sum / none:.4f}")
