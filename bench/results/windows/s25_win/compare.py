#!/usr/bin/env python3
"""Cell by cell, before -> after: the windowed fraction of the bound over the unwindowed one under (b) (issue 35's
mark: >= 0.98 with IDLE <= 5%), (b) and (a) (fractions of the padded bound; any-layout for packed), IDLE, micro-steps.
usage: compare.py BEFORE_DIR AFTER_DIR  (each with win_default_tokens_w8.csv and win_gpu_7b_h100_w8.csv)"""
import csv, sys


def load(d):
    out = {}
    for m in ('default_tokens', 'gpu_7b_h100'):
        rows = list(csv.DictReader(open(f'{d}/win_{m}_w8.csv')))
        base = {(r['trace'], r['policy']): r for r in rows if r['window_tokens'] == '0'}
        for r in rows:
            if r['window_tokens'] == '0':
                continue
            packed = 'packed' in r['policy']
            none = float(base[(r['trace'], r['policy'])]['of_bound' if packed else 'of_padded_bound'])
            b = float(r['of_bound_window' if packed else 'of_padded_bound_window'])
            a = float(r['of_bound' if packed else 'of_padded_bound'])
            target = {'32768': '1m', '131072': '4m'}.get(r['window_tokens'], r['window_tokens'])
            out[(m, target, 'packed' if packed else 'padded', r['trace'])] = dict(
                ratio=b / none, b=b, a=a, none=none, idle=float(r['idle_share']), steps=int(r['steps']))
    return out


A, B = load(sys.argv[1]), load(sys.argv[2])
print('| model | target | mode | trace | no windows | (b) / none | (b) | (a) | IDLE | micro-steps | mark |')
print('|---|---|---|---|---|---|---|---|---|---|---|')
ok = lambda x: x['ratio'] >= 0.98 and x['idle'] <= 0.05
for k in sorted(B):
    a, b = A[k], B[k]
    print(f"| {' | '.join(k)} | {b['none']:.3f} | {a['ratio']:.4f} -> **{b['ratio']:.4f}** | {a['b']:.4f} -> {b['b']:.4f} | "
          f"{a['a']:.4f} -> {b['a']:.4f} | {a['idle']*100:.1f}% -> {b['idle']*100:.1f}% | {a['steps']} -> {b['steps']} | "
          f"{'yes' if ok(a) else 'no'} -> {'yes' if ok(b) else 'no'} |")
print()
print('| model | target | mode | traces within 2% (b), before -> after |')
print('|---|---|---|---|')
groups = sorted({k[:3] for k in B})
for g in groups:
    ka = [k for k in B if k[:3] == g]
    print(f"| {' | '.join(g)} | {sum(ok(A[k]) for k in ka)} -> {sum(ok(B[k]) for k in ka)} of {len(ka)} |")
