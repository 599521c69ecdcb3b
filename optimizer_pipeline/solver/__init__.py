"""Solver package: QP templates (mpc, steady), the independent verifier (verify), solve_problem (solve),
and the worker / probe / pool that run it in separate processes.

Importing this package imports nothing heavy: the worker imports `optimizer_pipeline.solver.solve`.
"""
