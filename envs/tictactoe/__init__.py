"""Tic-tac-toe: the rules (shared with the two-player ``tictactoe_v0``) and ``TicTacToe-v0``."""
