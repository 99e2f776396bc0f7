"""The own-image variant's scorer: the repository's checker, a tool only the task's image has.

`gradebook demo --agentic --own-image` runs the agentic example in its own image (gradebook's
sandbox image plus `repo-check`, tasks/data/agentic_image/) and scores it with this scorer,
which calls that tool: in gradebook's image it would find no `repo-check`. The workspace is
restored into the task's image at scoring (the one recorded, or one rebuilt from the recipe in
the workspace store). The demo copies this file and widens `CHECK_COMMAND` to the whole suite.
"""

from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer, stderr
from inspect_ai.solver import TaskState
from inspect_ai.util import sandbox

# the image's checker and the tests it runs, in the repository's directory
CHECK_COMMAND = ["repo-check", "test_calc.AddTests"]


@scorer(metrics=[accuracy(), stderr()])
def repo_check():
    async def score(state: TaskState, target: Target) -> Score:
        result = await sandbox().exec(CHECK_COMMAND, cwd="repo", timeout=60)
        lines = (result.stdout or result.stderr).strip().splitlines()
        last = lines[-1] if lines else "no output"
        return Score(
            value=CORRECT if result.success else INCORRECT,
            answer=last,
            explanation=f"`{' '.join(CHECK_COMMAND)}` exited {result.returncode}: {last}",
        )

    return score
