"""rl_llm.envs.social"""
