"""The regularised FIR's standard errors against the truth over many noise draws (model/fir.py, issue 55):
the coverage the suite's smaller draws in tests/test_fir.py only guard.

On tests/test_fir.py's two-input plant (K 2, tau 5, dead time 2; K -1, tau 8), 3 runs of 200 samples of
random +-1 steps held 20 samples, 50 taps, no time budget: the fraction of the true gains within 1 and 2
reported standard errors, under white noise (std 0.1) and under AR(1) noise of pole 0.8, with and
without the autocorrelation correction (`se` / `se_white`). Nominal: 0.68 / 0.95.

Usage: .venv/bin/python bench/fir_calibration.py [--white-draws 150] [--ar-draws 80]
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_fir import coverage  # noqa: E402  (the suite's plant and draws, one definition)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--white-draws", type=int, default=150)
    parser.add_argument("--ar-draws", type=int, default=80)
    args = parser.parse_args()
    print("| noise | draws | se | within 1 se | within 2 se | seconds |")
    print("|---|---|---|---|---|---|")
    for label, pole, draws in (("white, std 0.1", 0.0, args.white_draws), ("AR(1) pole 0.8, std 0.1", 0.8,
                                                                          args.ar_draws)):
        started = time.perf_counter()
        corrected, white = coverage(noise=0.1, pole=pole, draws=draws)
        seconds = time.perf_counter() - started
        for name, z in (("se (corrected)", corrected), ("se_white", white)):
            print(f"| {label} | {draws} | {name} | {np.mean(z <= 1):.3f} | {np.mean(z <= 2):.3f} | {seconds:.0f} |",
                  flush=True)


if __name__ == "__main__":
    main()
