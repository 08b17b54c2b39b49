"""mhapy: mha's Python side, one package. Run its commands from the repository with
`PYTHONPATH=tools /usr/bin/python3 -m mhapy.<module> ...` (or from tools/ with `-m` alone):

  report      result files (mha_bench, the PyTorch peers) -> report.md, report.html, figures
  peers       the shapes mha_bench runs, timed in PyTorch (needs python3-torch)
  golden      writes the PyTorch goldens in tests/golden (needs python3-torch)
  peak_rss    peak memory of one forward pass per backend, through `mha run` (standard library)
  models      whole models on each attention implementation, and the real-model harnesses
              (models.bench, models.accuracy, models.speculative, ...; need torch, transformers)

Importing the package imports nothing: only the modules that say so need torch, numpy or
matplotlib (tools/README.md).
"""
