"""Cell-by-cell comparison of two window matrices (marks.py's cells): usage compare_marks.py BEFORE_DIR AFTER_DIR.
Prints the mark counts of each and every cell whose (b) / none, IDLE or mark differs, worst change first."""
import importlib.util
import os
import sys

spec = importlib.util.spec_from_file_location(
    'marks', os.path.join(os.path.dirname(__file__), '..', 's26_all', 'marks.py'))
marks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(marks)
before, after = marks.load([sys.argv[1]]), marks.load([sys.argv[2]])
ok = lambda x: x['ratio'] >= 0.98 and x['idle'] <= 0.05
print(f'before: {sum(map(ok, before.values()))} of {len(before)} have the mark; '
      f'after: {sum(map(ok, after.values()))} of {len(after)}')
rows = []
for k in sorted(before):
    b, a = before[k], after.get(k)
    if a is None:
        continue
    d = a['ratio'] - b['ratio']
    if abs(d) > 5e-5 or abs(a['idle'] - b['idle']) > 5e-4 or ok(a) != ok(b):
        rows.append((d, k, b, a))
rows.sort(key=lambda r: r[0])
print(f'worse by more than 0.001: {sum(1 for r in rows if r[0] < -0.001)}; marks lost: '
      f'{sum(1 for r in rows if ok(r[2]) and not ok(r[3]))}; gained: {sum(1 for r in rows if ok(r[3]) and not ok(r[2]))}')
print('\n| model | target | mode | trace | (b) / none before | after | change | IDLE before | after | mark |')
print('|---|---|---|---|---|---|---|---|---|---|')
for d, k, b, a in rows:
    mark = {(True, True): 'yes', (False, False): 'no', (True, False): '**lost**', (False, True): '**gained**'}[(ok(b), ok(a))]
    print(f"| {' | '.join(k)} | {b['ratio']:.4f} | {a['ratio']:.4f} | {d:+.4f} | {100 * b['idle']:.1f}% "
          f"| {100 * a['idle']:.1f}% | {mark} |")
