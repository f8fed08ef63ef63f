"""Live training over ROS 2: actors, rollout chunks, their gate, and the learners they feed."""
