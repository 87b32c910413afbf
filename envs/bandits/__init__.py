"""Multi-armed and contextual bandits: ``MultiArmedBandit-v0`` and ``ContextualBandit-v0``."""
