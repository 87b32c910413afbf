"""rl_llm.sandboxes"""
