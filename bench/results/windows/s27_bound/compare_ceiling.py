#!/usr/bin/env python3
"""The equal-counts ceiling before and after (session 27, helper "bound"): usage compare_ceiling.py BEFORE_DIR AFTER_DIR.
Checks that the two directories' CSVs differ only in the column uneq_equal_counts_bound_seconds (and that it never
falls), then prints marks.py's classes of both and every cell whose equal-counts ceiling / none moved, largest first."""
import csv
import glob
import importlib.util
import os
import sys

spec = importlib.util.spec_from_file_location(
    'marks', os.path.join(os.path.dirname(__file__), '..', 's26_all', 'marks.py'))
marks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(marks)
COL = 'uneq_equal_counts_bound_seconds'
before_dir, after_dir = sys.argv[1], sys.argv[2]
rows_checked = 0
for path in sorted(glob.glob(f'{before_dir}/win_*_w8*.csv')):
    b = list(csv.DictReader(open(path)))
    a = list(csv.DictReader(open(os.path.join(after_dir, os.path.basename(path)))))
    assert len(a) == len(b), path
    for rb, ra in zip(b, a):
        assert rb.keys() == ra.keys(), path
        for key in rb:
            if key != COL:
                assert rb[key] == ra[key], (path, key, rb[key], ra[key])
        if rb.get(COL):
            assert float(ra[COL]) >= float(rb[COL]) * (1 - 1e-12), (path, rb[COL], ra[COL])
        rows_checked += 1
print(f'{rows_checked} CSV rows: identical but for {COL}, which never falls')


def klass(c):
    if c['ratio'] >= 0.98 and c['idle'] <= 0.05:
        return 'mark'
    if c['ceiling'] is not None and c['ceiling'] < 0.98:
        return 'out of reach'
    if c['equal'] is not None and c['equal'] < 0.98:
        return 'out of reach, equal counts'
    return 'could and does not'


before, after = marks.load([before_dir]), marks.load([after_dir])
for name, cells in (('before', before), ('after', after)):
    counts = {}
    for c in cells.values():
        counts[klass(c)] = counts.get(klass(c), 0) + 1
    print(f"{name}: {len(cells)} cells: " + ', '.join(f'{counts.get(k, 0)} {k}' for k in
                                                       ('mark', 'out of reach', 'out of reach, equal counts',
                                                        'could and does not')))
moved = sorted(((before[k]['equal'] - after[k]['equal'], k) for k in before
                if abs(before[k]['equal'] - after[k]['equal']) > 5e-5), reverse=True)
print(f'\ncells whose equal-counts ceiling / none moved by more than 0.00005: {len(moved)} of {len(before)}\n')
print('| model | target | mode | trace | (b) / none | ceiling / none, equal counts: s26 | s27 | change | class s26 | s27 |')
print('|---|---|---|---|---|---|---|---|---|---|')
for d, k in moved:
    b, a = before[k], after[k]
    print(f"| {' | '.join(k)} | {a['ratio']:.4f} | {b['equal']:.4f} | {a['equal']:.4f} | {-d:+.4f} "
          f"| {klass(b)} | {klass(a)} |")
