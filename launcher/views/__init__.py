"""Views: plans and runs for people. The plan as text, rich tables and JSON; a run folder as a chart; smoke checks as
text and JUnit XML. They render; they decide nothing.
"""
