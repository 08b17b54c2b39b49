"""Whole models: the bench of models on each attention implementation (bench, with its OpenVINO
side, openvino; hf: the models and their attention implementations; step_profile,
between_ops, busy_threads, timed_attention: what a decode step's time holds), and the
real-model harnesses (accuracy and passkey: a cache's KL divergence and retrieval on Gemma 3;
gemma3: its loader; simulated_caches: formats rounded in PyTorch; speculative: prompt lookup
and assisted decoding), each run with `python -m mhapy.models.<name>`."""
