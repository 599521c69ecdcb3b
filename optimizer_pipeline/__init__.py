"""optimizer-pipeline: plant history to verified optimisation recommendations (docs/ARCHITECTURE.md).

Importing the package sets the process's numeric thread budget, before numpy loads its BLAS: one
BLAS / OpenMP thread per process unless the environment names its own (`OPENBLAS_NUM_THREADS=4` ...).
The product's matrices are small (a FIR's normal equations of a few hundred coefficients, QPs of a
few hundred variables), where a second thread costs more than it gains, and its processes run side by
side (Dagster steps, solver workers, the live service), where each process's idle BLAS threads spin
against the others'. Measured on 2 cores (TESTING.md, "How long the suite takes"): the regularised FIR
of tests/test_fir.py's plant in 0.13 s per fit with one thread, 0.22 s with two (idle machine); the test
suite's CPU 19.4 min against 21.8 min. Solver workers get their own budget (`solver.threads`).
A process that imported numpy before this package keeps the threads numpy started with.
"""

import os

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")

for _name in THREAD_VARS:
    os.environ.setdefault(_name, "1")
