"""mha_report: turns mha_bench / PyTorch-peer JSON results into a report folder.

Run as `/usr/bin/python3 tools/mha_report RESULTS.json... --out DIR` (see tools/README.md).
"""
