#!/usr/bin/env python3
"""Where a `make test` run's time went: the steps scripts/timed.sh logged (wall and CPU
seconds) and the disk space left, then the slowest tests and the suites (a test binary, or
a module of a package's integration binary) by their summed time, from nextest's JUnit file.
usage: test-times.py STEPS_TSV [JUNIT_XML]"""

import collections
import os
import sys
import xml.etree.ElementTree as ET

SLOWEST = 20


def steps(path):
    totals = collections.OrderedDict()
    try:
        with open(path) as log:
            for line in log:
                name, wall, cpu = line.rstrip("\n").split("\t")
                w, c = totals.get(name, (0.0, 0.0))
                totals[name] = (w + float(wall), c + float(cpu))
    except FileNotFoundError:
        return
    print("step              wall (min)   CPU (min)")
    for name, (wall, cpu) in totals.items():
        print(f"{name:<16} {wall / 60:10.1f} {cpu / 60:11.1f}")
    wall = sum(w for w, _ in totals.values())
    cpu = sum(c for _, c in totals.values())
    print(f"{'sum of steps':<16} {wall / 60:10.1f} {cpu / 60:11.1f}")
    try:
        with open(path + ".start") as start:
            # from --start to the end of the last step logged
            elapsed = os.path.getmtime(path) - int(start.read())
        print(f"{'the whole run':<16} {elapsed / 60:10.1f}   (steps run side by side)")
    except (FileNotFoundError, ValueError):
        pass


def disk(path):
    """The free bytes timed.sh sampled on the target's filesystem: first at the start."""
    try:
        with open(path) as samples:
            free = [int(line) for line in samples if line.strip().isdigit()]
    except FileNotFoundError:
        return
    if free:
        start, lowest, end = (f / 2**30 for f in (free[0], min(free), free[-1]))
        print(f"disk free (GiB): {start:.1f} at the start, {lowest:.1f} at the lowest, {end:.1f} at the end")


def tests(path):
    try:
        root = ET.parse(path).getroot()
    except (FileNotFoundError, ET.ParseError):
        return
    cases = []
    for suite in root.iter("testsuite"):
        for case in suite.iter("testcase"):
            cases.append((float(case.get("time", "0")), suite.get("name", "?"), case.get("name", "?")))
    if not cases:
        return
    cases.sort(reverse=True)
    print(f"\nthe {SLOWEST} slowest of {len(cases)} tests (s)")
    for time, suite, name in cases[:SLOWEST]:
        print(f"{time:8.1f}  {suite} {name}")
    # A package's integration tests are one binary whose modules are its suites
    # (tests/integration.rs): sum by binary and the test's first module.
    suites = collections.Counter()
    for time, suite, name in cases:
        suites[f"{suite} {name.split('::')[0]}" if "::" in name else suite] += time
    print(f"\nsuites by summed time (s; {sum(suites.values()) / 60:.1f} min in all)")
    for suite, time in suites.most_common(SLOWEST):
        print(f"{time:8.1f}  {suite}")


if __name__ == "__main__":
    steps(sys.argv[1])
    disk(sys.argv[1] + ".disk")
    if len(sys.argv) > 2:
        tests(sys.argv[2])
