import csv, sys, collections
# usage: steps_share.py RANKS.csv a b k : share of T_b/T0 - 1 from the windowed run's extra micro-steps (a + b k each, every rank)
path=sys.argv[1]; a,b,k=map(float,sys.argv[2:5])
runs=collections.OrderedDict()
for r in csv.DictReader(open(path)):
    runs.setdefault((r['trace'],int(r['window_tokens'])),collections.defaultdict(list))[int(r['step'])].append(r)
def st(steps):
    W=len(next(iter(steps.values()))); N=len(steps); tot=0; Tb=0; acc=[0.0]*W; pad=0
    for s in sorted(steps):
        rs=sorted(steps[s],key=lambda r:int(r['rank']))
        for i,r in enumerate(rs): acc[i]+=float(r['cost']); tot+=float(r['cost']); pad+=int(r['padded_tokens'])
        if rs[0]['closes_window']=='1': Tb+=max(acc); acc=[0.0]*W
    if any(acc): Tb+=max(acc)
    return dict(W=W,N=N,tot=tot,Tb=Tb,pad=pad)
base={t:st(s) for (t,w),s in runs.items() if w==0}
print('| trace | N / N0 | padded budgets a window-rank | T_b / T0 | extra micro-steps x (a + b k) over T0 | T_b / T0 without them |')
print('|---|---|---|---|---|---|')
for (t,w),s in runs.items():
    if w==0: continue
    x=st(s); x0=base[t]
    extra=(x['N']-x0['N'])*(a+b*k)*x['W']/x0['W']  # per rank
    share=extra/x0['Tb']
    print('| %s | %d / %d | %.3f | %.4f | +%.4f | %.4f |'%(t,x['N'],x0['N'],x['pad']/(4096*x['W']*sum(1 for q in s.values() if q[0]['closes_window']=='1')),x['Tb']/x0['Tb'],share,x['Tb']/x0['Tb']-share))
