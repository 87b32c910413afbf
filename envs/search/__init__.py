"""Search-R1-style question answering: ``Search-v0`` and its protocols (Search-R1, R1-Searcher, ReSearch)."""
