"""Solver package: QP templates (mpc, steady), the independent verifier (verify), solve_problem (solve),
and what runs it in separate processes: the worker, one worker process seen from the parent (process),
the capability probe (probe), the pool (pool) and the keep-alive registry of pools (shared).

Importing this package imports nothing heavy: the worker imports `optimizer_pipeline.solver.solve`.
"""
