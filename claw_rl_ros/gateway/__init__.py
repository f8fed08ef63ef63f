"""OpenAI-compatible LLM gateway check with one unified key (no ROS, no vendor hard-coded)."""
