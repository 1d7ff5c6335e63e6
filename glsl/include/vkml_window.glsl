// Window geometry as specialization constants, the same ids in every windowed kernel
// (vkml/ops/fold.py, spec_geometry): W window sizes, S strides, L dilations of
// VKML_WINDOW_DIMS (2, 3 or 6, defined before the include) spatial dimensions.  They are
// constants so that the window loops unroll and their index arithmetic (position ->
// window coordinate, divisions by strides) folds.
#ifndef VKML_WINDOW_GLSL
#define VKML_WINDOW_GLSL

layout(constant_id = 3) const uint W0 = 1u;
layout(constant_id = 4) const uint W1 = 1u;
layout(constant_id = 9) const uint S0 = 1u;
layout(constant_id = 10) const uint S1 = 1u;
layout(constant_id = 15) const uint L0 = 1u;
layout(constant_id = 16) const uint L1 = 1u;
#if VKML_WINDOW_DIMS >= 3
layout(constant_id = 5) const uint W2 = 1u;
layout(constant_id = 11) const uint S2 = 1u;
layout(constant_id = 17) const uint L2 = 1u;
#endif
#if VKML_WINDOW_DIMS == 6
layout(constant_id = 6) const uint W3 = 1u;
layout(constant_id = 7) const uint W4 = 1u;
layout(constant_id = 8) const uint W5 = 1u;
layout(constant_id = 12) const uint S3 = 1u;
layout(constant_id = 13) const uint S4 = 1u;
layout(constant_id = 14) const uint S5 = 1u;
layout(constant_id = 18) const uint L3 = 1u;
layout(constant_id = 19) const uint L4 = 1u;
layout(constant_id = 20) const uint L5 = 1u;
uint win(int d) { return d == 0 ? W0 : d == 1 ? W1 : d == 2 ? W2 : d == 3 ? W3 : d == 4 ? W4 : W5; }
uint stride(int d) { return d == 0 ? S0 : d == 1 ? S1 : d == 2 ? S2 : d == 3 ? S3 : d == 4 ? S4 : S5; }
uint dil(int d) { return d == 0 ? L0 : d == 1 ? L1 : d == 2 ? L2 : d == 3 ? L3 : d == 4 ? L4 : L5; }
#elif VKML_WINDOW_DIMS == 3
uint win(int d) { return d == 0 ? W0 : d == 1 ? W1 : W2; }
uint stride(int d) { return d == 0 ? S0 : d == 1 ? S1 : S2; }
uint dil(int d) { return d == 0 ? L0 : d == 1 ? L1 : L2; }
#endif

// Elements sh..sh+3 of the 8 in (a, b): the four an unaligned 4-element read wants from
// two aligned texels (T: vec4 or uvec4).
#define VKML_SHIFT4(T) \
T shift4(T a, T b, uint sh) { \
    T h = (sh & 2u) != 0u ? T(a.zw, b.xy) : a; \
    T g = (sh & 2u) != 0u ? T(b.zw, b.zw) : b; \
    return (sh & 1u) != 0u ? T(h.yzw, g.x) : h; \
}

#endif
