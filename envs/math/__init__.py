"""Math-v0: reasoning-gym problems graded with math-verify (both imported only when a problem is made)."""
