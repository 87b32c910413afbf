"""rl_llm.trainers.adapters"""
