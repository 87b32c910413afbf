"""rl_llm.envs.knowledge: a procedural closed-world knowledge base with questions of known difficulty."""

from rl_llm.envs.knowledge.bundled import Bundle, bundled_kb
from rl_llm.envs.knowledge.generator import Entity, KnowledgeBase, generate_kb
from rl_llm.envs.knowledge.questions import (
    TOOL_TASK_KINDS,
    OracleCall,
    ToolTask,
    search_questions,
    tool_tasks,
)

__all__ = [
    "TOOL_TASK_KINDS",
    "Bundle",
    "Entity",
    "KnowledgeBase",
    "OracleCall",
    "ToolTask",
    "bundled_kb",
    "generate_kb",
    "search_questions",
    "tool_tasks",
]
