"""mhapy.report: turns mha_bench / peer JSON results into a report folder.

Run as `PYTHONPATH=tools /usr/bin/python3 -m mhapy.report RESULTS.json... --out DIR` (see
tools/README.md).

The tables are built with dicts over ResultSet's typed keys, not on pandas. The ranking of the
peers (peer_ranking._rank), written on one long DataFrame with groupby/pivot, gave the same
numbers on reports/xeon-2core-windows-2026-11-28's inputs in about 20 fewer lines, but each
section still needs the Measurement behind a number (its label, backend, repetitions) and the
Shape's own order and wording, which a frame carries as objects; the report would save little and
the main job would need pandas on a fresh Debian (python3-pandas and its dependencies) where it
needs only matplotlib now.
"""
