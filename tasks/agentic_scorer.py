"""The agentic example's scorer: run the repository's tests in the sample's sandbox.

An ordinary Inspect scorer that calls `sandbox()`. In gradebook's scoring stage it runs in a
fresh container into which the workspace the agent left is restored (workspaces.restore), so
it re-scores from the log with no model call. `gradebook demo --agentic` copies this file and
widens `TEST_COMMAND` to the whole suite, to show a re-score.
"""

from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer, stderr
from inspect_ai.solver import TaskState
from inspect_ai.util import sandbox

# the tests the scorer runs, in the repository's directory (-B: no bytecode files)
TEST_COMMAND = ["python3", "-B", "-m", "unittest", "test_calc.AddTests"]


@scorer(metrics=[accuracy(), stderr()])
def repo_tests():
    async def score(state: TaskState, target: Target) -> Score:
        result = await sandbox().exec(TEST_COMMAND, cwd="repo", timeout=60)
        lines = (result.stderr or result.stdout).strip().splitlines()
        last = lines[-1] if lines else "no output"
        return Score(
            value=CORRECT if result.success else INCORRECT,
            answer=last,
            explanation=f"`{' '.join(TEST_COMMAND)}` exited {result.returncode}: {last}",
        )

    return score
