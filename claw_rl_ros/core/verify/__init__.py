"""Verification: the sim2sim gate's scoring, the episode record it reads and the status board it
waits on.
"""
