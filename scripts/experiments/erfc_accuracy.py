"""Accuracy of the GPU's float32 Φ (gaussian_cdf in ops/common/activations.h) against float64.

Emulates the device formula in float32 numpy (exact exp2 and reciprocal: the GPU's ex2/rcp.approx
add about 2^-22 relative) over [-20, 20] and 2e6 normal samples; prints the worst errors of
gelu(x) = x Φ(x) and gelu'(x) = Φ(x) + x φ(x), and how many exceed float32's test tolerance
(tests/conftest.py: 2e-6).
    python scripts/experiments/erfc_accuracy.py
"""
from math import erf, erfc, sqrt

import numpy as np

f = np.float32
LOG2E = 1.4426950408889634
# Numerical Recipes' erfcc coefficients (constant term first) in log2 units, 0.5 folded into the
# constant term, rounded to float32 as the device source writes them.
COEFFICIENTS = [f(round(c * LOG2E, 9)) for c in (1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
                                                 -1.13520398, 1.48851587, -0.82215223, 0.17087277)]
CONSTANT = f(round(-1.26551223 * LOG2E - 1, 9))
HALF_LOG2E = f(LOG2E / 2)
LOG2_BETA = f(-1.3257480647361593)  # log2(1 / sqrt(2 pi))


def fma(a, b, c):
    return (a.astype(np.float64) * b + c).astype(np.float32)


def gaussian_cdf_device(x):
    t = (f(1) / fma(np.abs(x), f(0.35355339059327373), f(1))).astype(np.float32)
    p = COEFFICIENTS[8]
    for c in COEFFICIENTS[7::-1]:
        p = fma(p, t, c)
    p = fma(p, t, CONSTANT)
    half_erfc = (t * np.exp2(fma((x * x).astype(np.float32), -HALF_LOG2E, p))).astype(np.float32)
    return np.where(x >= 0, f(1) - half_erfc, half_erfc)


def gelu_device(x):
    return (x * gaussian_cdf_device(x)).astype(np.float32)


def gelu_derivative_device(x):
    pdf = np.exp2(fma((x * x).astype(np.float32), -HALF_LOG2E, LOG2_BETA)).astype(np.float32)
    return fma(x, pdf, gaussian_cdf_device(x))


def report(name, value, reference):
    error = np.abs(value.astype(np.float64) - reference)
    large = np.abs(reference) > 1e-3
    print(f"{name}: max absolute error {error.max():.3g}; max relative error where |reference| > 1e-3 "
          f"{(error[large] / np.abs(reference[large])).max():.3g}; "
          f"over float32 tolerance (2e-6 rel + 2e-6 abs): {(error > 2e-6 * np.abs(reference) + 2e-6).sum()}")


def main():
    rng = np.random.default_rng(0)
    xs = np.concatenate([np.linspace(-20, 20, 2_000_001), rng.normal(0, 3, 2_000_000)]).astype(np.float32)
    reference = np.array([v * 0.5 * erfc(-v / sqrt(2)) if v < 0 else v * 0.5 * (1 + erf(v / sqrt(2)))
                          for v in xs.astype(np.float64)])
    report("gelu", gelu_device(xs), reference)
    xs64 = xs.astype(np.float64)
    cdf = np.array([0.5 * erfc(-v / sqrt(2)) for v in xs64])
    report("gelu'", gelu_derivative_device(xs), cdf + xs64 * np.exp(-0.5 * xs64 * xs64) / sqrt(2 * np.pi))

if __name__ == "__main__":
    main()
