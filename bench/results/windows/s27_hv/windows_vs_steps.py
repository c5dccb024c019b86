#!/usr/bin/env python3
"""Per-window time against the equal-counts bound and against the unwindowed run's steps (session 27, helper hv).
usage: windows_vs_steps.py DUMP.jsonl RANKS.csv TRACE a b c [cut ...]
DUMP.jsonl: ODB_HV_DUMP of a batching_sim --unequal-microsteps run with probe_hooks.patch applied (one line per window
of the windowed odb run: T = its time (b), E = its equal-counts bound, n = micro-steps, layout = tokens per rank and
micro-step); RANKS.csv: --ranks-csv of the same run (window_tokens 0 = the unwindowed steps); a b c: the step model
(cost = a + b tokens + c sum len^2, packed, k = m = 0). The windows are compared with the unwindowed steps of the same
index in ranges split at the given cuts (the two runs plan the same steps until their rounds diverge)."""
import collections, csv, json, sys

dump, ranks, trace, a, b, c = sys.argv[1], sys.argv[2], sys.argv[3], *map(float, sys.argv[4:7])
cuts = [int(x) for x in sys.argv[7:]]
ws = [json.loads(l) for l in open(dump)]
rows = [r for r in csv.DictReader(open(ranks)) if r['trace'] == trace and r['window_tokens'] == '0']
st = collections.defaultdict(list)
for r in rows:
    st[int(r['step'])].append(r)
none = [st[k] for k in sorted(st)]
rc = lambda rank: sum(a + sum(b * l + c * l * l for l in s) for s in rank)
T = sum(w['T'] for w in ws); E = sum(w['E'] for w in ws)
print(f"windows {len(ws)}: T {T:.2f} s, equal-counts bound {E:.2f} s (T / E {T / E:.4f}); unwindowed steps {len(none)}: "
      f"{sum(max(float(x['cost']) for x in s) for s in none):.2f} s")
print('micro-steps per window:', dict(collections.Counter(w['n'] for w in ws)),
      '; T - E by micro-steps:', {n: round(sum(w['T'] - w['E'] for w in ws if w['n'] == n), 2) for n in sorted({w['n'] for w in ws})})
print()
print('| windows | unwindowed steps: time | mean rank | time / mean | windows: time | bound E | mean rank | time / mean | E / mean |')
print('|---|---|---|---|---|---|---|---|---|')
edges = [0] + cuts + [len(ws)]
for lo, hi in zip(edges, edges[1:]):
    tn = sum(max(float(x['cost']) for x in s) for s in none[lo:hi])
    mn = sum(sum(float(x['cost']) for x in s) / len(s) for s in none[lo:hi])
    tw = sum(w['T'] for w in ws[lo:hi]); ew = sum(w['E'] for w in ws[lo:hi])
    mw = sum(sum(rc(r) for r in w['layout']) / len(w['layout']) for w in ws[lo:hi])
    print(f"| [{lo}, {hi}) | {tn:.2f} | {mn:.2f} | {tn / mn:.4f} | {tw:.2f} | {ew:.2f} | {mw:.2f} | {tw / mw:.4f} | {ew / mw:.4f} |")
print()
print('windows, tokens / micro-steps / (T / E - 1) in %:')
print(' '.join(f"{i}:{sum(l for r in w['layout'] for s in r for l in s)}/{w['n']}/{(w['T'] / w['E'] - 1) * 100:.1f}"
               for i, w in enumerate(ws)))
