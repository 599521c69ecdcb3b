"""Judge identification and plans on the random plant zoo (bench/zoo.py), beside references fitted to
the same history in the same run (bench/references.py), issue 55.

Per plant (seed s) and its history (seed HISTORY_OFFSET + s):

* the product's path as bench/judge.py runs it: prepare_history, identify, calibrate, recommend, the
  plan applied open-loop to the true plant from the live state (a plant with a level holds the plan's
  last move as long again before its error is measured); its status and err/hold;
* steady gains, engineering units, MVs then DVs, an integrating CV's as its rate per sample: the
  product's step-response view (`artifact.step_response`, each gain with its own se `gain_se`), the regularised FIR,
  the MISO output-error fit and the oracle (output error of the true structure), each fitted to the
  history's runs (the live one included, as the references cannot tell it apart);
* per method e = ||G_hat - G||_F / ||G||_F over the MV gains, and e_move = |(G_hat - G) du| / |G du|
  along the plan's move du (its final MVs less the live ones; none without a plan);
* r = (e_product + EPS) / (e_best + EPS), e_best the smaller of the FIR's and the output error's;
* coverage: per channel (CV, input) whether |G_hat - G| <= 1 se and <= 2 se;
* the product's median se over the oracle's.

Printed: a row per plant, then the summary against the issue's targets. Seed sets: `--seeds` fixed ones
(e.g. before a change), `--fresh N` N seeds derived from the commit the tree is at (drawn after it).

Usage: .venv/bin/python bench/judge_zoo.py [--seeds 0 1 2 ... | --fresh N] [--markdown FILE]
"""

import argparse
import hashlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from judge import run_product  # noqa: E402
from references import miso_output_error, oracle, regularised_fir, runs_of  # noqa: E402
from zoo import ZooPlant, draw  # noqa: E402

from optimizer_pipeline.ledger import Ledger  # noqa: E402
from optimizer_pipeline.solver.solve import SolverCache  # noqa: E402

HISTORY_OFFSET = 1000  # a plant's history seed is this plus its own seed
EPS = 0.005  # r's floor: gains within 0.5 % are equally good
METHODS = ("product", "fir", "oe", "oracle")
TARGETS = ("median r <= 1.0, p90 <= 1.5, max <= 3; within 2 se 90-98 %, within 1 se 60-76 %; "
           "median se <= 1.5 x the oracle's")


@dataclass
class Judged:
    """One plant's figures (module docstring)."""

    seed: int
    shape: str
    status: str = "failed"
    ratio: float = float("nan")  # err / hold of the plan
    e: dict[str, float] = field(default_factory=dict)  # method -> relative MV gain error
    e_move: dict[str, float] = field(default_factory=dict)
    within: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # method -> (<= 1 se, <= 2 se)
    se_over_oracle: float = float("nan")
    seconds: dict[str, float] = field(default_factory=dict)
    reason: str = ""

    @property
    def r(self) -> float:
        best = min(self.e.get("fir", np.inf), self.e.get("oe", np.inf))
        return (self.e["product"] + EPS) / (best + EPS) if "product" in self.e and np.isfinite(best) else float("nan")


def product_gains(artifact) -> tuple[np.ndarray, np.ndarray]:
    """The product's gains (ny, n_inputs) and their se (the estimate's own, `gain_se`: the zoo's plants are
    linear, so the gain's spread over the operating range, `gain_spread`, is not an error of the estimate;
    inf where the artifact records none) from its step-response view."""
    record = artifact.step_response
    ny, m = len(record["cv_tags"]), len(record["input_tags"])
    gains, se = np.zeros((ny, m)), np.full((ny, m), np.inf)
    for k, pair in enumerate(record["pairs"]):
        i, j = divmod(k, m)
        gains[i, j] = pair["gain"]
        if pair["gain_se"] is not None:
            se[i, j] = pair["gain_se"]
    return gains, se


