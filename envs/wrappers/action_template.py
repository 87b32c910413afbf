"""ActionTemplate: wrap each generated turn in a fixed text before the env parses it."""

from __future__ import annotations

import gymnasium as gym


class ActionTemplate(gym.ActionWrapper):
    """Wrap each generated turn in a fixed text before the env parses it, e.g. ``<action>{}</action>``.

    The generator then only writes what goes inside. The default training job uses it: a randomly initialised
    model could never produce the tags by chance (see ``trainers/default_job.py``).

    Args:
        env: the text environment to wrap.
        template: the text with one ``{}`` where the generated turn goes; only the first ``{}`` is replaced.
    """

    def __init__(self, env: gym.Env, template: str) -> None:
        super().__init__(env)
        self.template = template

    def action(self, action: str) -> str:
        return self.template.replace("{}", action, 1)
