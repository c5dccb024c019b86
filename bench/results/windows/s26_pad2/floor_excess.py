import csv, sys, collections
a,b,c,k,mfl = 0.01036, 1.368e-05, 3.976e-10, 528, 0.01929
path=sys.argv[1]
agg=collections.defaultdict(lambda: [0.0,0.0,0,0,0.0])
for r in csv.DictReader(open(path)):
    key=(r['trace'], r['window_tokens'])
    cost=float(r['cost']); n=int(r['samples']); p=int(r['padded_tokens'])
    g=agg[key]; g[0]+=cost
    if n>0:
        lin=a+b*(p+k)+c*float(r['sum_len_sq'])
        g[1]+=cost-lin; g[2]+=1
        if b*(p+k)<mfl: g[3]+=1
    else: g[4]+=cost
for key,g in sorted(agg.items()):
    print(key, 'total %.3f floor_excess %.4f (%.2f%%) busy %d light(<floor) %d idle_cost %.3f'%(g[0],g[1],100*g[1]/g[0],g[2],g[3],g[4]))
