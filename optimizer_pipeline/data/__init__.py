"""Plant history: ingest and validation (ingest.py), cleaning onto the sample grid (clean.py) and its
glitch flags (flags.py), the run split (split.py), and the history made ready for identification
(prepare.py). The package imports nothing itself: the solver worker imports flags.py's constants
without pandas or the model code.
"""
