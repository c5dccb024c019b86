#!/usr/bin/env python3
"""Which ingredient of the equal-counts ceiling binds (1m cells of four models): the ceiling / none with (A) + (C)
only, with (B) pigeonhole added, and the column as committed ((B') makespan too). The first two come from a
throwaway build of batching_sim with env switches in EqualCountsWindowBound (ODB_NO_B: no (B) / (B'); ODB_NO_MS: no
(B')), not committed; run as the matrix in README.md with --models attention_heavy,cpu_calibrated,gpu_70b_h200,
gpu_7b_h100 --targets 1m and --out /tmp/ceil_abl/ODB_NO_B (ODB_NO_MS) under that env variable set."""
import csv,glob,os
def load(d):
    out={}
    for p in glob.glob(d+'/win_*.csv'):
        rows=list(csv.DictReader(open(p)))
        base={(r['trace'],r['policy']):r for r in rows if r['window_tokens']=='0'}
        for r in rows:
            if r['window_tokens']!='32768': continue
            packed='packed' in r['policy']
            none=float(base[(r['trace'],r['policy'])]['of_bound' if packed else 'of_padded_bound'])
            bound=float(r['bound_seconds' if packed else 'padded_bound_seconds'])
            out[(r['model'],'1m','packed' if packed else 'padded',r['trace'])]=bound/float(r['uneq_equal_counts_bound_seconds'])/none
    return out
full=load('bench/results/windows/s26_ceil/after'); a=load('/tmp/ceil_abl/ODB_NO_B'); b=load('/tmp/ceil_abl/ODB_NO_MS')
print('| model | target | mode | trace | (A)+(C) only | + (B) pigeonhole | + (B\') makespan (the column) |')
print('|---|---|---|---|---|---|---|')
for k in sorted(a):
    print(f"| {' | '.join(k)} | {a[k]:.4f} | {b[k]:.4f} | {full[k]:.4f} |")
