#!/usr/bin/env python3
"""Cell by cell: window_sim_table.py rows of two runs (before, after). usage: compare.py BEFORE.txt AFTER.txt"""
import sys
def rows(p):
    out = {}
    for line in open(p):
        if not line.startswith('| 8 |'): continue
        f = [x.strip() for x in line.strip().strip('|').split('|')]
        out[(f[1], f[2], 'packed' if 'packed' in f[3] else 'padded', f[4].split()[0])] = f
    return out
b, a = rows(sys.argv[1]), rows(sys.argv[2])
print('| model | trace | mode | target | none | (a) before -> after | (b) before -> after | IDLE | micro-steps |')
print('|---|---|---|---|---|---|---|---|---|')
for k in sorted(b):
    x, y = b[k], a[k]
    print(f'| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {x[5]} | {x[6]} -> {y[6]} | {x[7]} -> {y[7]} | {x[11]} -> {y[11]} | {x[12].split()[0]} -> {y[12]} |')
