"""The policy node and the helpers its wiring needs: the safety state machine's and the hot swap's
ROS side.
"""
