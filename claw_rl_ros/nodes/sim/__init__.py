"""The sim node and the helpers its wiring needs: state publishing, lockstep episodes and the
control loop as an actor.
"""
