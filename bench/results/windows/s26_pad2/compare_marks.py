import sys
sys.path.insert(0, 'bench/results/windows/s26_all')
import marks
A = marks.load([sys.argv[1]]); B = marks.load([sys.argv[2]])
ok = lambda x: x['ratio'] >= 0.98 and x['idle'] <= 0.05
print('| model | target | mode | trace | (b) / none | IDLE | micro-steps | mark |')
print('|---|---|---|---|---|---|---|---|')
same = 0
for k in sorted(A):
    a, b = A[k], B[k]
    if (a['ratio'], a['idle'], a['steps']) == (b['ratio'], b['idle'], b['steps']):
        same += 1; continue
    m = lambda x: 'yes' if ok(x) else 'no'
    print(f"| {' | '.join(k)} | {a['ratio']:.4f} -> {b['ratio']:.4f} | {a['idle']*100:.1f}% -> {b['idle']*100:.1f}% | {a['steps']} -> {b['steps']} | {m(a)} -> {m(b)} |")
print(f"\n{same} of {len(A)} cells identical ((b) / none, IDLE, micro-steps); marks {sum(ok(x) for x in A.values())} -> {sum(ok(x) for x in B.values())}")
