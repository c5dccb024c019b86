import csv, sys, collections, math
path = sys.argv[1]
runs = collections.OrderedDict()
for row in csv.DictReader(open(path)):
    if row['window_tokens'] == '0': continue
    runs.setdefault(row['trace'], collections.defaultdict(list))[int(row['step'])].append(row)
for trace, steps in runs.items():
    wins = []; cur = []
    for k in sorted(steps):
        cur.append(steps[k])
        if steps[k][0]['closes_window'] == '1':
            wins.append(cur); cur = []
    if cur: wins.append(cur)
    hist = collections.Counter(); slack = collections.Counter(); padfill = []
    for w in wins:
        m = len(w); W = len(w[0])
        real = sum(int(r['real_tokens']) for g in w for r in g)
        pad = sum(int(r['padded_tokens']) for g in w for r in g)
        lb = math.ceil(real / (W * 4096))
        lbp = math.ceil(pad / (W * 4096))
        hist[m] += 1; slack[(m - lb, m - lbp)] += 1
        padfill.append(pad / (W * 4096))
    print(trace, len(wins), 'steps/win', dict(sorted(hist.items())), 'm - ceil(real), m - ceil(pad):', dict(sorted(slack.items())),
          'mean budgets/rank (padded)', sum(padfill)/len(padfill))
