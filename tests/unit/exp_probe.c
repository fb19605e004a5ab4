/* The CPU backend's ra__exp (kernels/cpu/cpu.h, static inline) as a function for test_exp.cpp,
   and the formula it had in 0.2.0, which is the reference for every input it defined. */
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

float ratest_exp(float x) { return ra__exp(x); }

/* 0.2.0's ra__exp, verbatim except for the name: defined for every input but NaN (where its
   int32 shift overflows), so only ever called with a number. */
float ratest_exp_0_2_0(float x)
{
    const float xc = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : x);
    const float t = xc * 1.44269504088896341f + 12582912.0f;
    const float n = t - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    union { float f; int32_t i; } tb = {t}, sc;
    sc.i = (tb.i - 0x4B400000 + 127) << 23;
    return x < -87.3f ? 0.0f : y * sc.f;
}
