"""Control: the policy node's logic without ROS: validated inputs, the safety state machine,
command shaping, hot swaps and loop statistics.
"""
