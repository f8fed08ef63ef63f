"""Evaluation: episodes of a policy in the env, on the plane or terrain tiles; the end of a run
(export, evaluation, selection among snapshots); gait pictures.
"""
