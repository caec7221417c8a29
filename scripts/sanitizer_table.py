"""The tool x op table of compute-sanitizer runs over the CUDA tests: for each tool and op, the tests
run and passed and the errors (racecheck: hazards) the tool reported while they ran.

    python scripts/sanitizer_table.py OUTDIR/sanitizer_memcheck*.log ... [--markdown FILE]
    python scripts/sanitizer_table.py LOGS... --finished TOOL   # the ids of the tests TOOL has finished

Each log is one tool's run (or one shard of it: SANITIZER_SHARD=k/n) of `pytest -v` under
`compute-sanitizer --tool TOOL`, named sanitizer_TOOL[...].log as scripts/gpu_check.sh writes them.
A report is counted against the test whose result line follows it, so the runs must be serial (no
pytest-xdist workers, whose output interleaves). A test that several logs of one tool ran (a chunk run
again) counts once: failed if any run failed, with the reports of every run. A test's op is the op name
its id carries (the registry's tests are parametrized by op) or, failing that, the op its file tests
(FILE_OPS); tests of every op at once count under "all ops". The schemas' names come from registration/schemas.cpp.
"""
import argparse
import collections
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT = re.compile(r"^(tests/\S+::\S+)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
# pytest-xdist's -v lines: counted, with reports only roughly attributed (the workers interleave).
WORKER_RESULT = re.compile(r"^\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (tests/\S+::\S+)")
SUMMARY = re.compile(r"^========= (ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|COMPUTE-SANITIZER)")
REPORT = re.compile(r"^========= \S")  # the first line of one report; its details are indented


def op_names(schemas=os.path.join(ROOT, "registration", "schemas.cpp")):
    """The forward ops' names, longest first (so silu_mul_linear wins over silu_mul)."""
    names = set(re.findall(r'm\.def\("(\w+)\(', open(schemas).read()))
    forward = {name for name in names if not name.endswith(("_backward", "_backward_masked"))}
    return sorted(forward, key=len, reverse=True)


# Files of one op whose test ids need not name it.
FILE_OPS = {"tests/test_rotary.py": "rotary_embedding", "tests/test_linear_cross_entropy.py": "linear_cross_entropy",
            "tests/test_linear_log_probs.py": "linear_log_probs",
            "tests/test_gated_mul.py": "gated_mul"}


def op_of(test_id, ops):
    for op in ops:
        if re.search(rf"(?<![a-z]){op}(?![a-z])", test_id):
            return op
    return FILE_OPS.get(test_id.split("::")[0], "all ops")


def tool_of(path):
    match = re.match(r"sanitizer_([a-z]+)", os.path.basename(path))
    if not match:
        raise SystemExit(f"{path}: expected a log named sanitizer_TOOL[...].log")
    return match.group(1)


def parse(path):
    """[(test id, outcome, reports)] of one log in order, the reports after its last result, and the
    tool's own error total."""
    results = []
    pending = 0
    total = 0
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        summary = SUMMARY.match(line)
        if summary:
            found = re.search(r"(\d+) (error|hazard)", line)
            total += int(found.group(1)) if found else 0
            continue
        if REPORT.match(line):
            pending += 1
            continue
        result = RESULT.match(line)
        worker_result = WORKER_RESULT.match(line)
        if result or worker_result:
            test_id, outcome = result.groups() if result else reversed(worker_result.groups())
            results.append((test_id, outcome, pending))
            pending = 0
    return results, pending, total


def finished_tests(paths, tool):
    """The ids of the tests with a result in the logs of `tool` (a run cut short lists what it reached)."""
    return {test_id for path in paths if tool_of(path) == tool for test_id, _, _ in parse(path)[0]}


def table(paths, ops):
    runs = collections.defaultdict(dict)  # tool -> test id -> Counter(failed, passed, reports)
    teardown = collections.Counter()
    totals = collections.Counter()
    for path in paths:
        tool = tool_of(path)
        results, after_last, total = parse(path)
        totals[tool] += total
        teardown[tool] += after_last  # reported after the last result: the run's, not a test's
        for test_id, outcome, reports in results:
            run = runs[tool].setdefault(test_id, collections.Counter())
            run["failed"] += outcome in ("FAILED", "ERROR", "XPASS")
            run["passed"] += outcome in ("PASSED", "XFAIL")
            run["reports"] += reports
    by_tool = collections.defaultdict(lambda: collections.defaultdict(collections.Counter))
    for tool in totals:
        for test_id, run in runs[tool].items():
            counts = by_tool[tool][op_of(test_id, ops)]
            counts["tests"] += 1
            counts["failed"] += run["failed"] > 0
            counts["passed"] += run["failed"] == 0 and run["passed"] > 0
            counts["reports"] += run["reports"]
        if teardown[tool]:
            by_tool[tool]["all ops"]["reports"] += teardown[tool]
    lines = ["| tool | op | tests run | passed | failed | reports |", "| --- | --- | --- | --- | --- | --- |"]
    for tool in sorted(by_tool):
        for op in sorted(by_tool[tool], key=lambda name: (name == "all ops", name)):
            c = by_tool[tool][op]
            lines.append(f"| {tool} | {op} | {c['tests']} | {c['passed']} | {c['failed']} | {c['reports']} |")
    return lines, by_tool, totals


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--finished", metavar="TOOL", help="print the ids of the tests TOOL finished, one a line")
    args = parser.parse_args()
    if args.finished:
        print("\n".join(sorted(finished_tests(args.logs, args.finished))))
        return
    lines, by_tool, totals = table(args.logs, op_names())
    print("\n".join(lines))
    clean = True
    for tool, rows in by_tool.items():
        reports = sum(c["reports"] for c in rows.values())
        failed = sum(c["failed"] for c in rows.values())
        print(f"{tool}: {sum(c['tests'] for c in rows.values())} tests, {failed} failed, {reports} reports "
              f"(the tool's summary: {totals[tool]})")
        clean = clean and reports == 0 and failed == 0 and totals[tool] == 0
    if args.markdown:
        with open(args.markdown, "w") as file:
            file.write("\n".join(lines) + "\n")
    sys.exit(0 if clean else 1)


if __name__ == "__main__":
    main()
