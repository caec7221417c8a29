"""Accuracy of the GPU's float32 Φ (gaussian_cdf and gaussian_cdf_for_16_bit_results in
ops/activations/math.h) against float64, and the fit of the 16-bit polynomial.

Emulates the device formula in float32 numpy (exact exp2 and reciprocal: the GPU's ex2/rcp.approx
add about 2^-22 relative) over [-20, 20] and 2e6 normal samples; prints the worst errors of
gelu(x) = x Φ(x) and gelu'(x) = Φ(x) + x φ(x), and how many exceed float32's test tolerance
(tests/conftest.py: 2e-6). For the 16-bit form: how many gelu results, rounded to bfloat16 and
float16, differ from the correctly rounded value. `--fit` refits the 16-bit polynomial
(erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + p z); minimax relative error by Lawson's iteration;
needs scipy) for degrees 5-7 and prints the coefficients in the device's log2 units.
    python scripts/tools/erfc_accuracy.py [--fit]
"""
import sys
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


# gaussian_cdf_for_16_bit_results: degree 6, p = 0.425 (t_slope = p / sqrt(2)), from --fit.
COEFFICIENTS_16_BIT = [f(c) for c in (-3.06021452, 1.44212461, 0.605197251, 0.107930101, 0.396736562,
                                      -0.776008487, 0.28424269)]
T_SLOPE_16_BIT = f(0.30052039)


def gaussian_cdf_from_erfc(x, t_slope, coefficients):
    t = (f(1) / fma(np.abs(x), t_slope, f(1))).astype(np.float32)
    p = coefficients[-1]
    for c in coefficients[-2::-1]:
        p = fma(p, t, c)
    half_erfc = (t * np.exp2(fma((x * x).astype(np.float32), -HALF_LOG2E, p))).astype(np.float32)
    return np.where(x >= 0, f(1) - half_erfc, half_erfc)


def gaussian_cdf_device(x):
    return gaussian_cdf_from_erfc(x, f(0.35355339059327373), [CONSTANT] + COEFFICIENTS)


def gelu_device(x):
    return (x * gaussian_cdf_device(x)).astype(np.float32)


def gelu_device_16_bit(x):
    return (x * gaussian_cdf_from_erfc(x, T_SLOPE_16_BIT, COEFFICIENTS_16_BIT)).astype(np.float32)


def to_bfloat16(values):
    bits = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16  # round to nearest even
    return bits.astype(np.uint32).view(np.float32)


def rounding_report(name, value, reference):
    for dtype, round_to in (("bfloat16", to_bfloat16), ("float16", lambda v: np.asarray(v).astype(np.float16))):
        differ = round_to(value) != round_to(reference)
        print(f"{name} rounded to {dtype}: {100 * differ.mean():.4f}% of results differ from the correctly rounded value")


def fit(p, degree, iterations=100):
    from scipy.special import erfcx
    t = np.linspace(1e-6, 1.0, 200001)
    z = (1.0 / t - 1.0) / p
    target = np.log(erfcx(z) / t)  # P(t) in natural-log units
    powers = np.vander(t, degree + 1, increasing=True)
    weights = np.ones_like(t)
    for _ in range(iterations):
        root = np.sqrt(weights)
        coefficients, *_ = np.linalg.lstsq(powers * root[:, None], target * root, rcond=None)
        error = np.abs(powers @ coefficients - target)
        weights = weights * error / (weights * error).sum()
    return error.max(), coefficients


def print_fits():
    for degree, p in ((5, 0.545), (6, 0.425), (7, 0.35)):  # p: the best of a scan in steps of 0.005
        error, coefficients = fit(p, degree)
        device = [c * LOG2E for c in coefficients]
        device[0] -= 1  # the 0.5 of Φ = 0.5 erfc
        print(f"degree {degree}, p = {p}: max relative error of erfc {error:.2e}; t_slope {p / sqrt(2):.8g}; "
              f"device coefficients {', '.join(f'{c:.9g}' for c in np.float32(device))}")


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
    report("gelu, 16-bit form", gelu_device_16_bit(xs), reference)
    rounding_report("gelu", gelu_device(xs), reference)
    rounding_report("gelu, 16-bit form", gelu_device_16_bit(xs), reference)
    if "--fit" in sys.argv:
        print_fits()

if __name__ == "__main__":
    main()
