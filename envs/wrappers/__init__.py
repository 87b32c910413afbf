"""rl_llm.envs.wrappers"""
