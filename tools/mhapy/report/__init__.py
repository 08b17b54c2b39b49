"""mhapy.report: turns mha_bench / peer JSON results into a report folder.

Run as `PYTHONPATH=tools /usr/bin/python3 -m mhapy.report RESULTS.json... --out DIR` (see
tools/README.md).
"""
