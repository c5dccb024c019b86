#!/usr/bin/env python3
"""Cell by cell, two window_sim_table.py output dirs (win_*_w8*.csv): (b) / none, IDLE, the mean window over target,
issue 35 mark gained or lost. usage: compare_marks.py BEFORE_DIR AFTER_DIR [-v]  (-v: every cell; else changes > 0.003)"""
import csv,glob,sys
TG={'32768':'1m','131072':'4m','524288':'16m'}
def load(d):
    out={}
    for p in sorted(glob.glob(f'{d}/win_*_w8*.csv')):
        rows=list(csv.DictReader(open(p)))
        base={(r['trace'],r['policy']):r for r in rows if r['window_tokens']=='0'}
        for r in rows:
            if r['window_tokens']=='0': continue
            pk='packed' in r['policy']
            none=float(base[(r['trace'],r['policy'])]['of_bound' if pk else 'of_padded_bound'])
            b=float(r['of_bound_window' if pk else 'of_padded_bound_window'])
            idle=float(r['idle_share'])
            out[(r['model'],TG.get(r['window_tokens'],r['window_tokens']),'packed' if pk else 'padded',r['trace'])]=(b/none,idle,float(r['mean_window_over_target']),float(r['max_window_over_target']))
    return out
A=load(sys.argv[1]);B=load(sys.argv[2])
mark=lambda v: v[0]>=0.98 and v[1]<=0.05
na=sum(mark(v) for v in A.values()); nb=sum(mark(B[k]) for k in A if k in B)
print(f'marks {na} -> {nb} of {len(A)}')
up=dn=0; worst=(0,None)
for k in sorted(A):
    if k not in B: continue
    a,b=A[k],B[k]
    d=b[0]-a[0]
    up+=d>0.00005; dn+=d<-0.00005
    if d<worst[0]: worst=(d,k)
    flag=('GAIN' if mark(b) and not mark(a) else 'LOST' if mark(a) and not mark(b) else '')
    if flag or abs(d)>0.003 or '-v' in sys.argv:
        print(f'{"/".join(k):50s} {a[0]:.4f} ({a[1]*100:.1f}%) -> {b[0]:.4f} ({b[1]*100:.1f}%) mean {a[2]:.4f}->{b[2]:.4f} {flag}')
print('rose',up,'fell',dn,'worst',worst)
print('mean window over target: A %.4f-%.4f B %.4f-%.4f'%(min(v[2] for v in A.values()),max(v[2] for v in A.values()),min(v[2] for v in B.values()),max(v[2] for v in B.values())))
