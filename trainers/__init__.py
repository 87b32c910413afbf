"""rl_llm.trainers"""