def judge_plant(plant: ZooPlant, ledger: Ledger, cache: SolverCache) -> Judged:
    truth = plant.truth
    nu = plant.nu
    judged = Judged(plant.seed, f"{plant.ny}x{nu}" + (f"+{plant.nd}dv" if plant.nd else ""))
    estimates: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    started = time.perf_counter()
    try:
        product, history, _, artifact = run_product(plant, HISTORY_OFFSET + plant.seed, ledger, cache,
                                                    hold_after=any(truth.integrating))
        judged.status, judged.ratio = product["status"], product.get("ratio", float("nan"))
        judged.reason = "" if product["status"] == "verified" or not product["reasons"] else product["reasons"][0]
        estimates["product"] = product_gains(artifact)
        move = np.asarray(product.get("move", np.zeros(nu)))
    except Exception as error:  # the product failing on a plant is an outcome the judge reports
        judged.reason = f"{type(error).__name__}: {error}"
        history, move = plant.history(HISTORY_OFFSET + plant.seed), np.zeros(nu)
    judged.seconds["product"] = time.perf_counter() - started
    runs = runs_of(history.frame, [*plant.spec.mv_tags, *plant.spec.dv_tags], list(plant.spec.cv_tags))
    fir = regularised_fir(runs, truth.integrating)
    oe = miso_output_error(runs, truth.integrating, fir=fir)
    exact = oracle(runs, truth.channels)
    for name, estimate in (("fir", fir), ("oe", oe), ("oracle", exact)):
        estimates[name] = (estimate.gains, estimate.se)
        judged.seconds[name] = estimate.seconds
    G = truth.gains
    for name, (gains, se) in estimates.items():
        error = gains - G
        judged.e[name] = float(np.linalg.norm(error[:, :nu]) / np.linalg.norm(G[:, :nu]))
        if np.linalg.norm(G[:, :nu] @ move) > 0:
            judged.e_move[name] = float(np.linalg.norm(error[:, :nu] @ move) / np.linalg.norm(G[:, :nu] @ move))
        judged.within[name] = (np.abs(error) <= se).ravel(), (np.abs(error) <= 2 * se).ravel()
    finite = np.isfinite(estimates.get("product", (None, np.full(1, np.inf)))[1])
    if finite.any():
        judged.se_over_oracle = float(np.median(estimates["product"][1][finite]) / np.median(exact.se[finite]))
    return judged


def fresh_seeds(count: int) -> list[int]:
    """`count` seeds derived from the commit the tree is at: a set nobody chose."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    start = int(hashlib.sha256(commit.encode()).hexdigest(), 16) % 1_000_000
    return list(range(start, start + count))


def row(j: Judged) -> str:
    def cell(name: str) -> str:
        if name not in j.e:
            return "-"
        one, two = j.within[name]
        return f"{j.e[name]:.3f} ({np.mean(one):.2f}/{np.mean(two):.2f})"

    return (f"| {j.seed} | {j.shape} | {j.status} | {j.ratio:.3f} | {j.r:.2f} | "
            + " | ".join(cell(name) for name in METHODS) + f" | {j.se_over_oracle:.2f} | {j.reason[:80]} |")


def summary(judged: list[Judged]) -> list[str]:
    rs = np.array([j.r for j in judged if np.isfinite(j.r)])
    lines = [f"plants: {len(judged)}; r (product vs the better reference): median {np.median(rs):.2f}, "
             f"p90 {np.percentile(rs, 90):.2f}, max {np.max(rs):.2f}" if len(rs) else "no r"]
    for name in METHODS:
        pairs = [j.within[name] for j in judged if name in j.within]
        if pairs:
            one = np.concatenate([p[0] for p in pairs])
            two = np.concatenate([p[1] for p in pairs])
            es = [j.e[name] for j in judged if name in j.e]
            moves = [j.e_move[name] for j in judged if name in j.e_move]
            lines.append(f"{name}: e median {np.median(es):.3f} max {np.max(es):.3f}; along the move median "
                         f"{np.median(moves) if moves else float('nan'):.3f}; within 1 se {np.mean(one):.2f}, "
                         f"within 2 se {np.mean(two):.2f} of {one.size} channels")
    ratios = [j.se_over_oracle for j in judged if np.isfinite(j.se_over_oracle)]
    if ratios:
        lines.append(f"product se / oracle se: median {np.median(ratios):.2f}")
    statuses = [j.status for j in judged]
    lines.append(f"plans: {statuses.count('verified')} verified ({sum(j.status == 'verified' and j.ratio > 0.10 for j in judged)} "
                 f"of them beyond 0.10 of holding's error), within 0.10: {sum(j.ratio <= 0.10 for j in judged)}, "
                 f"beyond 0.25: {sum(j.ratio > 0.25 for j in judged)}, no plan / failed: "
                 f"{sum(not np.isfinite(j.ratio) for j in judged)}")
    lines.append(f"targets: {TARGETS}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    group.add_argument("--fresh", type=int, metavar="N", help="N seeds derived from the commit (drawn after a change)")
    parser.add_argument("--markdown", type=Path, help="also write the table and summary here")
    args = parser.parse_args()
    seeds = fresh_seeds(args.fresh) if args.fresh else args.seeds
    print(f"seeds: {seeds[0]}..{seeds[-1]} ({len(seeds)})" if args.fresh else f"seeds: {seeds}", flush=True)
    head = ("| seed | shape | status | err/hold | r | " + " | ".join(f"{m} e (1se/2se)" for m in METHODS)
            + " | se / oracle | first reason |")
    lines = [head, "|" + "---|" * (len(METHODS) + 7)]
    print("\n".join(lines), flush=True)
    judged = []
    with tempfile.TemporaryDirectory() as folder:
        ledger, cache = Ledger(Path(folder) / "judge.duckdb"), SolverCache()
        for seed in seeds:
            judged.append(judge_plant(draw(seed), ledger, cache))
            lines.append(row(judged[-1]))
            print(lines[-1], flush=True)
    lines += ["", *summary(judged)]
    print("\n".join(lines[-len(summary(judged)):]))
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
