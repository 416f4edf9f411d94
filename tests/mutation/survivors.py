"""Write ``tests/mutation/SURVIVORS.md`` from the last ``mutmut run``: every surviving mutant with
its diff, sorted into the reason it survives.

    mutmut run --max-children 2 && python -m tests.mutation.survivors

Reasons, decided from the diff alone (the rule that matched is named in the file):

- ``equivalent: zip strict`` -- ``zip(..., strict=True)`` made lenient: the zipped sequences have
  equal lengths by construction, so only the assertion that would catch a bug elsewhere is lost;
- ``cosmetic: message text`` -- only the words of a log line, reason string or error message
  changed, and the test does not pin that text;
- ``equivalent: unused default`` -- the default of ``dict.get``/``pop``/``setdefault`` changed on
  a path where the key is always present;
- ``measurement`` -- a timing figure reported for humans (``decision_us``);
- ``open`` -- none of the above: a behaviour no test pins yet. These are the list to work on.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).with_name("SURVIVORS.md")
MUTMUT = [sys.executable, "-m", "mutmut"]


def _diff(name: str) -> list[str]:
    shown = subprocess.run([*MUTMUT, "show", name], capture_output=True, text=True).stdout
    return [line for line in shown.splitlines() if line[:2] in ("- ", "+ ")]


def _strip_strings(line: str) -> str:
    return re.sub(r"(['\"]).*?\1", '""', line[2:])


def reason(diff: list[str]) -> str:
    removed = [d for d in diff if d.startswith("- ")]
    added = [d for d in diff if d.startswith("+ ")]
    text = "\n".join(diff)
    if "zip(" in text and "strict" in text:
        return "equivalent: zip strict"
    if "decision_us" in text:
        return "measurement"
    same_code = [_strip_strings(r) for r in removed] == [_strip_strings(a) for a in added]
    if removed and len(removed) == len(added) and same_code:
        return "cosmetic: message text"
    if re.search(r"\.(get|pop|setdefault)\(", text):
        before = [re.sub(r", ?(\{\}|None|\[\])?\)", ")", r[2:]) for r in removed]
        after = [re.sub(r", ?(\{\}|None|\[\])?\)", ")", a[2:]) for a in added]
        if before == after:
            return "equivalent: unused default"
    return "open"


# Survivors judged equivalent by reading them (the diff alone cannot tell).
EQUIVALENT = {
    "schemas.validate.x_is_subject_token__mutmut_3": "the pattern needs one character anyway",
    "router.kv.routing.x_pick__mutmut_9": "exp(-(c + best)/T) scales every weight by the same "
    "exp(-2 best/T): the normalised softmax is unchanged",
    **{
        f"workers.engines.mocker.sequence.xǁSequenceǁreset_for_recompute__mutmut_{i}": (
            "a preempted sequence is used again only after `Scheduler._admit`, which assigns "
            "status, num_computed, block_ids and num_committed anew"
        )
        for i in range(1, 7)
    },
    **{
        f"router.kv.index.xǁInMemoryPrefixIndexǁrelease__mutmut_{i}": (
            "a reservation exists only after `route` created its worker's load entry, and no "
            "entry is ever deleted: the default is never used"
        )
        for i in (8, 10, 11, 12)
    },
    "router.kv.index.xǁInMemoryPrefixIndexǁapply__mutmut_3": "`applied=None` is as falsy as "
    "False, and every caller tests truthiness",
    "planner.core.x__damp__mutmut_22": "`plan` sets start_ts_s before damping, so last_change "
    "is never None here",
    "planner.core.x__correct__mutmut_35": "an observed latency of 0 reaches "
    "`OnlineCorrection.update`, which ignores non-positive input",
    "planner.rules.x_throughput_target__mutmut_41": "when required == current both branches "
    "return the same replicas and reasons",
}


def main() -> int:
    results = subprocess.run([*MUTMUT, "results"], capture_output=True, text=True).stdout
    survived = sorted(
        line.split(":")[0].strip() for line in results.splitlines() if line.endswith("survived")
    )
    by_reason: dict[str, list[tuple[str, list[str]]]] = defaultdict(list)
    for name in survived:
        diff = _diff(name)
        why = f"equivalent: {EQUIVALENT[name]}" if name in EQUIVALENT else reason(diff)
        by_reason[why].append((name, diff))
    lines = [
        "# Surviving mutants",
        "",
        "Written by `python -m tests.mutation.survivors` after `mutmut run` (see its docstring for",
        "the reasons). Counts: "
        + ", ".join(f"{r} {len(v)}" for r, v in sorted(by_reason.items()))
        + f"; {len(survived)} in all.",
        "",
    ]
    for r in sorted(by_reason):
        lines += [f"## {r} ({len(by_reason[r])})", ""]
        for name, diff in by_reason[r]:
            lines += [f"- `{name}`", "", "  ```diff", *(f"  {d}" for d in diff), "  ```", ""]
    OUT.write_text("\n".join(lines))
    print(f"{len(survived)} survivors -> {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
