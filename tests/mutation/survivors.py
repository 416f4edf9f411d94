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
- ``equivalent: ...`` / ``not executed: ...`` -- read by hand, the reason written next to it;
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
    "workers.engines.mocker.scheduler.xǁSchedulerǁabort__mutmut_13": "the aborted sequence is "
    "already out of every list: its status is never read again",
    "workers.engines.mocker.scheduler.xǁSchedulerǁ_finish_rejected__mutmut_2": "the rejected "
    "sequence is deleted right after: its status is never read again",
    "workers.engines.mocker.sequence.xǁSequenceǁappend_output__mutmut_2": "only the length and "
    "emptiness of `output` are read (the tokens themselves go out in the step's outputs)",
    "workers.engines.mocker.scheduler.xǁSchedulerǁ_admit__mutmut_4": "a pool without caching "
    "registers no hashes, so its `match_prefix` is empty anyway",
    "workers.engines.mocker.scheduler.xǁSchedulerǁ_execute__mutmut_3": "`sampled`/`finished` are "
    "only tested for truth; None is as false as False",
    "workers.engines.mocker.block_pool.xǁBlockPoolǁfree__mutmut_7": "`_free` is an ordered set: "
    "its values are never read",
    "workers.engines.mocker.block_pool.xǁBlockPoolǁallocate__mutmut_6": "`last=None` is as "
    "false as `last=False`",
    "workers.engines.mocker.block_pool.xǁBlockPoolǁfree__mutmut_10": "`last=None` is as false "
    "as `last=False`",
    "workers.engines.mocker.scheduler.xǁSchedulerǁ_never_fits__mutmut_3": "for an integer n, "
    "ceil(x) > n exactly when x > n",
    **{
        f"workers.engines.mocker.scheduler.xǁSchedulerǁ_execute__mutmut_{i}": (
            "calls `_commit` more often; it returns at once when no new block is full "
            "(performance only)"
        )
        for i in (15, 16)
    },
    **{
        f"workers.engines.mocker.scheduler.xǁSchedulerǁ_commit__mutmut_{i}": (
            "the guard is repeated where it acts (`BlockPool.commit` returns on no blocks or no "
            "caching; hashing more blocks than sliced is only slower)"
        )
        for i in (4, 5, 9, 11)
    },
    "workers.engines.mocker.scheduler.xǁSchedulerǁ__init____mutmut_10": "the pool's own caching "
    "flag is never consulted while the scheduler's (`_caching`) guards every commit and match",
    **{
        f"workers.engines.mocker.sequence.xǁSequenceǁhashes_upto__mutmut_{i}": (
            "hashes a block or more than asked; every caller slices what it needs "
            "(performance only)"
        )
        for i in (3, 7)
    },
    **{
        f"workers.engines.mocker.scheduler.xǁSchedulerǁ_schedule_running__mutmut_{i}": (
            "`_reserve` is then asked for 0 new blocks and grants it (performance only)"
        )
        for i in (23, 24)
    },
    "workers.engines.mocker.sequence.xǁSequenceǁblocks_needed__mutmut_11": "only called when "
    "at least one block is missing, so the max with 1 never applies",
    "workers.engines.mocker.scheduler.xǁSchedulerǁ_execute__mutmut_19": "a prefill chunk that "
    "is not the last one took the whole remaining budget, so nothing is scheduled after it",
    "workers.engines.mocker.scheduler.xǁSchedulerǁ_schedule_running__mutmut_32": "after a "
    "self-preemption `step` never reads the returned budget (`preempted` is non-empty)",
    "workers.engines.mocker.scheduler.xǁSchedulerǁ_schedule_waiting__mutmut_16": "the break is "
    "the last statement: returning there is the same",
    "workers.engines.mocker.scheduler.xǁSchedulerǁ_schedule_waiting__mutmut_4": "with a budget of "
    "0 `_admit` gets a chunk of 0 and the loop breaks",
    "workers.engines.mocker.scheduler.xǁSchedulerǁ_schedule_running__mutmut_6": "with a budget of "
    "0 every remaining sequence gets a chunk of 0 and is skipped",
    "workers.engines.mocker.scheduler.xǁSchedulerǁ_schedule_running__mutmut_20": "a running "
    "sequence always has a token to compute and a chunk of it fits any positive budget (without "
    "chunking, a running one only decodes), so the n == 0 branch is never taken",
}


# Mutants no selected test runs (mutmut's "no tests"), read by hand.
UNTESTED = {
    "router.kv.index.xǁPrefixIndexǁrelease__mutmut_1": "the `PrefixIndex` Protocol's signature: "
    "a default in a Protocol declaration is never executed",
}


def main() -> int:
    results = subprocess.run([*MUTMUT, "results"], capture_output=True, text=True).stdout
    survived = sorted(
        line.split(":")[0].strip()
        for line in results.splitlines()
        if line.endswith("survived") or line.endswith("no tests")
    )
    by_reason: dict[str, list[tuple[str, list[str]]]] = defaultdict(list)
    for name in survived:
        diff = _diff(name)
        if name in UNTESTED:
            why = f"not executed: {UNTESTED[name]}"
        elif name in EQUIVALENT:
            why = f"equivalent: {EQUIVALENT[name]}"
        else:
            why = reason(diff)
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
