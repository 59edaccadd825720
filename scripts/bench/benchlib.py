"""What the Python helpers of scripts/bench share. A helper in a sub-folder imports it with
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import benchlib  # noqa: E402
"""
import argparse
import collections
import glob
import json
import os
import statistics
import sys


def cell(values, fmt):
    """The median of values, then [min, max], each printed with fmt ("%.1f")."""
    return ("%s [%s, %s]" % (fmt, fmt, fmt)) % (statistics.median(values), min(values), max(values))


def group_jsonl(path, key):
    """The records of a JSON-lines file as lists, grouped by key(record)."""
    groups = collections.defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        groups[key(r)].append(r)
    return groups


def median_of(records, field):
    return statistics.median(r[field] for r in records)


def source_photos(folder):
    """The *.jpg in folder, sorted; exits saying where to get them when there are none."""
    sources = sorted(glob.glob(os.path.join(folder, "*.jpg")))
    if not sources:
        sys.exit("no *.jpg in %s (Debian: apt-get install opencv-doc)" % folder)
    return sources


def photo_commands(doc, dest):
    """The command line of a photo helper: subcommands (their name in args.<dest>), the first
    of them "make --src DIR --out DIR". Returns the parser, its subparsers and make's parser."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest=dest, required=True)
    make = sub.add_parser("make")
    make.add_argument("--src", required=True)
    make.add_argument("--out", required=True)
    return ap, sub, make
