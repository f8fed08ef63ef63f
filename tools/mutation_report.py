"""Print the mutation score per module and every surviving mutant's diff (after `mutmut run`).

Run from the repository root with the venv's python (``make mutation`` does). The score is
killed / total: mutants no selected test reaches ("no tests") count as not killed; timeouts
count as killed (the mutant hung the tests, which they noticed).
"""

from __future__ import annotations

from collections import Counter
import json
from pathlib import Path
import sys

from mutmut.configuration import config
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code

DETECTED = ('killed', 'timeout', 'caught by type check')


def load_results() -> dict[str, dict[str, str]]:
    """{source path: {mutant name: status}} for every file mutmut was told to mutate."""
    results = {}
    for path in sorted(config().only_mutate):
        meta = Path('mutants') / (path + '.meta')
        if not meta.is_file():
            sys.exit(f'no results for {path} ({meta} is missing): run `mutmut run` first')
        codes = json.loads(meta.read_text())['exit_code_by_key']
        results[path] = {name: status_by_exit_code[code] for name, code in codes.items()}
    return results


def main() -> int:
    results = load_results()
    rows, totals = [], Counter()
    for path, statuses in results.items():
        counts = Counter(statuses.values())
        killed = sum(counts[s] for s in DETECTED)
        totals.update(counts)
        rows.append((path, killed, len(statuses), counts))
    print('\nMutation score (killed / total; "no tests" and "not checked" count as not killed)')
    for path, killed, total, counts in rows:
        rest = ', '.join(f'{k} {v}' for k, v in sorted(counts.items()) if k not in DETECTED)
        print(f'  {path:45s} {killed:5d} / {total:5d} = {100 * killed / max(total, 1):5.1f} %'
              f'   {rest}')
    killed, total = sum(totals[s] for s in DETECTED), sum(totals.values())
    print(f'  {"overall":45s} {killed:5d} / {total:5d} = {100 * killed / max(total, 1):5.1f} %')
    print('\nSurviving mutants (and mutants no selected test reaches):')
    for path, statuses in results.items():
        for name, status in sorted(statuses.items()):
            if status not in DETECTED:
                diff = get_diff_for_mutant(name, path=path).splitlines()
                changed = [line for line in diff[2:] if line[:1] in '+-']
                print(f'\n{status}: {name}')
                print('\n'.join(f'    {line}' for line in changed))
    return 0


if __name__ == '__main__':
    sys.exit(main())
