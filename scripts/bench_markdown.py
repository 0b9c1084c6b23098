"""benchlib.splice under its old name, for the bench scripts that still
import it from here (bench_keras.py, bench_onnx.py); new code imports
benchlib."""
from benchlib import splice  # noqa: F401
