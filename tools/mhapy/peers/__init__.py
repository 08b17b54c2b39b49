"""The peers: the attention paths people choose instead of mha on a CPU, measured on the shapes
mha_bench runs, with the same weights and input, each output checked against the float64 oracle
before it is timed, written as Google Benchmark JSON that mhapy.report ranks next to mha's own
backends.

One module per library, each an adapter (adapter.py: its VARIANTS, what each declines and why,
and how it prepares a call): pytorch.py (the seeds' modules, scaled_dot_product_attention,
nn.MultiheadAttention, torch.compile), openvino.py (the block in its opset, a stateful KV cache
fused into its SDPA), onnxruntime.py (com.microsoft Attention, GroupQueryAttention and MultiHeadAttention),
and mha_python.py (mha itself through its Python package: what the Python layer costs next to
mha_bench's C++ figure). run.py
checks and times them (`python -m mhapy.peers`); their environment is scripts/peers-env.sh's.
A new peer is one module here, its name in run.LIBRARIES and its line in
tools/peers-requirements.txt.
"""
