"""ActionTemplate: wrap each generated turn in a fixed text before the env parses it."""

from __future__ import annotations

import gymnasium as gym


class ActionTemplate(gym.ActionWrapper, gym.utils.RecordConstructorArgs):
    """Wrap each generated turn in a fixed text before the env parses it, e.g. ``<action>{}</action>``.

    The generator then only writes what goes inside. The default training job uses it: a randomly initialised
    model could never produce the tags by chance (see ``trainers/default_job.py``).

    Args:
        env: the text environment to wrap.
        template: the text with one ``{}`` where the generated turn goes; only the first ``{}`` is replaced.

    Its arguments are recorded (``gymnasium.utils.RecordConstructorArgs``), so ``gym.make(env.spec)`` rebuilds it.
    """

    def __init__(self, env: gym.Env, template: str) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, template=template)
        gym.ActionWrapper.__init__(self, env)
        self.template = template

    def action(self, action: str) -> str:
        return self.template.replace("{}", action, 1)
