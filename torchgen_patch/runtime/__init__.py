"""Runtime: build the generated kernels against the running torch, install them
into its dispatcher (C++ or Python backend), and read its live registry."""
