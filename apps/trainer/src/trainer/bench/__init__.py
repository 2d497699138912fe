"""`trainer bench`: one training configuration's phases timed against this machine's ceilings.

measure (the timed run and its report), flops (model FLOPs and the matmul peak), presets
(named shapes), baseline (saved results and the comparison), critic (PPO's critic as a phase).
"""
