"""Analysis: pure functions from traces and step records to the numbers the report and gate use.

``timeline`` parses traces into interval DataFrames; ``overlap`` and ``bandwidth`` compute over
those DataFrames only, so they can be tested on hand-built frames with known answers.
"""
