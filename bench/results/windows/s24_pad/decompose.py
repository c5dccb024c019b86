#!/usr/bin/env python3
"""Splits a windowed run's time against the unwindowed one (batching_sim --ranks-csv).
T_b = sum over windows of the slowest rank's sum; T_a = sum over micro-steps of the slowest rank.
mean-rank time MR = sum of all rank-step costs / W.  T / T_none = (MR / MR_none) x (imb / imb_none),
imb = T / MR.  MR - MR_none = a (N - N_none)  [extra micro-steps]  + b (P - P_none) / W  [padding]
  + c (Q - Q_none)/W [len^2, 0 when c = 0].  usage: decompose.py RANKS.csv a b [c]"""
import csv, sys, collections
path, a, b = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
c = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
runs = collections.OrderedDict()
for row in csv.DictReader(open(path)):
    key = (row['trace'], row['policy'], int(row['window_tokens']))
    runs.setdefault(key, collections.defaultdict(list))[int(row['step'])].append(row)
def stats(steps):
    W = len(next(iter(steps.values())))
    N = len(steps); tot = 0.0; pad = 0; real = 0; idle = 0; Ta = 0.0; Tb = 0.0
    acc = [0.0] * W
    for k in sorted(steps):
        rs = sorted(steps[k], key=lambda r: int(r['rank']))
        cs = [float(r['cost']) for r in rs]
        tot += sum(cs); Ta += max(cs)
        for r, x in zip(rs, cs):
            if int(r['samples']) > 0: pad += int(r['padded_tokens'])
            else: idle += 1
            real += int(r['real_tokens'])
        for i, x in enumerate(cs): acc[i] += x
        if rs[0]['closes_window'] == '1' or True and int(rs[0]['closes_window']) == 1:
            Tb += max(acc); acc = [0.0] * W
    if any(acc): Tb += max(acc)
    return dict(W=W, N=N, MR=tot / W, pad=pad, real=real, idle=idle, Ta=Ta, Tb=Tb)
base = {}
for key, steps in runs.items():
    if key[2] == 0: base[key[:2]] = stats(steps)
print('| trace | target | N / N0 | pad/real (win / none) | MR/MR0 | of which: steps, padding, rest | imb (b) win / none | imb (a) win / none | T_b/T0 | T_a/T0 |')
print('|---|---|---|---|---|---|---|---|---|---|')
for key, steps in runs.items():
    if key[2] == 0: continue
    s, s0 = stats(steps), base[key[:2]]
    dsteps = a * (s['N'] - s0['N']) / s0['MR']
    dpad = b * (s['pad'] - s0['pad']) / s['W'] / s0['MR']
    mr = s['MR'] / s0['MR']
    rest = mr - 1 - dsteps - dpad
    print(f"| {key[0]} | {key[2]} | {s['N']} / {s0['N']} | {s['pad']/s['real']:.4f} / {s0['pad']/s0['real']:.4f} | {mr:.4f} | "
          f"+{dsteps:.4f}, +{dpad:.4f}, {rest:+.4f} | {s['Tb']/s['MR']:.4f} / {s0['Tb']/s0['MR']:.4f} | "
          f"{s['Ta']/s['MR']:.4f} / {s0['Ta']/s0['MR']:.4f} | {s['Tb']/s0['Tb']:.4f} | {s['Ta']/s0['Ta']:.4f} |")
