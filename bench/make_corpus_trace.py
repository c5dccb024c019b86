#!/usr/bin/python3
"""Writes a length trace measured from a real text corpus installed on Debian.

Corpus: the package documentation under /usr/share/doc (files named
copyright, changelog*, NEWS*, README*, HISTORY*, CHANGES*, AUTHORS*, gzipped or
not) plus /usr/share/common-licenses/*. One sample = one document (file);
"token" = one whitespace-separated word of the decoded text (UTF-8, errors
replaced). Lengths are written unclipped; the simulator truncates to L_max
and reports how many it truncated. Files are visited in sorted path order,
so the trace depends only on the installed packages.

    /usr/bin/python3 bench/make_corpus_trace.py bench/traces/debian_docs.txt
"""
import glob
import gzip
import os
import sys

PREFIXES = ("copyright", "changelog", "NEWS", "README", "HISTORY", "CHANGES", "AUTHORS")


def documents():
    paths = sorted(glob.glob("/usr/share/common-licenses/*"))
    paths += sorted(p for p in glob.glob("/usr/share/doc/**/*", recursive=True)
                    if os.path.basename(p).startswith(PREFIXES))
    for path in paths:
        if os.path.isdir(path) or os.path.islink(path):
            continue
        try:
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rb") as f:
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        words = len(text.split())
        if words > 0:
            yield path, words


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "bench/traces/debian_docs.txt"
    n = 0
    with open(out, "w") as f:
        f.write("# debian_docs: one sample per documentation file of the installed Debian packages\n")
        f.write("# (/usr/share/doc copyright/changelog/NEWS/README/..., /usr/share/common-licenses);\n")
        f.write("# token = whitespace-separated word. Made by: /usr/bin/python3 bench/make_corpus_trace.py\n")
        for _, words in documents():
            f.write(f"{words}\n")
            n += 1
    print(f"wrote {n} documents to {out}")


if __name__ == "__main__":
    main()
