"""Family ``git``: committing, branching, tagging, reverting, merging and searching history.

The setup builds each repository with fixed author, committer and dates, so a seed always gives the
same commit hashes. Checks read the repository with git itself (history, file contents, refs).
"""

from __future__ import annotations

import random

from rl_llm.envs.terminal.families.common import WHERE, WORDS, Draft, q, text_lines, write_file_cmd
from rl_llm.envs.terminal.workspace_checker import FIXED_EPOCH

REPO = "repo"
VERBS = ("Add", "Update", "Fix", "Refactor", "Document", "Tune", "Rename", "Clean up")


class RepoBuilder:
    """Accumulates the setup script of a repository and tracks what each commit contains."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.lines = [f"git init -q -b main {REPO}", f"git -C {REPO} config user.name Dev",
                      f"git -C {REPO} config user.email dev@example.com"]
        self.tree: dict[str, str] = {}
        self.subjects: list[str] = []  # newest first, on the current branch
        self.used: list[str] = []  # every subject so far, on any branch
        self.clock = 0

    def subject(self, topic: str) -> str:
        while True:
            text = f"{self.rng.choice(VERBS)} {topic} {self.rng.choice(WORDS)} {self.rng.choice(WORDS)}"
            if all(text not in s and s not in text for s in self.used):
                self.used.append(text)
                return text

    def write(self, path: str, content: str) -> None:
        self.tree[path] = content
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        if parent:
            self.lines.append(f"mkdir -p {q(f'{REPO}/{parent}')}")
        self.lines.append(f"printf '%s' {q(content)} > {q(f'{REPO}/{path}')}")

    def commit(self, subject: str, changes: dict[str, str]) -> None:
        for path, content in changes.items():
            self.write(path, content)
        self.clock += 1
        stamp = f"@{FIXED_EPOCH + 3600 * self.clock} +0000"
        self.lines.append(f"git -C {REPO} add -A")
        self.lines.append(f"GIT_AUTHOR_DATE={q(stamp)} GIT_COMMITTER_DATE={q(stamp)} git -C {REPO} commit -q -m {q(subject)}")
        self.subjects.insert(0, subject)

    def history(self, count: int) -> None:
        """``count`` commits touching a few project files."""
        files = ["README.md", "src/main.py", "src/util.py", "docs/guide.md", "config/app.conf"]
        for _ in range(count):
            # The first two commits create README.md and src/main.py, so every repo tracks two files or more.
            path = files[self.clock] if self.clock < 2 else self.rng.choice(files)
            old = self.tree.get(path, "")
            self.commit(self.subject(path.rsplit("/", 1)[-1]), {path: old + text_lines(self.rng, self.rng.randint(1, 3))})

    def script(self) -> str:
        return "\n".join(self.lines) + "\n"

    def draft(self, description: str, checks: list[dict], solution: list[str]) -> Draft:
        """The task: this repository as the whole initial workspace."""
        return Draft(description=f"{description} {WHERE}", files={}, setup=self.script(), checks=checks, solution=solution)


def _git(*args: str) -> str:
    return f"git -C {REPO} " + " ".join(args)


def commit_file(rng: random.Random, difficulty: int) -> Draft:
    repo = RepoBuilder(rng)
    repo.history(2 + difficulty)
    history = list(repo.subjects)
    new_file = f"src/{rng.choice(WORDS)}_{rng.choice(WORDS)}.py"
    new_content = f"def {rng.choice(WORDS)}():\n    return {rng.randint(1, 99)}\n"
    repo.write(new_file, new_content)
    repo.write("notes.tmp", text_lines(rng, 2))
    message = repo.subject(new_file.rsplit("/", 1)[-1])
    wanted = [f"the new file `{new_file}`"]
    checks: list[dict] = [
        {"kind": "git_subjects", "repo": REPO, "rev": "HEAD", "equals": [message, *history]},
        {"kind": "git_file", "repo": REPO, "rev": "HEAD", "path": new_file, "content": new_content},
        {"kind": "git_file", "repo": REPO, "rev": "HEAD", "path": "notes.tmp", "content": None},
    ]
    paths = [new_file]
    tracked = sorted(repo.tree.keys() - {new_file, "notes.tmp"})
    if difficulty >= 2:
        changed = tracked[0]
        repo.write(changed, repo.tree[changed] + "# reviewed\n")
        wanted.append(f"the change to `{changed}`")
        paths.append(changed)
        checks.append({"kind": "git_file", "repo": REPO, "rev": "HEAD", "path": changed, "content": repo.tree[changed]})
    avoid = ""
    if difficulty >= 3:
        draft_path = tracked[-1]
        before = repo.tree[draft_path]
        repo.write(draft_path, before + "WIP do not commit\n")
        avoid = f" Leave the unfinished edit in `{draft_path}` uncommitted (but keep it in the working tree)."
        checks += [
            {"kind": "git_file", "repo": REPO, "rev": "HEAD", "path": draft_path, "content": before},
            {"kind": "file_text", "path": f"{REPO}/{draft_path}", "expected": repo.tree[draft_path], "mode": "exact"},
        ]
    return repo.draft(
        (
            f"In the git repository `{REPO}/` (branch `main`), commit {' and '.join(wanted)} as one new commit "
            f"with the message `{message}`. Do not commit `notes.tmp`.{avoid} Do not rewrite existing "
            f"history."
        ),
        checks,
        [_git("add", "--", *map(q, paths)) + " && " + _git("commit -q -m", q(message))],
    )


def feature_branch(rng: random.Random, difficulty: int) -> Draft:
    repo = RepoBuilder(rng)
    repo.history(2 + difficulty)
    history = list(repo.subjects)
    branch = f"feature/{rng.choice(WORDS)}-{rng.randint(1, 99)}"
    path = rng.choice(sorted(repo.tree))
    content = repo.tree[path] + f"{rng.choice(WORDS)} = {rng.randint(1, 999)}\n"
    message = repo.subject(branch.split("/")[1])
    checks: list[dict] = [
        {"kind": "git_subjects", "repo": REPO, "rev": branch, "equals": [message, *history]},
        {"kind": "git_file", "repo": REPO, "rev": branch, "path": path, "content": content},
        {"kind": "git_subjects", "repo": REPO, "rev": "main", "equals": history},
    ]
    solution = [_git("checkout -q -b", q(branch)), write_file_cmd(f"{REPO}/{path}", content),
                _git("commit -q -am", q(message))]
    back = ""
    if difficulty >= 2:
        back = " Finally, switch the working tree back to `main`."
        checks.append({"kind": "git_branch", "repo": REPO, "branch": "main"})
        solution.append(_git("checkout -q main"))
    return repo.draft(
        (
            f"In the git repository `{REPO}/`, create a branch `{branch}` from `main`. On that branch, append "
            f"this line to `{path}`: `{content.splitlines()[-1]}`, and commit it with the message `{message}`. "
            f"`main` must stay unchanged.{back}"
        ),
        checks,
        solution,
    )


def find_commit(rng: random.Random, difficulty: int) -> Draft:
    repo = RepoBuilder(rng)
    repo.history(1 + difficulty)
    token = f"{rng.choice(WORDS)}_token={rng.randint(10**7, 10**8)}"
    config = "config/secrets.conf"
    subject = repo.subject("credentials")
    repo.commit(subject, {config: repo.tree.get(config, "") + token + "\n"})
    repo.history(1 + difficulty)
    if difficulty >= 2:  # a later commit removes the line again: only the one that added it counts
        repo.commit(repo.subject("credentials"), {config: repo.tree[config].replace(token + "\n", "")})
        repo.history(1)
    return repo.draft(
        (
            f"Somewhere in the history of the git repository `{REPO}/`, a commit added the line `{token}` to "
            f"`{config}`. Write the full 40-character hash of that commit to `answer.txt`."
        ),
        [{"kind": "git_hash_answer", "repo": REPO, "path": "answer.txt", "subject": subject}],
        [_git("log --format=%H --reverse -S", q(token)) + " | head -n 1 > answer.txt"],
    )


def tag_release(rng: random.Random, difficulty: int) -> Draft:
    repo = RepoBuilder(rng)
    repo.history(3 + difficulty)
    target = repo.subjects[rng.randint(1, len(repo.subjects) - 1)]
    version = f"{rng.randint(0, 5)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}"
    tag, message = f"v{version}", f"Release {version}"
    checks: list[dict] = [
        {"kind": "git_tag", "repo": REPO, "tag": tag, "subject": target, "message": message},
        {"kind": "git_subjects", "repo": REPO, "rev": "main", "equals": list(repo.subjects)},
    ]
    solution = [_git("tag -a", tag, "-m", q(message), f"$({_git('log --format=%H', '--grep', q('^' + target + '$'))})")]
    extra = ""
    if difficulty >= 3:  # also drop a stale lightweight tag
        repo.lines.append(_git("tag", f"v{version}-rc1"))
        extra = f" Then delete the old tag `v{version}-rc1`."
        checks.append({"kind": "git_no_tag", "repo": REPO, "tag": f"v{version}-rc1"})
        solution.append(_git("tag -d", f"v{version}-rc1 > /dev/null"))
    return repo.draft(
        (
            f"In the git repository `{REPO}/`, create an annotated tag `{tag}` with the message `{message}` on "
            f"the commit whose message is `{target}` (not on the latest commit).{extra}"
        ),
        checks,
        solution,
    )


def revert_commit(rng: random.Random, difficulty: int) -> Draft:
    repo = RepoBuilder(rng)
    repo.history(2 + difficulty)
    path = rng.choice(sorted(repo.tree))
    before = repo.tree[path]
    bad = repo.subject("broken " + path.rsplit("/", 1)[-1])
    repo.commit(bad, {path: before + "raise SystemExit('broken')\n"})
    depth = 0
    if difficulty >= 3:  # the bad commit is not the latest one
        other = rng.choice(sorted(set(repo.tree) - {path}))
        repo.commit(repo.subject(other.rsplit("/", 1)[-1]), {other: repo.tree[other] + "# later work\n"})
        depth = 1
    history = list(repo.subjects)
    return repo.draft(
        (
            f"In the git repository `{REPO}/`, the commit `{bad}` broke `{path}`. Undo that commit by adding a "
            f"new commit on top of `main` (do not rewrite or drop existing commits)."
        ),
        [
            {"kind": "git_subjects", "repo": REPO, "rev": "HEAD~1", "equals": history},
            {"kind": "git_file", "repo": REPO, "rev": "HEAD", "path": path, "content": before},
            {"kind": "git_branch", "repo": REPO, "branch": "main"},
        ],
        [_git("revert --no-edit", f"HEAD~{depth}", "> /dev/null")],
    )


def merge_branch(rng: random.Random, difficulty: int) -> Draft:
    repo = RepoBuilder(rng)
    repo.history(2)
    repo.lines.append(_git("checkout -q -b feature"))
    feature_file = f"src/{rng.choice(WORDS)}.py"
    feature_content = f"FEATURE = {rng.randint(1, 999)}\n"
    feature_subjects = []
    for index in range(difficulty):
        subject = repo.subject("feature step")
        feature_subjects.append(subject)
        repo.commit(subject, {feature_file: feature_content * (index + 1)})
    repo.lines.append(_git("checkout -q main"))
    main_subjects = [s for s in repo.subjects if s not in feature_subjects]
    if difficulty >= 2:  # main moved on too, so a fast-forward is impossible
        repo.subjects = main_subjects
        repo.commit(repo.subject("README.md"), {"README.md": repo.tree.get("README.md", "") + "more docs\n"})
        main_subjects = list(repo.subjects)
    return repo.draft(
        (
            f"In the git repository `{REPO}/`, merge the branch `feature` into `main` (a fast-forward or a "
            f"merge commit are both fine) and stay on `main`."
        ),
        [
            {"kind": "git_subjects", "repo": REPO, "rev": "main", "includes": feature_subjects + main_subjects},
            {"kind": "git_file", "repo": REPO, "rev": "main", "path": feature_file,
             "content": feature_content * difficulty},
            {"kind": "git_branch", "repo": REPO, "branch": "main"},
        ],
        [_git("merge -q --no-edit feature")],
    )


VARIANTS = {
    "commit_file": commit_file,
    "feature_branch": feature_branch,
    "find_commit": find_commit,
    "tag_release": tag_release,
    "revert_commit": revert_commit,
    "merge_branch": merge_branch,
}
