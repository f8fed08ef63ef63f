"""Export: the student as an ONNX model with the robot spec in its metadata, run by onnxruntime,
and its policy card and verification record.
"""
