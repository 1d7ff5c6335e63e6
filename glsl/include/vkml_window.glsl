// Window geometry as specialization constants, the same ids in every windowed kernel
// (vkml/ops/fold.py, spec_geometry): W window sizes, S strides, L dilations of
// VKML_WINDOW_DIMS (2, 3 or 6, defined before the include) spatial dimensions.  They are
// constants so that the window loops unroll and their index arithmetic (position ->
// window coordinate, divisions by strides) folds.
#ifndef VKML_WINDOW_GLSL
#define VKML_WINDOW_GLSL

// Spatial dimension d: window size W<d>, stride S<d> and dilation L<d> are constant ids
// 3 + d, 9 + d and 15 + d.
#define VKML_WINDOW_DIM(W, S, L, w, s, l) \
    layout(constant_id = w) const uint W = 1u; \
    layout(constant_id = s) const uint S = 1u; \
    layout(constant_id = l) const uint L = 1u;
VKML_WINDOW_DIM(W0, S0, L0, 3, 9, 15)
VKML_WINDOW_DIM(W1, S1, L1, 4, 10, 16)
#if VKML_WINDOW_DIMS >= 3
VKML_WINDOW_DIM(W2, S2, L2, 5, 11, 17)
#endif
#if VKML_WINDOW_DIMS == 6
VKML_WINDOW_DIM(W3, S3, L3, 6, 12, 18)
VKML_WINDOW_DIM(W4, S4, L4, 7, 13, 19)
VKML_WINDOW_DIM(W5, S5, L5, 8, 14, 20)
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
