#!/usr/bin/env python3
"""Packed windows of one trace, window by window, from batching_sim --ranks-csv: what each costs under time model (b)
(the slowest rank's sum) against its ranks' mean, split by how many micro-steps it ran and by its real tokens against
W x L_max (one budget per rank). usage: windows_detail.py RANKS.csv TRACE TARGET [W L_max] [--list]"""
import collections, csv, sys

path, trace, target = sys.argv[1], sys.argv[2], sys.argv[3]
W = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] != '--list' else 8
cap = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[5] != '--list' else 4096
steps = collections.defaultdict(list)
for r in csv.DictReader(open(path)):
    if r['trace'] == trace and r['window_tokens'] == target and 'packed' in r['policy']:
        steps[int(r['step'])].append(r)
wins, cur = [], []
for k in sorted(steps):
    rs = sorted(steps[k], key=lambda r: int(r['rank']))
    cur.append(rs)
    if rs[0]['closes_window'] == '1':
        wins.append(cur)
        cur = []
if cur:
    wins.append(cur)
groups = collections.defaultdict(lambda: [0, 0.0, 0.0, 0])
rows = []
for i, w in enumerate(wins):
    tok = sum(int(r['real_tokens']) for st in w for r in st)
    ns = sum(int(r['samples']) for st in w for r in st)
    sums = [sum(float(st[j]['cost']) for st in w) for j in range(W)]
    tb, mean = max(sums), sum(sums) / W
    over = 'over' if tok > W * cap else 'under'
    g = groups[(len(w), over)]
    g[0] += 1; g[1] += tb; g[2] += tb - mean; g[3] += tok
    rows.append((i, len(w), tok, ns, tb, mean))
tot_tb = sum(r[4] for r in rows); tot_mean = sum(r[5] for r in rows)
print(f'{trace} {target}: windows {len(wins)}, micro-steps {sum(r[1] for r in rows)}, T_b {tot_tb:.3f}, '
      f'mean-rank {tot_mean:.3f}, excess {tot_tb - tot_mean:.3f}')
for (m, over), g in sorted(groups.items()):
    print(f'  ran {m}, tokens {over} W x L_max: {g[0]} windows, T_b {g[1]:.3f}, slowest-over-mean {g[2]:.3f}, '
          f'mean tokens {g[3] / g[0]:.0f}')
if '--list' in sys.argv:
    for i, m, tok, ns, tb, mean in rows:
        print(f'{i:4d} m={m} tokens={tok:6d} ({tok / (W * cap):.3f}) samples={ns:3d} T_b={tb:.4f} mean={mean:.4f} '
              f'excess={tb - mean:.4f}')
