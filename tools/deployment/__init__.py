"""The deployment scripts' ONNX export: :mod:`deployment.deploy`."""
